"""Image folders and CIFAR archives to samples-first HDF5: `folder` finds the classes
and files (pure), `decode` turns one file into a (C, S, S) uint8 array by a stated rule
(also for prediction), `write` spreads decoding over the ranks, `recipe` is the command."""
