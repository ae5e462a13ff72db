"""Several row-aligned datasets of one file (dense, sparse, label, ...) read as one sample.

`FieldReader` runs one `ShardedReader` per field over the same sample order and
hands out their batches together. The order of a `ShardedReader` is a function
of (rows, block, seed, epoch, global batch, virtual shards, window, position)
only (`hpcdp.data.read.order`), so readers that agree on those serve row i of
every field in the same batch slot: this module passes the same seed, window
and virtual shards to each, checks that the fields have the same rows and the
same rows per chunk, and moves their epoch and resume state together. Every
guarantee of the single reader (whole-chunk reads, the shuffle window, an order
independent of the world size, exact resume also into another world size)
therefore holds per field and, with the checks, across fields.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from hpcdp.data.read import order as pt
from hpcdp.data.read.protocol import ReadOptions, read_options
from hpcdp.data.read.samples import (
    DatasetInfo,
    ReaderError,
    ShardedReader,
    default_window,
    validate_dataset,
)


def validate_fields(path: str, fields: Sequence[str], min_samples: int = 1) -> list[DatasetInfo]:
    """Each field's dataset, checked; `ReaderError` when they cannot be read row-aligned."""
    if not fields:
        raise ReaderError(f"{path}: no fields to read")
    if len(set(fields)) != len(fields):
        raise ReaderError(f"{path}: a field is named twice in {list(fields)}")
    infos = [validate_dataset(path, name, None, min_samples) for name in fields]
    first = infos[0]
    for info in infos[1:]:
        if info.num_samples != first.num_samples:
            raise ReaderError(f"{path}: field {info.x_name!r} has {info.num_samples} rows but "
                              f"{first.x_name!r} has {first.num_samples}")
        if info.block != first.block:
            raise ReaderError(
                f"{path}: field {info.x_name!r} is chunked by {info.block} rows but "
                f"{first.x_name!r} by {first.block}: row-aligned fields need the same rows "
                "per chunk (their sample orders are built from whole chunks)")
    return infos


class _Lead:
    """An attribute of the first field's reader: the readers share layout and state, so
    the first one's stands for all."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, reader: Any, owner: type | None = None) -> Any:
        return self if reader is None else getattr(reader.lead, self.name)


class _Each(_Lead):
    """A method called on every field's reader in turn, so that they move together."""

    def __get__(self, reader: Any, owner: type | None = None) -> Any:
        if reader is None:
            return self

        def each(*args: Any) -> None:
            for r in reader.readers:
                getattr(r, self.name)(*args)

        return each


class FieldReader:
    """This rank's share of several row-aligned datasets, as tuples of batches, one per field.

    Arguments as for `ShardedReader` (`batch_size` per rank); iteration yields a
    tuple of tensors in the order of `fields`, each of `batch_size` rows, row k of
    each from the same file row. The state is a `ShardedReader` state.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fields: Sequence[str],
        options: ReadOptions | None = None,
        *,
        pin_memory: bool = False,
        mmap: bool | None = None,
        **read: Any,
    ) -> None:
        """`options` (or its fields as keywords: batch_size=..., rank=...) say how this
        rank reads; every field's reader gets them, with one window and shard count."""
        opts = read_options(options, read)
        path = os.fspath(path)
        self.fields = tuple(fields)
        if opts.batch_size < 1 or opts.world_size < 1:
            raise ReaderError(f"{path}: batch_size and world_size must be at least 1")
        global_batch = opts.global_batch
        self.infos = validate_fields(path, self.fields, min_samples=global_batch)
        row_bytes = sum(info.sample_bytes for info in self.infos)
        window = opts.window_samples or default_window(self.infos[0].block, row_bytes)
        virtual_shards = opts.virtual_shards
        if virtual_shards is None:
            try:
                virtual_shards = pt.default_virtual_shards(global_batch, opts.world_size)
            except pt.PartitionError as exc:
                raise ReaderError(f"{path}: {exc}") from exc
        each = dataclasses.replace(opts, window_samples=window, virtual_shards=virtual_shards)
        self.readers = [ShardedReader(path, each, x_name=name, y_name=None,
                                      pin_memory=pin_memory, mmap=mmap)
                        for name in self.fields]
        self.path = path

    @property
    def lead(self) -> ShardedReader:
        """The first field's reader: its layout and state stand for all."""
        return self.readers[0]

    num_samples = _Lead()
    batch_size = _Lead()
    sample_shape = _Lead()  # the first field's (what the model builder sees, as in training)
    steps_per_epoch = _Lead()
    window = _Lead()
    virtual_shards = _Lead()
    epoch = _Lead()
    state_dict = _Lead()
    set_epoch = _Each()
    load_state_dict = _Each()
    close = _Each()

    @property
    def mapped(self) -> bool:
        return all(r.mapped for r in self.readers)

    def __len__(self) -> int:
        return len(self.lead)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        iters = [iter(r) for r in self.readers]
        try:
            for parts in zip(*iters):
                yield tuple(x for x, _ in parts)
        finally:
            for it in iters:
                it.close()  # stop every field's prefetch when the consumer leaves early

    def __enter__(self) -> FieldReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
