"""One rank of the cluster smoke test: Horovod over srun --mpi=pmix, checked on every rank."""

from __future__ import annotations

import json
import os

import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
expected = hvd.size() * (hvd.size() + 1) / 2
assert total.item() == expected, f"rank {hvd.rank()}: sum {total.item()} != {expected}"
info = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
        "node": os.environ.get("SLURMD_NODENAME"), "sum": total.item()}
print("smoke " + json.dumps(info, sort_keys=True), flush=True)
hvd.shutdown()
