"""One ReadOptions for the image, field and token readers; one protocol the trainer uses.

Each reader takes the options as one ReadOptions or as keywords, with the same batches
either way, and has the shape of `TrainingReader`; the validation readers have the
shape of `ValidationReader`. The trainer's set-up builds every reader from one
ReadOptions (`hpcdp.tasks.read_options`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcdp import config as cfgmod
from hpcdp.data.format import tokens as tk
from hpcdp.data.read.evaluation import SliceReader
from hpcdp.data.read.multi_field import FieldReader
from hpcdp.data.read.protocol import ReadOptions, TrainingReader, ValidationReader
from hpcdp.data.read.samples import ShardedReader
from hpcdp.data.read.tokens import TokenReader
from hpcdp.tasks import read_options
from hpcdp.tasks.lm import Validation
from hpcdp.train import setup

OPTIONS = ReadOptions(batch_size=4, rank=1, world_size=2, seed=3, window_samples=32,
                      virtual_shards=4, prefetch=0)


def image_file(path: Path, n: int = 200) -> Path:
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(n * 4, dtype=np.float32).reshape(n, 1, 2, 2),
                         chunks=(8, 1, 2, 2))
        f.create_dataset("y", data=np.arange(n) % 3, chunks=(8,))
        f.create_dataset("ids", data=np.stack([np.arange(n)] * 3, 1).astype(np.int32),
                         chunks=(8, 3))
    return path


def token_file(path: Path, num_tokens: int = 4000) -> Path:
    vocab = 1 << 16
    meta = tk.TokenMeta(vocab_size=vocab, eod_id=vocab - 1, tokenizer="ids",
                        tokenizer_sha256="00" * 32)
    with h5py.File(path, "w") as f:
        t, o = tk.create_datasets(f, meta, num_tokens, 1, num_tokens - 1)
        t[:] = np.arange(num_tokens, dtype=np.uint32) % (vocab - 1)
        o[:] = [0, num_tokens]
    return path


def epoch(reader: TrainingReader) -> list[torch.Tensor]:
    reader.set_epoch(1)
    return [batch[0] for batch in reader]


def readers(tmp_path: Path, how: dict) -> list[TrainingReader]:
    images, tokens = image_file(tmp_path / "i.h5"), token_file(tmp_path / "t.h5")
    return [ShardedReader(images, **how), FieldReader(images, ("x", "y", "ids"), **how),
            TokenReader(tokens, seq_len=8, **how)]


def test_options_or_keywords_give_the_same_batches(tmp_path: Path) -> None:
    by_options = readers(tmp_path, {"options": OPTIONS})
    by_keywords = readers(tmp_path, dataclasses.asdict(OPTIONS))
    for a, b in zip(by_options, by_keywords, strict=True):
        assert isinstance(a, TrainingReader) and isinstance(b, TrainingReader)
        assert (a.batch_size, a.steps_per_epoch, len(a)) == (4, b.steps_per_epoch, len(b))
        steps = a.steps_per_epoch
        first, second = epoch(a), epoch(b)
        assert len(first) == steps > 0 and all(
            torch.equal(x, y) for x, y in zip(first, second, strict=True))
        assert a.state_dict() == b.state_dict()
    assert by_options[1].sample_shape == (1, 2, 2) == by_options[0].sample_shape
    assert by_options[2].sample_shape == (8,)


def test_the_options_are_given_once_and_by_their_names(tmp_path: Path) -> None:
    path = image_file(tmp_path / "i.h5")
    with pytest.raises(TypeError, match="read options given twice"):
        ShardedReader(path, OPTIONS, batch_size=2)
    with pytest.raises(TypeError, match="batchsize"):
        ShardedReader(path, batchsize=2)
    with pytest.raises(TypeError, match="must be a ReadOptions"):
        FieldReader(path, ("x", "y", "ids"), {"batch_size": 2})  # type: ignore[arg-type]


def test_validation_readers_have_the_protocols_shape(tmp_path: Path) -> None:
    val = SliceReader(image_file(tmp_path / "i.h5"), ["x", "y"], batch_size=8)
    tokens = TokenReader(token_file(tmp_path / "t.h5"), ReadOptions(batch_size=1), seq_len=8)
    for reader in (val, Validation(tokens, 4)):
        assert isinstance(reader, ValidationReader) and len(list(reader)) > 0
    assert not isinstance(val, TrainingReader)  # no epochs, no state


def test_the_trainer_reads_with_the_configs_options(tmp_path: Path) -> None:
    cfg = cfgmod.build(None, [f"data.path={tmp_path}", "run.seed=5", "data.window_samples=16",
                              "data.prefetch=0"])
    assert read_options(cfg, 4, 1, 2) == ReadOptions(batch_size=4, rank=1, world_size=2, seed=5,
                                                     window_samples=16, prefetch=0)
    image_file(tmp_path / "train.h5")
    reader = setup.training_reader(cfg, tmp_path / "train.h5", ["x", "y", "ids"], 4, 1, 2,
                                   torch.device("cpu"))
    assert isinstance(reader, FieldReader) and reader.window == 16 and reader.lead.seed == 5
