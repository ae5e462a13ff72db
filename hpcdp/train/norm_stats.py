"""One set of BatchNorm running statistics on every rank: averaged after each optimizer step.

A BatchNorm layer's running mean and variance are buffers, not gradients: each
rank updates them from its own batches and Horovod never averages them. Left
alone, every rank holds its own set; a checkpoint saves rank 0's, a resume gives
rank 0's to every rank (so a resumed run is another run), and validation scores
each rank's share with that rank's statistics (so its numbers depend on the
number of ranks and differ from `hpcdp eval` of the same checkpoint).

The rule: after every optimizer step, each running mean and variance becomes
its average over the ranks, in one all-reduce of one flat buffer, started when
backward is done (it overlaps the gradients' last reductions) and waited for
after the update. A stop at any step then lands on statistics every rank holds,
so a checkpoint is the state of every rank, a resume is exact, and validation is
the same on any number of ranks. The average of the ranks' running averages is
the running average of the ranks' batch statistics (the update is linear), so
this is what one process would keep from the mean of the ranks' batch
statistics. `num_batches_tracked` needs no collective: every rank runs the same
number of training forward passes per step (setup.uneven_steps_error), from the
count rank 0 broadcast at the start.

Horovod's SyncBatchNorm (model.sync_bn) computes the statistics over the global
batch in each forward pass, so its buffers already agree and are left out.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from hpcdp.runtime import dist

NAME = "hpcdp.norm_stats"


def running_buffers(model: nn.Module, skip: tuple[type, ...] = ()) -> list[torch.Tensor]:
    """Every running mean and variance that a rank updates from its own batches (pure)."""
    found = []
    for m in model.modules():
        norm = isinstance(m, nn.modules.batchnorm._NormBase) and not isinstance(m, skip)
        if norm and m.track_running_stats and m.running_mean is not None:
            found += [m.running_mean, m.running_var]
    return found


class NormStats:
    """The running statistics of one model, averaged over the ranks in one flat buffer."""

    def __init__(self, buffers: list[torch.Tensor]) -> None:
        kinds = {(b.dtype, b.device) for b in buffers}
        if len(kinds) != 1:
            raise ValueError(f"BatchNorm running statistics of several dtypes or devices "
                             f"({sorted(str(k) for k in kinds)}) cannot be averaged in one "
                             "buffer")
        self.buffers = buffers
        first = buffers[0]
        self.flat = torch.empty(sum(b.numel() for b in buffers), dtype=first.dtype,
                                device=first.device)
        self.parts = list(self.flat.split([b.numel() for b in buffers]))

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def start(self) -> Callable[[], None]:
        """Collective: start averaging this rank's statistics; returns the function that
        waits for the average and puts it in place (before the next forward pass)."""
        torch.cat([b.view(-1) for b in self.buffers], out=self.flat)
        wait = dist.start_average_(self.flat, NAME)

        def finish() -> None:
            wait()
            torch._foreach_copy_([b.view(-1) for b in self.buffers], self.parts)

        return finish


def averaged_stats(model: nn.Module, size: int) -> NormStats | None:
    """The statistics to average over `size` ranks, or None (one rank, or none to average)."""
    if size == 1:
        return None
    buffers = running_buffers(model, (dist.sync_batchnorm_class(),))
    return NormStats(buffers) if buffers else None
