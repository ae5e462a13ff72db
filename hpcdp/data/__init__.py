"""Sharded HDF5 data, by role: `format/` says what a prepared file holds (samples, tokens,
clicks: names, dtypes, chunking, the checks a reader relies on); `prep/` writes such
files from users' inputs under mpirun/srun (one frame, one subpackage per kind of input);
`read/` reads them back in a world-size-independent order (`read.order`, pure), with
readers, prefetch and augmentation; `staging/` copies them to node-local disks.

Nothing is imported here, so `hpcdp prep` and `hpcdp.data.read.order` load without
PyTorch; import `hpcdp.data.read.samples` for `ShardedReader` and
`hpcdp.data.read.tokens` for `TokenReader`.
"""
