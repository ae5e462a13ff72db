"""Sharded HDF5 data: preparation (`prep`, `sources`), the epoch layout (`partition`),
and the readers (`reader`, `assemble`; `slices` for evaluation).

Nothing is imported here, so `hpcdp prep` and `hpcdp.data.partition` load
without PyTorch; import `hpcdp.data.reader` for `ShardedReader`.
"""
