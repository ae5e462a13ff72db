"""The start every run makes on every rank: the trainer's and an own loop's (hpcdp.session).

Signal handlers come first (a signal during start-up must not kill a rank), then
Horovod with hpcdp's runtime settings, logging, the stall watchdog, and the
device: pinned, named in the identity line, and checked against the other
ranks' placement.
"""

from __future__ import annotations

import logging

import torch

from hpcdp.config import Config
from hpcdp.runtime import dist, watchdog
from hpcdp.runtime.preempt import Preemption
from hpcdp.train.reporting import setup_logging

log = logging.getLogger("hpcdp.train")


def begin(cfg: Config) -> Preemption | None:
    """Preemption handlers (None when preempt.enabled is off), Horovod, logging, watchdog."""
    preempt = None
    if cfg.preempt.enabled and cfg.preempt.signals:
        preempt = Preemption(cfg.preempt.signals, cfg.preempt.check_every).install()
    dist.init(cfg.horovod, cfg.run_dir,
              on_gpu=dist.wants_gpu(cfg.run.device, torch.cuda.is_available()),
              cpu_bind=cfg.run.cpu_bind)
    setup_logging(None, dist.rank() == 0)
    watchdog.start(cfg.run, dist.rank(), dist.size(), cfg.run_dir, lambda: dist.abort_job(1))
    return preempt


def place(cfg: Config) -> tuple[torch.device, str | None]:
    """Collective: this rank's device, and why the ranks must not go on (None: they may).

    Every rank takes part in the placement check, also one whose pinning failed,
    so that the error reaches all of them.
    """
    error: str | None = None
    try:
        device = dist.pin_device(cfg.run.device)
    except dist.AgreedError as e:
        device, error = torch.device("cpu"), str(e)
    dist.print_identity(device)
    crowded = dist.oversubscription()
    if crowded and dist.rank() == 0:
        log.warning(crowded)
    placed = dist.placement_error(device)                     # collective: hpcdp.runtime.placement
    return device, error or placed
