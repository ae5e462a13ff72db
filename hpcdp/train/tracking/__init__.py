"""Experiment trackers (MLflow, Weights & Biases) fed by rank 0's Reporter (docs/tracking.md).

- `records`: what a tracker is given (pure): the config as flat parameters, the numeric
  values of a metrics record, and the buffer that holds records back until a checkpoint
  covers their step;
- `state`: the run folder's record of each tracker's run id and the last step it was sent;
- `process`, `child`: each tracker in a process of its own, at the lowest priority, so
  that its library takes neither the GIL nor rank 0's core; `worker`: the thread inside
  it, whose bounded queue means a slow, failing or hanging tracker never holds training
  up;
- `mlflow_run`, `wandb_run`: one module per tracker; `hub`: the Reporter's one handle.
"""
