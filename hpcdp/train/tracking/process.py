"""Rank 0's end of a tracker's own process (hpcdp.train.tracking.child).

The training loop hands records to a bounded queue and never waits: a writer thread
passes them on down the child's input pipe (blocking there costs the loop nothing:
a blocked write holds no GIL), and a reader thread logs what the child reports, as
rank 0's own log lines. A full queue drops what does not fit, with one warning;
closing waits for the child at most a given time, then kills it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import hpcdp
from hpcdp.train.tracking import child, state
from hpcdp.train.tracking.records import Record
from hpcdp.train.tracking.worker import QUEUE_SIZE, OneWarning, offer

log = logging.getLogger("hpcdp.train.tracking")


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with this hpcdp first on the child's import path (pure)."""
    here = str(Path(hpcdp.__file__).resolve().parent.parent)
    paths = [here, *(p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


class TrackerProcess:
    """One tracker, run by a child process; `known`: its run as the run folder remembers."""

    def __init__(self, name: str, sink: Mapping[str, Any], run_dir: Path,
                 known: state.TrackerState, missed: tuple[Path, int] | None,
                 close_timeout_s: float, queue_size: int = QUEUE_SIZE) -> None:
        self.name, self.known = name, known
        self._gone = False  # the child's input is closed
        self._warn = OneWarning(name)
        self._queue: queue.Queue[str | None] = queue.Queue(queue_size + 1)
        self._queue.put(child.job_line(sink, run_dir, known, missed, close_timeout_s))
        self.proc, self._reader = self._start()
        self._writer = threading.Thread(target=self._write, name=f"hpcdp-{name}-out",
                                        daemon=True)
        if self.proc is not None:
            self._writer.start()

    def send(self, records: list[Record]) -> None:
        if records:
            self._put(child.records_line(records))

    def model(self, folder: Path) -> None:
        self._put(child.model_line(folder))

    def finish(self, summary: Mapping[str, Any] | None, stopped: str | None) -> None:
        self._put(child.finish_line(summary, stopped))

    def close(self, timeout: float) -> bool:
        """End the child's input and wait at most `timeout` seconds for it to send what it
        holds and exit; past that it is killed. Whether it ended in time."""
        if self.proc is None:
            return True
        deadline = time.monotonic() + timeout
        if not self._gone:
            with contextlib.suppress(queue.Full):  # then the wait below times out too
                self._queue.put(None, timeout=timeout)
        ended = True
        try:
            self.proc.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            ended = False
        # Its last lines are in rank 0's log before the end, and a warning among them is
        # this tracker's one, so it is read before rank 0 would give its own.
        self._reader.join(1.0)
        if not ended:
            self.warn(f"still busy after run.tracker_close_timeout_s={timeout:g} s; what it "
                      "had not sent yet is left out")
        return ended

    def warn(self, message: str) -> None:
        """The one warning of this tracker: rank 0's own, unless its child gave one."""
        self._warn(message)

    def _start(self) -> tuple[subprocess.Popen[bytes] | None, threading.Thread]:
        read_end, write_end = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", child.__name__, "--messages", str(write_end)],
                stdin=subprocess.PIPE, pass_fds=(write_end,),
                env=child_environment(os.environ))
            child.step_back(proc.pid)
        except OSError as e:
            os.close(read_end)
            self.warn(f"could not start its process, and is off for this run: {e}")
            proc = None
        finally:
            os.close(write_end)
        messages = os.fdopen(read_end, encoding="utf-8", errors="replace")
        reader = threading.Thread(target=relay, args=(messages, self._warn),
                                  name=f"hpcdp-{self.name}-in", daemon=True)
        if proc is not None:
            reader.start()
        return proc, reader

    def _put(self, line: str | None) -> None:
        if not self._gone:  # the queue holds the job line besides its room
            offer(self._queue, line, self.warn, self._queue.maxsize - 1)

    def _write(self) -> None:
        """Queue to pipe, until the queue's end or the child's (a failed tracker exits)."""
        assert self.proc is not None and self.proc.stdin is not None
        pipe = self.proc.stdin
        with contextlib.suppress(OSError):  # the child is gone: what is left is dropped
            while (line := self._queue.get()) is not None:
                pipe.write(line.encode())
                pipe.flush()
        self._gone = True
        with contextlib.suppress(OSError):
            pipe.close()


def relay(messages: IO[str], warning: OneWarning) -> None:
    """The child's "<level> <message>" lines, logged here, until it closes its end. A
    warning of the child's is this tracker's one: rank 0 gives none of its own after it
    (both would time out together when the tracker hangs on closing)."""
    with messages:
        for line in messages:
            level, _, message = line.rstrip("\n").partition(" ")
            number = int(level) if level.isdigit() else logging.WARNING
            if number >= logging.WARNING:
                warning.given = True
            log.log(number, message)
