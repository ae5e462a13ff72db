"""Token data for language models: the token-stream HDF5 layout, its reader and its
collective writer, tokenizers, and the recipes (text files, the Markov corpus)."""
