"""Run `hpcdp.train` where rank 0 sends itself a real SIGUSR1 just before a chosen step.

HPCDP_TEST_SIGNAL_BEFORE=k: the signal arrives before step k (0-based) trains, so
the flag is first sent with the check after that step. Unlike train_signal.py this
does not wrap the preemption all-reduce, which a single rank does without.
"""

from __future__ import annotations

import os
import signal
import sys

from hpcdp import train
from hpcdp.train import hooks

SIGNAL_BEFORE = int(os.environ.get("HPCDP_TEST_SIGNAL_BEFORE", "-1"))
_real = hooks.Hooks.before_step


def _arranged(self: hooks.Hooks, step: int) -> bool:
    if self.rank == 0 and step == SIGNAL_BEFORE:
        os.kill(os.getpid(), signal.SIGUSR1)
    return _real(self, step)


hooks.Hooks.before_step = _arranged  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(train.main(sys.argv[1:]))
