"""Run `hpcdp.train`, checking after every optimizer step that every rank holds the same
parameters: each rank's digest of its parameters' bytes is gathered, and rank 0 prints
`same-params step N` when all agree. A difference stops the job with an error.
"""

from __future__ import annotations

import hashlib
import sys

import horovod.torch as hvd

from hpcdp import train
from hpcdp.train import loop

_real = loop.train_step


def _checked(run, it, lr, sums, step, *args, **kwargs):
    times = _real(run, it, lr, sums, step, *args, **kwargs)
    digest = hashlib.sha256()
    for p in run.model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    seen = hvd.allgather_object(digest.hexdigest(), name="test.same_params")
    if len(set(seen)) != 1:
        raise RuntimeError(f"the ranks' parameters differ after step {step + 1}")
    if hvd.rank() == 0:
        print(f"same-params step {step + 1}", flush=True)
    return times


loop.train_step = _checked

if __name__ == "__main__":
    sys.exit(train.main(sys.argv[1:]))
