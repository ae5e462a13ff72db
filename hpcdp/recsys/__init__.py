"""The recommendation workload's parts: a DLRM-style model, its sparse/dense gradient
paths through Horovod, and exact AUC across ranks (see docs/recsys.md)."""
