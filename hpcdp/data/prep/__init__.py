"""Preparation: raw inputs to sharded, chunked HDF5 under mpirun/srun. `frame` is what
every recipe shares, `cli` the samples recipes (`hpcdp prep`), `arrays` their sources;
one subpackage per kind of input: `images/`, `text/`, `clicks/`."""
