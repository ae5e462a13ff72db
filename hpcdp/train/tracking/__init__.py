"""Experiment trackers (MLflow, Weights & Biases) fed by rank 0's Reporter (docs/tracking.md).

- `records`: what a tracker is given (pure): the config as flat parameters, the numeric
  values of a metrics record, and the buffer that holds records back until a checkpoint
  covers their step;
- `state`: the run folder's record of each tracker's run id and the last step it was sent;
- `worker`: one background thread per tracker, so that a slow, failing or hanging tracker
  never holds training up;
- `mlflow_run`, `wandb_run`: one module per tracker; `hub`: the Reporter's one handle.
"""
