"""One background thread per tracker: the training loop hands it work and never waits.

A tracker library may take seconds to import, block on a slow disk, or hang on a server
that does not answer. Everything it does runs here, on a daemon thread fed by a bounded
queue: a full queue drops what does not fit, a failure stops the tracker, and closing
waits at most a given time. Each of these warns once per tracker, and none reaches the
loop. Whenever the tracker holds more for good, the run folder's state file records its
run id and the last step of each kind it holds (`state`), so a resumed run neither
starts a new tracker run nor sends a step twice, and sends what a killed job's tracker
had not stored.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, cast

from hpcdp.train.tracking import state
from hpcdp.train.tracking.records import Record

log = logging.getLogger("hpcdp.train.tracking")

#: Items a tracker may hold unsent before more are dropped (a record is a few hundred bytes).
QUEUE_SIZE = 10_000


class Sink(Protocol):
    """What one tracker module provides; every call runs on the worker's thread."""

    name: str

    def open(self, run_id: str | None) -> str:
        """Start a tracker run, or continue the one of `run_id`; its id."""

    def log(self, records: list[Record]) -> list[Record]:
        """Send these records (in step order); those of them and of earlier calls that
        the tracker now holds for good (a kill of the process would not lose them)."""

    def finish(self, summary: Mapping[str, Any] | None, stopped: str | None) -> None:
        """End the tracker run: finished with `summary`, or stopped (preempted) for now;
        everything logged is then held for good."""


class ModelSink(Sink, Protocol):
    """A tracker that also keeps files (run.tracker_model)."""

    def log_model(self, folder: Path) -> None:
        """Store the exported model folder with the tracker run."""


def last_steps(records: list[Record]) -> dict[str, int]:
    """The last step of each kind among `records`."""
    return latest(*({r.kind: r.step} for r in records))


def latest(*sent: Mapping[str, int]) -> dict[str, int]:
    """Per kind, the largest of the steps given: a tracker's `sent` never goes back."""
    out: dict[str, int] = {}
    for each in sent:
        for kind, step in each.items():
            out[kind] = max(step, out.get(kind, step))
    return out


class OneWarning:
    """A tracker's one warning: later troubles are only logged at debug."""

    def __init__(self, name: str) -> None:
        self.name, self.given = name, False

    def __call__(self, message: str) -> None:
        text = f"tracker {self.name}: {message}"
        if self.given:
            log.debug(text)
            return
        self.given = True
        log.warning(text)


def offer(items: queue.Queue, item: Any, warn: Callable[[str], None], room: int) -> None:
    """`item` into a tracker's bounded queue without waiting: training never waits on a
    tracker; once `room` items are waiting, later ones are dropped with `warn`."""
    try:
        items.put_nowait(item)
    except queue.Full:
        warn(f"{room} items not yet sent, so later ones are dropped: the tracker is "
             "slower than training")


class Worker:
    """A Sink on its own thread, with the run folder's memory of it."""

    def __init__(self, sink: Sink, run_dir: Path, known: state.TrackerState,
                 queue_size: int = QUEUE_SIZE,
                 missed: Callable[[Mapping[str, int]], list[Record]] | None = None) -> None:
        """`missed(sent)`: what the tracker run lacks, sent first (on this thread, since
        finding it reads the run's metrics file)."""
        self.sink, self.run_dir, self.known, self.missed = sink, run_dir, known, missed
        self.failed = False
        self.logged: dict[str, int] = {}  # the last steps handed to the tracker
        self._warn = OneWarning(sink.name)
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue(queue_size)
        self._thread = threading.Thread(target=self._run, name=f"hpcdp-{sink.name}",
                                        daemon=True)
        self._thread.start()

    def send(self, records: list[Record]) -> None:
        if records:
            self._put(("log", records))

    def model(self, folder: Path) -> None:
        self._put(("model", folder))

    def finish(self, summary: Mapping[str, Any] | None, stopped: str | None) -> None:
        self._put(("finish", (summary, stopped)))

    def close(self, timeout: float) -> bool:
        """Let the thread end after what it holds, waiting at most `timeout` seconds;
        whether it did."""
        deadline = time.monotonic() + timeout
        if not self.failed:
            with contextlib.suppress(queue.Full):  # then the join below times out too
                self._queue.put(None, timeout=timeout)
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            self.warn(f"still busy after run.tracker_close_timeout_s={timeout:g} s; what it "
                      "had not sent yet is left out")
            return False
        return True

    def wait(self) -> None:
        """Until the thread has ended: closed after sending all it held, or failed."""
        self._thread.join()

    def warn(self, message: str) -> None:
        """The one warning of this tracker (later troubles are only logged at debug)."""
        self._warn(message)

    def _put(self, item: tuple[str, Any]) -> None:
        if not self.failed:
            offer(self._queue, item, self.warn, self._queue.maxsize)

    def _run(self) -> None:
        try:
            run_id = self.sink.open(self.known.run_id)
            if run_id != self.known.run_id:  # a new tracker run holds nothing yet
                self.known = state.TrackerState(run_id, {})
                state.write(self.run_dir, self.sink.name, run_id, {})
            if self.missed is not None:
                self._handle("log", self.missed(self.known.sent))
            while (item := self._queue.get()) is not None:
                self._handle(*item)
        except Exception as e:  # noqa: BLE001 - whatever a tracker raises, training goes on
            self.failed = True
            self.warn(f"failed, and is off for the rest of this run: {type(e).__name__}: {e}")

    def _handle(self, what: str, payload: Any) -> None:
        if what == "log":
            if payload:
                self.logged = latest(self.logged, last_steps(payload))
                self._remember(last_steps(self.sink.log(payload)))
        elif what == "model":
            self._log_model(payload)
        else:
            self.sink.finish(*payload)
            self._remember(self.logged)

    def _log_model(self, folder: Path) -> None:
        """The model goes with the run, or is left out with a warning: the metrics and the
        run's end still go to the tracker."""
        try:
            cast(ModelSink, self.sink).log_model(folder)
        except Exception as e:  # noqa: BLE001 - a tracker's own errors, whatever they are
            self.warn(f"could not store the model {folder}: {type(e).__name__}: {e}")

    def _remember(self, held: Mapping[str, int]) -> None:
        """The state file's last steps, once the tracker holds them for good."""
        sent = latest(self.known.sent, held)
        if sent != self.known.sent:
            self.known = state.TrackerState(self.known.run_id, sent)
            state.write(self.run_dir, self.sink.name, str(self.known.run_id), sent)
