"""Comparing prepared files: the one check that two HDF5 files hold the same data.

Imported by the multi-rank prep tests (tests/ is on sys.path through its conftest).
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np


def assert_same_h5(a: Path, b: Path) -> None:
    """Files `a` and `b` hold the same datasets (names, dtypes, chunks, values) and the
    same root attributes, each difference named."""
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert sorted(fa) == sorted(fb)
        for name in fa:
            assert (fa[name].dtype, fa[name].chunks) == (fb[name].dtype, fb[name].chunks), name
            np.testing.assert_array_equal(fa[name][()], fb[name][()], err_msg=name)
        assert sorted(fa.attrs) == sorted(fb.attrs)
        for key in fa.attrs:
            np.testing.assert_array_equal(fa.attrs[key], fb.attrs[key], err_msg=key)
