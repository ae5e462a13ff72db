"""What every training reader takes (ReadOptions) and what it offers (TrainingReader).

The image (`hpcdp.data.read.samples.ShardedReader`), token
(`hpcdp.data.read.tokens.TokenReader`) and field (`hpcdp.data.read.multi_field.FieldReader`)
readers serve this rank's share of one global order (`hpcdp.data.read.order`), so
they take the same options: the per-rank batch, the rank in its world, the seed,
the shuffle window, the virtual shards and the read-ahead. The trainer
(hpcdp.train) and the checkpoint manager use a reader only through
`TrainingReader`, and a validation reader only through `ValidationReader`, so a
task may bring its own reader of that shape (`Task.readers`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ReadOptions:
    """How one rank reads its share; each reader checks the values, naming its file."""

    batch_size: int  # samples per batch on this rank
    rank: int = 0
    world_size: int = 1
    seed: int = 0  # the order depends on it, the epoch and the global batch, not the world
    window_samples: int | None = None  # shuffle window per stream; None or 0: the default
    virtual_shards: int | None = None  # None or 0: the default for this batch and world
    prefetch: int = 2  # batches built ahead in a background thread; 0: none

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size


def read_options(options: ReadOptions | None, keywords: Mapping[str, Any]) -> ReadOptions:
    """`options`, or the ReadOptions spelled as a reader's keyword arguments (not both).

    Readers accept either, so that `ShardedReader(path, batch_size=8)` reads as
    before while the trainer hands one ReadOptions to whichever reader a task uses.
    """
    if options is None:
        return ReadOptions(**keywords)  # an unknown or missing keyword: TypeError, named
    if keywords:
        raise TypeError(f"read options given twice: as ReadOptions and as {sorted(keywords)}")
    if not isinstance(options, ReadOptions):
        raise TypeError(f"options must be a ReadOptions, got {options!r}")
    return options


@runtime_checkable
class TrainingReader(Protocol):
    """This rank's shuffled batches: equal steps on every rank, exact mid-epoch resume."""

    @property
    def batch_size(self) -> int: ...

    @property
    def steps_per_epoch(self) -> int: ...

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """One input sample's shape (a multi-field reader: its first field's)."""

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`, unless a loaded state resumes inside it."""

    def __len__(self) -> int:
        """Steps left in the current epoch (the same on every rank)."""

    def __iter__(self) -> Iterator[Any]:
        """The epoch's remaining batches: a tuple of tensors each, in the task's order."""

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands (what a checkpoint stores)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict()`'s result, checked against this file and world."""

    def close(self) -> None: ...


@runtime_checkable
class ValidationReader(Protocol):
    """This rank's share of every validation sample once, iterable afresh each time."""

    def __iter__(self) -> Iterator[Any]: ...
