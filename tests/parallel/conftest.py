"""Small training data for the multi-rank training and fault tests, written with plain h5py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest


def write_split(path: Path, n: int, seed: int) -> None:
    """Unique 8x8 uint8 samples (the index sits in two pixels), learnable 4-class labels."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 1, 8, 8), dtype=np.uint8)
    x[:, 0, 0, 0] = np.arange(n) % 256
    x[:, 0, 0, 1] = np.arange(n) // 256
    y = (x[:, 0, 4, 4] // 128 + 2 * (x[:, 0, 3, 3] // 128)).astype(np.int64)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(32, 1, 8, 8))
        f.create_dataset("y", data=y, chunks=(32,))


@pytest.fixture
def make_data(tmp_path: Path) -> Callable[[int, int], Path]:
    """A function writing train.h5 (n_train samples) and val.h5 (n_val) into tmp/data."""

    def _make(n_train: int, n_val: int) -> Path:
        d = tmp_path / "data"
        d.mkdir()
        write_split(d / "train.h5", n_train, 1)
        write_split(d / "val.h5", n_val, 2)
        return d

    return _make


@pytest.fixture
def data(request: pytest.FixtureRequest, make_data: Callable[[int, int], Path]) -> Path:
    """The data folder of a module that sets N_TRAIN and N_VAL (write_split's samples)."""
    return make_data(request.module.N_TRAIN, request.module.N_VAL)


@pytest.fixture(scope="module")
def module_data(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`data` shared by a module's tests (and its module-scoped runs): read, never changed."""
    d = tmp_path_factory.mktemp("data")
    write_split(d / "train.h5", request.module.N_TRAIN, 1)
    write_split(d / "val.h5", request.module.N_VAL, 2)
    return d


#: What every small training run of these tests starts from (a module's RUN_SETTINGS
#: and a test's own overrides come after it, and a later value of a key wins).
SMALL_RUN = ("data.batch_size=16", "data.val_batch_size=16", "log.tensorboard=false")


@pytest.fixture
def args(request: pytest.FixtureRequest) -> Callable[..., list[str]]:
    """`args(data, run, *extra)`: the overrides of one small training run.

    The data and run folders, SMALL_RUN, the test module's RUN_SETTINGS (its epochs,
    logging, checkpoints...), then `extra`. A module with RUN_COMMAND gets the whole
    command line (that command first).
    """
    command = list(getattr(request.module, "RUN_COMMAND", ()))
    settings = tuple(request.module.RUN_SETTINGS)

    def make(data: Path, run: Path, *extra: str) -> list[str]:
        return [*command, f"data.path={data}", f"run.dir={run}", *SMALL_RUN, *settings,
                *extra]

    return make
