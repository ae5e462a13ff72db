"""The streaming frame on several ranks: parts written per rank, one file in block order."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

pytestmark = pytest.mark.parallel

SIZES = "5,0,7,1,9"


def _file(path: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    with h5py.File(path) as f:
        return f["x"][:], f["y"][:], dict(f.attrs)


@pytest.mark.parametrize(("np_", "serial"), [(1, False), (2, False), (3, False), (8, False),
                                            (2, True)])
def test_parts_make_the_same_file_on_any_number_of_ranks(ranks, tmp_path: Path, np_: int,
                                                         serial: bool) -> None:
    out = tmp_path / "out"
    run = ranks("prep_parts", str(out), SIZES, *(["serial"] if serial else []), np=np_,
                timeout=60)
    assert [p.name for p in out.iterdir()] == ["train.h5"]  # parts and temporaries gone
    x, y, attrs = _file(out / "train.h5")
    want = np.concatenate([np.arange(10 * i, 10 * i + int(n))
                           for i, n in enumerate(SIZES.split(","))])
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(x, np.stack([want, -want], 1))
    assert attrs["num_samples"] == 22
    # rank 0 heard every rank's rows: the progress line counts all of them
    assert "train: 22/22 rows (100%)" in run.output, run.describe()
