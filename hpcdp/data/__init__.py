"""Sharded HDF5 data: preparation (`prep`, `sources`; `prep_run` for what every recipe
shares), the epoch layout (`partition`), and the readers (`reader`, `assemble`,
`epochs` for what the shuffled readers share; `slices` for evaluation); token streams for
language models: the format (`tokens`), their preparation (`token_writer`, `text_prep`,
`tokenizer`, `markov`, `markov_prep`) and the window reader (`token_reader`); node-local
copies of the data (`staging`, pure, and `stage_copy`).

Nothing is imported here, so `hpcdp prep` and `hpcdp.data.partition` load
without PyTorch; import `hpcdp.data.reader` for `ShardedReader` and
`hpcdp.data.token_reader` for `TokenReader`.
"""
