"""Run `hpcdp.train` where rank 1 gets a real SIGUSR1, or crashes, at a chosen step.

HPCDP_TEST_SIGNAL_AT=k: rank 1 signals itself just before the k-th preemption
check, so the ranks see the flag at different times and must agree on it.
HPCDP_TEST_CRASH_AT=k: rank 1 raises instead, while rank 0 waits in a collective.
The real all-reduce still runs; only the moment of the event is arranged.
HPCDP_TEST_PRUNE_FAILS=1: deleting old checkpoints fails (after each new file is
complete), as on a file system that refuses the unlink.
"""

from __future__ import annotations

import os
import signal
import sys

import horovod.torch as hvd

from hpcdp import train
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import loop

SIGNAL_AT = int(os.environ.get("HPCDP_TEST_SIGNAL_AT", "0"))
CRASH_AT = int(os.environ.get("HPCDP_TEST_CRASH_AT", "0"))
_real = loop.agree_stop
_calls = 0


def _arranged(*args, **kwargs):
    """The k-th preemption check (every step: check_every=1), where the flag is sent with
    the next step's gradients or in an all-reduce of its own."""
    global _calls
    _calls += 1
    if hvd.rank() == 1 and _calls == SIGNAL_AT:
        os.kill(os.getpid(), signal.SIGUSR1)
    if hvd.rank() == 1 and _calls == CRASH_AT:
        raise RuntimeError(f"arranged failure at check {_calls}")
    return _real(*args, **kwargs)


loop.agree_stop = _arranged


def _prune_fails(folder, keep):
    raise PermissionError(f"arranged: cannot delete old checkpoints in {folder}")


if os.environ.get("HPCDP_TEST_PRUNE_FAILS"):
    ckfolder.prune = _prune_fails

if __name__ == "__main__":
    sys.exit(train.main(sys.argv[1:]))
