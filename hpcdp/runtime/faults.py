"""Faults on purpose, for tests: `HPCDP_FAULT` arms them.

Faults are `;`-separated, each `KIND:key=value:...` with KIND one of
raise | kill | stall | nan | slow, `step=N` (the step about to run, 0-based as the
loop counts), optional `rank=R` (default: every rank) and:
- `seconds=S` for stall (default 600);
- `phase=P` for raise, kill and stall: act when the rank enters phase P of step N
  instead of before the step (P: data, forward, backward, optimizer, checkpoint,
  validation, or collective: just before the first collective it enters in that step);
- `factor=F` for slow: from step N on (default 0) each step of the rank takes about
  F times as long (a straggler, not a stall).

    HPCDP_FAULT="kill:rank=1:step=3"    rank 1 SIGKILLs itself before step 3
    HPCDP_FAULT="stall:rank=0:step=2:seconds=600:phase=data"
    HPCDP_FAULT="nan:step=4"            every rank's loss is NaN at step 4
    HPCDP_FAULT="slow:rank=1:factor=1.5"

Parsing is pure. `inject` is the one call per step the training loop makes (with the
variable unset it costs one dict lookup); phased faults act through `phase_hook`,
which hpcdp.runtime.watchdog calls at its phase marks.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ENV = "HPCDP_FAULT"
KINDS = ("raise", "kill", "stall", "nan", "slow")
PHASES = ("data", "forward", "backward", "optimizer", "collective", "checkpoint",
          "validation")
KEYS = ("rank", "step", "seconds", "phase", "factor")


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
    phase: str | None = None  # None: before the step
    factor: float = 1.0  # slow only

    def hits(self, step: int, rank: int) -> bool:
        if self.rank is not None and self.rank != rank:
            return False
        return step >= self.step if self.kind == "slow" else step == self.step


def parse(text: str) -> list[Fault]:
    """`raise:rank=1:step=3;nan:step=5` -> Faults; raise FaultError naming the bad part."""
    return [_parse_one(spec) for spec in filter(None, (s.strip() for s in text.split(";")))]


def _parse_one(spec: str) -> Fault:
    kind, *pairs = spec.split(":")
    if kind not in KINDS:
        raise FaultError(f"{ENV}: unknown fault {kind!r} in {spec!r} "
                         f"(choose one of {', '.join(KINDS)})")
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in KEYS:
            raise FaultError(f"{ENV}: bad part {pair!r} in {spec!r} "
                             "(expected rank=R, step=N, seconds=S, phase=P or factor=F)")
        values[key] = value
    if "step" not in values and kind != "slow":
        raise FaultError(f"{ENV}: {spec!r} has no step=N")
    phase = values.get("phase")
    if phase is not None and (kind not in ("raise", "kill", "stall") or phase not in PHASES):
        raise FaultError(f"{ENV}: {spec!r}: phase={phase} is not allowed (a phase is one of "
                         f"{', '.join(PHASES)}, for raise, kill and stall only)")
    try:
        fault = Fault(kind, int(values.get("step", 0)),
                      int(values["rank"]) if "rank" in values else None,
                      float(values.get("seconds", 600.0)), phase,
                      float(values.get("factor", 1.0)))
    except ValueError:
        raise FaultError(f"{ENV}: {spec!r} has a value that is not a number") from None
    if "factor" in values and (kind != "slow" or fault.factor < 1.0):
        raise FaultError(f"{ENV}: {spec!r}: factor=F belongs to slow and must be at least 1")
    return fault


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


def _act(f: Fault, step: int, rank: int, where: str) -> None:
    """Act out a raise, kill or stall fault."""
    if f.kind == "raise":
        raise InjectedFault(f"injected failure on rank {rank} at step {step}{where}")
    if f.kind == "kill":
        _say(f"rank {rank} kills itself (SIGKILL) at step {step}{where}")
        os.kill(os.getpid(), signal.SIGKILL)
    if f.kind == "stall":
        _say(f"rank {rank} stalls for {f.seconds:g} s at step {step}{where} "
             f"(unix time {time.time():.1f})")
        time.sleep(f.seconds)


class _Slowdown:
    """Sleeps that make each step about `factor` times as long as the rank's own work."""

    def __init__(self) -> None:
        self.resumed: float | None = None
        self.recent: deque[float] = deque(maxlen=5)  # the smallest leaves out checkpoints

    def __call__(self, factor: float) -> None:
        now = time.monotonic()
        if self.resumed is not None:
            self.recent.append(now - self.resumed)
        if self.recent:
            time.sleep((factor - 1.0) * min(self.recent))
        self.resumed = time.monotonic()


_slowdown = _Slowdown()


def inject(step: int, rank: int) -> bool:
    """Before step `step` on `rank`: act out any armed fault; True if the loss must be NaN."""
    nan = False
    for f in armed():
        if f.phase is not None or not f.hits(step, rank):
            continue
        if f.kind == "slow":
            _slowdown(f.factor)
        nan = nan or f.kind == "nan"
        _act(f, step, rank, "")
    return nan


def phase_hook(rank: int) -> Callable[[str, int], None] | None:
    """What hpcdp.runtime.watchdog calls at each phase mark: acts out this rank's phased faults.

    None when there are none (then the marks cost nothing more). Each fault acts once.
    """
    pending = [f for f in armed() if f.phase is not None and f.rank in (None, rank)]
    if not pending:
        return None

    def hook(phase: str, step: int) -> None:
        for f in list(pending):
            if f.phase == phase and f.step == step:
                pending.remove(f)
                _act(f, step, rank, f", phase {phase}")

    return hook


def poison(loss: torch.Tensor) -> torch.Tensor:
    """The loss, made NaN while keeping its graph (so backward sends NaN gradients)."""
    return loss * float("nan")
