"""Data-parallel training for every task: set-up, step, loop, checkpoints, hooks.

- `setup`: readers, model, optimizers, schedule from the config (local, no collectives);
- `step`: forward, loss, backward, the update and the NaN policy;
- `loop`: one run from init to summary; every collective is a named line there;
- `checkpoints`: the checkpoint manager (when, what, keep-k, the resume protocol);
- `evaluate`: metric reduction over ranks and validation over every sample once;
- `hooks`: faults, stop_at_step, sample traces and the watchdog, outside the loop body;
- `command`: the `hpcdp train` command line.

What is trained (data, model, loss, metrics) comes from a task (hpcdp.tasks).
"""

from hpcdp.train.command import main

__all__ = ["main"]
