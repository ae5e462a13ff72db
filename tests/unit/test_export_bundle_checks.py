"""What an export folder's files must be before anything in them is used."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hpcdp.export import bundle
from hpcdp.export.generate import option_problem
from hpcdp.export.load import load
from hpcdp.export.sample import pick
from hpcdp.models import spec as specs

SPEC = {"name": "dlrm", "dense_features": 2, "table_sizes": [3, 4], "embed_dim": 2,
        "bottom": [4], "top": [4]}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return bundle.write(tmp_path / "e", specs.own_tensors(specs.build(SPEC)),
                        {"task": "recsys", "model": SPEC, "input": {}})


def edit(folder: Path, key: str, **values) -> Path:
    config = json.loads((folder / bundle.CONFIG).read_text())
    config.setdefault(key, {}).update(values)
    (folder / bundle.CONFIG).write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("name", ["/etc/passwd", "../model.safetensors", "..", ".", "",
                                  "sub/model.safetensors", "a\\b", "x\0y", 5, None])
@pytest.mark.parametrize("key", ["weights", "tokenizer"])
def test_file_names_must_be_plain_names_in_the_folder(folder: Path, key: str, name) -> None:
    edit(folder, key, file=name, sha256="0" * 64)
    with pytest.raises(bundle.ExportError, match=rf"config\.json: {key}\.file .* not a plain"):
        bundle.read_config(folder)


def test_weights_must_record_their_size_and_hash(folder: Path) -> None:
    edit(folder, "weights", bytes="12")
    with pytest.raises(bundle.ExportError, match=r"weights\.bytes '12' is not a byte count"):
        bundle.read_config(folder)


def test_a_linked_weights_file_is_refused(folder: Path, tmp_path: Path) -> None:
    real = tmp_path / "real.safetensors"
    (folder / bundle.WEIGHTS).rename(real)
    (folder / bundle.WEIGHTS).symlink_to(real)
    with pytest.raises(bundle.ExportError, match=r"model\.safetensors: a symbolic link"):
        load(folder)


def test_a_huge_config_is_refused_unread(folder: Path) -> None:
    with open(folder / bundle.CONFIG, "r+b") as f:
        f.truncate(bundle.MAX_CONFIG_BYTES + 1)
    with pytest.raises(bundle.ExportError, match=r"config\.json: \d+ bytes, over the"):
        bundle.read_config(folder)


def test_a_table_larger_than_its_weights_is_refused_before_building(folder: Path) -> None:
    edit(folder, "model", table_sizes=[3, 10**13])
    with pytest.raises(bundle.ExportError, match=r"embeddings\.1\.weight is F32 \[4, 2\] there, "
                                                 r"but the model needs F32 \[10000000000000, 2\]"):
        load(folder)
    edit(folder, "model", table_sizes=[3] * 1000)  # more tables than the file has tensors
    with pytest.raises(bundle.ExportError, match="more parts than the weights' .* tensors"):
        load(folder)
    edit(folder, "model", table_sizes=[3, -4])
    with pytest.raises(bundle.ExportError, match=r"config\.json: its model .* cannot be built"):
        load(folder)


def test_a_header_whose_byte_ranges_do_not_fit_is_refused(folder: Path) -> None:
    path = folder / bundle.WEIGHTS
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    key = next(k for k in header if k != "__metadata__")
    header[key]["shape"] = [9]  # was [4]: as long in JSON, more bytes than its range
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(raw) == n
    path.write_bytes(bytes(data[:8]) + raw + bytes(data[8 + n :]))
    with pytest.raises(bundle.ExportError, match="not a readable safetensors file: bad header"):
        bundle.read_header(path)


@pytest.mark.parametrize("t", [math.nan, math.inf, -math.inf, -0.5])
def test_temperatures_that_are_not_finite_and_non_negative_are_refused(t: float) -> None:
    assert "--temperature" in option_problem(t, 10, 0)
    with pytest.raises(ValueError, match="finite number >= 0"):
        pick(torch.zeros(4), t, 0, torch.Generator())


def test_counts_below_zero_are_refused() -> None:
    assert option_problem(0.0, 0, 0) is None and option_problem(0.8, 5, 40) is None
    assert "--tokens -1" in option_problem(1.0, -1, 0)
    assert "--top-k -2" in option_problem(1.0, 1, -2)
