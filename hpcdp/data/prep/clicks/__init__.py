"""Click logs: the synthetic log (`synth`) and its recipe (`recipe`), and Criteo
logs (`criteo` parsing and rules, `criteo_blocks` reading a block, `criteo_vocab`
the vocabulary on owner ranks, `criteo_recipe`); look-alike Criteo logs for scale
trials are written by `hpcdp.data.synth.criteo_logs`."""
