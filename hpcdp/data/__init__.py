"""Sharded HDF5 data. The shared core: preparation (`prep`, `sources`; `prep_run` for what
every recipe shares), the epoch layout (`partition`), the readers of fixed-shape samples
(`reader`, `assemble`, `epochs` for what the shuffled readers share; `fields` for several
row-aligned datasets; `slices` for evaluation) and `prefetch`. By what they serve:
`tokens/` (token streams for language models), `clicks/` (click logs), `staging/`
(node-local copies of the data).

Nothing is imported here, so `hpcdp prep` and `hpcdp.data.partition` load
without PyTorch; import `hpcdp.data.reader` for `ShardedReader` and
`hpcdp.data.tokens.reader` for `TokenReader`.
"""
