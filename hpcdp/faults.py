"""Faults on purpose (for tests) and the step watchdog that bounds a stalled job.

`HPCDP_FAULT` arms faults, `;`-separated, each `KIND:key=value:...` with KIND one of
raise | kill | stall | nan, `step=N` (the step about to run, 0-based as the loop
counts), optional `rank=R` (default: every rank) and, for stall, `seconds=S`:

    HPCDP_FAULT="kill:rank=1:step=3"    rank 1 SIGKILLs itself before step 3
    HPCDP_FAULT="stall:rank=0:step=2:seconds=600"
    HPCDP_FAULT="nan:step=4"            every rank's loss is NaN at step 4

Parsing is pure; `inject` is the one call per step the training loop makes. With
the variable unset, `inject` costs one dict lookup.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

ENV = "HPCDP_FAULT"
KINDS = ("raise", "kill", "stall", "nan")


class FaultError(ValueError):
    """HPCDP_FAULT does not parse."""


class InjectedFault(RuntimeError):
    """The exception a `raise` fault throws (a stand-in for any bug in user code)."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None  # None: every rank
    seconds: float = 600.0  # stall only

    def hits(self, step: int, rank: int) -> bool:
        return step == self.step and (self.rank is None or self.rank == rank)


def parse(text: str) -> list[Fault]:
    """`raise:rank=1:step=3;nan:step=5` -> Faults; raise FaultError naming the bad part."""
    faults = []
    for spec in filter(None, (s.strip() for s in text.split(";"))):
        kind, *pairs = spec.split(":")
        if kind not in KINDS:
            raise FaultError(f"{ENV}: unknown fault {kind!r} in {spec!r} "
                             f"(choose one of {', '.join(KINDS)})")
        values: dict[str, str] = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or key not in ("rank", "step", "seconds"):
                raise FaultError(f"{ENV}: bad part {pair!r} in {spec!r} "
                                 "(expected rank=R, step=N or seconds=S)")
            values[key] = value
        if "step" not in values:
            raise FaultError(f"{ENV}: {spec!r} has no step=N")
        try:
            fault = Fault(kind, int(values["step"]),
                          int(values["rank"]) if "rank" in values else None,
                          float(values.get("seconds", 600.0)))
        except ValueError:
            raise FaultError(f"{ENV}: {spec!r} has a value that is not a number") from None
        faults.append(fault)
    return faults


_armed: list[Fault] | None = None


def armed(environ: Mapping[str, str] | None = None) -> list[Fault]:
    """The faults HPCDP_FAULT arms in this process (parsed once)."""
    global _armed
    if _armed is None:
        _armed = parse((os.environ if environ is None else environ).get(ENV, ""))
    return _armed


def _say(text: str) -> None:
    sys.stderr.write(f"[hpcdp fault] {text}\n")
    sys.stderr.flush()


def inject(step: int, rank: int) -> bool:
    """Before step `step` on `rank`: act out any armed fault; True if the loss must be NaN."""
    nan = False
    for f in armed():
        if not f.hits(step, rank):
            continue
        if f.kind == "raise":
            raise InjectedFault(f"injected failure on rank {rank} at step {step}")
        if f.kind == "kill":
            _say(f"rank {rank} kills itself (SIGKILL) at step {step}")
            os.kill(os.getpid(), signal.SIGKILL)
        if f.kind == "stall":
            _say(f"rank {rank} stalls for {f.seconds:g} s at step {step}")
            time.sleep(f.seconds)
        nan = nan or f.kind == "nan"
    return nan


def poison(loss: torch.Tensor) -> torch.Tensor:
    """The loss, made NaN while keeping its graph (so backward sends NaN gradients)."""
    return loss * float("nan")


class Watchdog:
    """A thread that ends the whole job when a step boundary is not reached in time.

    Horovod's stall shutdown frees only the ranks that wait in a collective; a rank
    stuck in its own code (a hung file system, a deadlocked data loader) is freed
    by nothing. `beat()` at each step boundary; after `timeout` seconds without one
    the thread prints which rank and step, then calls `on_timeout` (abort the job).
    """

    def __init__(self, timeout: float, rank: int, on_timeout: Callable[[], None]) -> None:
        self.timeout = timeout
        self.rank = rank
        self.on_timeout = on_timeout
        self.step = -1
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcdp-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._last = time.monotonic()
        self._thread.start()
        return self

    def beat(self, step: int) -> None:
        self.step, self._last = step, time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            idle = time.monotonic() - self._last
            if idle > self.timeout:
                _say_watchdog = (f"[hpcdp rank {self.rank}] no step boundary for {idle:.0f} s "
                                 f"after step {self.step} (run.step_timeout_s="
                                 f"{self.timeout:g}): aborting the job\n")
                sys.stderr.write(_say_watchdog)
                sys.stderr.flush()
                self.on_timeout()
                return
