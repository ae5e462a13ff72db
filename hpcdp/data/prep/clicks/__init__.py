"""Click logs: the synthetic log (`synth`) and its recipe (`recipe`), and Criteo
logs (`criteo` parsing, `criteo_recipe`, `criteo_synth`)."""
