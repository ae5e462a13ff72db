"""Image folders to samples-first HDF5: scan the layout, decode with Pillow, write over ranks.

`folder` finds the classes and files (pure, no decoding), `decode` turns one
file into a (3, S, S) uint8 array by a stated rule (also for prediction), and
`write` spreads the decoding over the ranks and writes one file per split.
"""
