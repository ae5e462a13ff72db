"""Text to token streams: documents (JSON Lines, Parquet, text), tokenizers, the
collective writer, and the recipes (`recipe` for text files, `markov_recipe`)."""
