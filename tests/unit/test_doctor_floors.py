"""hpcdp doctor names a torch or Pillow below the floors hpcdp's guarantees need, and the gzip
reader preparation uses."""

from __future__ import annotations

import pytest

from hpcdp import doctor
from hpcdp.doctor import FAIL, OK, floor_check, version_tuple


@pytest.mark.parametrize(("text", "parsed"), [
    ("2.13.0+cpu", (2, 13, 0)), ("2.6.0", (2, 6, 0)), ("2.5.1+cu124", (2, 5, 1)),
    ("12.3.0", (12, 3, 0)), ("2.6.0rc1", (2, 6, 0)), ("2.7.0a0+git1234", (2, 7, 0)),
    ("12.2", (12, 2)),
])
def test_versions_are_read_by_their_leading_numbers(text, parsed) -> None:
    assert version_tuple(text) == parsed


@pytest.mark.parametrize(("name", "version", "status"), [
    ("pytorch", "2.5.1+cu124", FAIL), ("pytorch", "2.6.0", OK), ("pytorch", "2.13.0+cpu", OK),
    ("pytorch", "2.1.0", FAIL), ("pillow", "10.0.0", FAIL), ("pillow", "12.2.0", FAIL),
    ("pillow", "12.3.0", OK), ("pillow", "13.0.0", OK),
])
def test_a_version_below_its_floor_fails_naming_why(name, version, status) -> None:
    check = floor_check(name, version, version)
    assert check.status == status
    if status == FAIL:
        assert version in check.detail and ">=" in check.detail
        assert ("CVE-2025-32434" if name == "pytorch" else "decoder") in check.detail


def test_the_gzip_reader_in_use_is_named_and_zlib_is_a_warning(monkeypatch) -> None:
    from hpcdp.data.prep import inflate

    monkeypatch.setattr(inflate, "LIBRARY", "isal 1.9.1 (ISA-L)")
    assert doctor.check_inflate()[0].status == doctor.OK
    monkeypatch.setattr(inflate, "LIBRARY", "zlib 1.3 (standard library)")
    (check,) = doctor.check_inflate()
    assert check.status == doctor.WARN and "pip install isal" in check.detail
