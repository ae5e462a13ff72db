"""Run `hpcdp.train` where rank 0 SIGKILLs itself after step HPCDP_TEST_KILL_AT, once its
trackers hold what the last checkpoint covers (step HPCDP_TEST_COVERED, as their state
files in the run folder say) and have had a second more: a node failure that finds
records sent and records held back, with the tracker threads long started.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from hpcdp import train
from hpcdp.runtime import dist
from hpcdp.train import loop
from hpcdp.train.tracking import state

KILL_AT = int(os.environ.get("HPCDP_TEST_KILL_AT", "0"))
COVERED = int(os.environ.get("HPCDP_TEST_COVERED", "0"))
TRACKERS = os.environ.get("HPCDP_TEST_TRACKERS", "").split(",")
_real = loop.agree_stop


def run_dir(argv: list[str]) -> Path:
    return Path(next(a.split("=", 1)[1] for a in argv if a.startswith("run.dir=")))


def _arranged(preempt, hooks, step, *args, **kwargs):
    if dist.rank() == 0 and step == KILL_AT:
        folder, deadline = run_dir(sys.argv[1:]), time.monotonic() + 60
        while any(state.read(folder, name).sent.get("train", -1) < COVERED
                  for name in TRACKERS):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the trackers never took step {COVERED}")
            time.sleep(0.1)
        time.sleep(1.0)  # what else they were handed has time to arrive
        os.kill(os.getpid(), signal.SIGKILL)
    return _real(preempt, hooks, step, *args, **kwargs)


loop.agree_stop = _arranged

if __name__ == "__main__":
    sys.exit(train.main(sys.argv[1:]))
