"""One tracker in a process of its own: `python -m hpcdp.train.tracking.child`.

Rank 0 starts one per tracker (hpcdp.train.tracking.process), so that the tracker
library takes nothing from training: its imports, its SQLite writes and its retries of
a dead server hold neither the training process's GIL nor rank 0's pinned core. This
process runs at the lowest priority, on every core the job may use, and ignores the signals a
scheduler or a terminal sends the job: it ends when rank 0 closes its input, after
sending what it holds (rank 0 bounds that wait and kills it after).

Input, one JSON value per line: first the job (`job_line`), then ["log", [records]],
["model", folder] or ["finish", [summary, stopped]]; the end of input closes. Log
lines go back to rank 0's log on the descriptor given by --messages, as "<level>
<message>" lines.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import IO, Any

from hpcdp.train.tracking import state
from hpcdp.train.tracking.records import Record, catch_up, parse_jsonl
from hpcdp.train.tracking.worker import Sink, Worker

#: How far below training this process runs (a nice value: the lowest priority).
NICENESS = 19
#: The signals a job gets from Slurm, mpirun or a terminal, which rank 0 handles.
JOB_SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")


def job_line(sink: Mapping[str, Any], run_dir: Path, known: state.TrackerState,
             missed: tuple[Path, int] | None, close_timeout_s: float) -> str:
    """The first input line (pure). `sink`: {"factory": "module:Class", "args": {...}};
    `missed`: the metrics file and the resumed step, when a resume may owe records."""
    return json.dumps({
        "sink": dict(sink), "run_dir": str(run_dir), "run_id": known.run_id,
        "sent": known.sent, "close_timeout_s": close_timeout_s,
        "missed": [str(missed[0]), missed[1]] if missed else None}) + "\n"


def records_line(records: list[Record]) -> str:
    """A "log" input line (pure)."""
    return json.dumps(["log", [[r.kind, r.step, dict(r.values), r.time] for r in records]]) + "\n"


def model_line(folder: Path) -> str:
    return json.dumps(["model", str(folder)]) + "\n"


def finish_line(summary: Mapping[str, Any] | None, stopped: str | None) -> str:
    return json.dumps(["finish", [None if summary is None else dict(summary), stopped]]) + "\n"


def missed_records(path: Path, resumed_step: int, sent: Mapping[str, int]) -> list[Record]:
    """What the metrics file holds up to the resumed checkpoint that a tracker run with
    `sent` lacks (the file is missing: nothing)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return catch_up(parse_jsonl(text.splitlines()), sent, resumed_step)


def build_sink(spec: Mapping[str, Any]) -> Sink:
    module, _, name = spec["factory"].partition(":")
    return getattr(importlib.import_module(module), name)(**spec["args"])


def step_back(pid: int) -> None:
    """Process `pid` below training in priority, on any core the job may use (rank 0 calls
    it as soon as the child exists, so that not even its start-up runs on rank 0's core
    at rank 0's priority; the child calls it again for itself)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, NICENESS)
    with contextlib.suppress(OSError, AttributeError):  # cores outside the job's cpuset
        os.sched_setaffinity(pid, range(os.cpu_count() or 1))  # are left out by the kernel


def stand_aside() -> None:
    """Below training, on any core the job may use, deaf to job signals."""
    for name in JOB_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    step_back(0)


class MessageHandler(logging.Handler):
    """Log records as "<level> <message>" lines, one per record, for rank 0 to log."""

    def __init__(self, out: IO[str]) -> None:
        super().__init__()
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError, ValueError):  # rank 0 is gone: nobody to tell
            message = record.getMessage().replace("\n", " ")
            self.out.write(f"{record.levelno} {message}\n")
            self.out.flush()


def feed(worker: Worker, lines: IO[str], close_timeout_s: float) -> bool:
    """Hand each input line to the worker; at the end of input, close it: whether it
    sent all it held in time."""
    for line in lines:
        what, payload = json.loads(line)
        if what == "log":
            worker.send([Record(k, s, v, t) for k, s, v, t in payload])
        elif what == "model":
            worker.model(Path(payload))
        else:
            worker.finish(*payload)
    return worker.close(close_timeout_s)


def run(job: Mapping[str, Any], lines: IO[str]) -> None:
    """Run the job's tracker until the input ends and it has sent what it holds (or the
    close timeout passed: a hung tracker is left behind as the process ends), or until
    it fails."""
    missed = None
    if job["missed"]:
        missed = partial(missed_records, Path(job["missed"][0]), int(job["missed"][1]))
    worker = Worker(build_sink(job["sink"]), Path(job["run_dir"]),
                    state.TrackerState(job["run_id"], dict(job["sent"])), missed=missed)
    # A tracker that failed has nothing more to do: the process ends without waiting
    # for the end of input (rank 0's next write finds the pipe closed).
    threading.Thread(target=exit_when_done, args=(worker,), name="hpcdp-tracker-exit",
                     daemon=True).start()
    closed = feed(worker, lines, float(job["close_timeout_s"]))
    os._exit(0 if closed else 1)  # nor the tracker library's exit handlers: it is hung


def exit_when_done(worker: Worker) -> None:
    worker.wait()
    os._exit(0)  # the worker thread is done: everything it held is sent, or it failed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, required=True,
                        help="descriptor for log lines to rank 0")
    args = parser.parse_args(argv)
    stand_aside()
    messages = os.fdopen(args.messages, "w", encoding="utf-8")
    logger = logging.getLogger("hpcdp")
    logger.handlers[:] = [MessageHandler(messages)]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    run(json.loads(sys.stdin.readline()), sys.stdin)


if __name__ == "__main__":
    main()
