"""Crash reports for every hpcdp process: a Python stack when a rank dies of a signal.

Used by the `hpcdp` command and by each module's own `main` (which also runs as
`python -m ...` under mpirun or srun, bypassing the command). No imports beyond
the standard library, so that any entry point can call it first.
"""

from __future__ import annotations

import contextlib
import faulthandler


def report_crashes() -> None:
    """Print every thread's Python stack when the process dies of a fatal signal.

    A rank killed by SIGSEGV or SIGBUS otherwise leaves only the launcher's "exited
    on signal N"; with the stack, the message names where it happened (a file
    truncated under the reader's mapping shows the reader's gather, for one).
    """
    if not faulthandler.is_enabled():
        with contextlib.suppress(OSError, ValueError):  # stderr without a file descriptor
            faulthandler.enable(all_threads=True)
