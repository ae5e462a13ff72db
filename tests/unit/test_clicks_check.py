"""Bad click files: each problem named with the file, the field and the rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.format import clicks as cc
from hpcdp.data.prep.clicks import recipe as clicks_prep
from hpcdp.data.read.samples import ReaderError

ARGS = ["--rows", "3000", "--val-rows", "0", "--users", "50", "--items", "40",
        "--max-table", "500", "--seed", "2"]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("clicks")
    assert clicks_prep.main(["--out", str(out), *ARGS]) == 0
    return out / "train.h5"


@pytest.fixture
def copy(good: Path, tmp_path: Path) -> Path:
    path = tmp_path / "bad.h5"
    shutil.copy(good, path)
    return path


def test_a_good_file_passes_and_gives_its_schema(good: Path) -> None:
    schema = cc.validate_click_file(good)
    assert schema.num_samples == 3000 and schema.dense_features == 13
    assert schema.table_sizes[:2] == (50, 40) and schema.num_fields == 26
    assert schema.field_names[:2] == ("user", "item")


@pytest.mark.parametrize(("row", "col", "value", "words"), [
    (2100, 1, 40, ["field 'item'", "id 40 is outside its table of 40 rows", "row 2100"]),
    (17, 5, -1, ["field 'item_side_3'", "id -1 is negative", "row 17"]),
])
def test_an_id_outside_its_table(copy: Path, row: int, col: int, value: int,
                                 words: list[str]) -> None:
    with h5py.File(copy, "r+") as f:
        f["sparse"][row, col] = value
    with pytest.raises(ReaderError) as err:
        cc.validate_click_file(copy)
    msg = str(err.value)
    for w in [*words, str(copy), "in rows ["]:
        assert w in msg, msg


def test_a_label_not_0_or_1(copy: Path) -> None:
    with h5py.File(copy, "r+") as f:
        f["label"][2999] = 2
    with pytest.raises(ReaderError, match=r"field 'label': 2 is not 0 or 1, in rows \[\d+, 3000\) "
                                          r".*bad.h5 \(first at row 2999\)"):
        cc.validate_click_file(copy)


def test_a_non_finite_dense_value(copy: Path) -> None:
    with h5py.File(copy, "r+") as f:
        f["dense"][5, 3] = np.nan
    with pytest.raises(ReaderError, match=r"field 'dense' \(feature 3\): nan .*row 5\)"):
        cc.validate_click_file(copy)


def test_a_missing_field_and_a_missing_attribute(copy: Path) -> None:
    with h5py.File(copy, "r+") as f:
        del f["label"]
    with pytest.raises(ReaderError, match=r"bad.h5: no data dataset 'label' \(the file holds: "
                                          r"dense, sparse\)"):
        cc.read_schema(copy)


def test_no_table_sizes(copy: Path) -> None:
    with h5py.File(copy, "r+") as f:
        del f.attrs["table_sizes"]
    with pytest.raises(ReaderError, match="no attribute 'table_sizes'"):
        cc.read_schema(copy)


def test_tables_and_columns_disagree(copy: Path) -> None:
    with h5py.File(copy, "r+") as f:
        f.attrs["table_sizes"] = np.arange(1, 26)
    with pytest.raises(ReaderError, match=r"'sparse' must be \(rows, 25\) integer ids"):
        cc.read_schema(copy)


def test_only_the_asked_rows_are_checked(copy: Path) -> None:
    with h5py.File(copy, "r+") as f:
        f["sparse"][2500, 0] = 10**6
    schema = cc.read_schema(copy)
    cc.check_rows(schema, 0, 2400)  # the bad row lies outside: passes
    with pytest.raises(ReaderError, match="row 2500"):
        cc.check_rows(schema, 2400, 3000)
