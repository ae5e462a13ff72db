"""One supported PyTorch range: doctor's check, docs/install.md, pyproject.toml's floor and
the setup script's default and the Makefile's floor target all state hpcdp.doctor.TORCH_RANGE."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpcdp.doctor import FAIL, OK, TORCH_RANGE, WARN, torch_range_check

REPO = Path(__file__).resolve().parents[2]
LOW, HIGH = (".".join(map(str, v)) for v in TORCH_RANGE)


@pytest.mark.parametrize(("version", "status"), [
    ("2.5.1+cu124", FAIL), (f"{LOW}.0", OK), (f"{HIGH}.0+cpu", OK), (f"{HIGH}.7", OK),
    (f"{HIGH}.0rc1", OK), ("2.16.0", WARN), ("2.17.1+cu130", WARN), ("3.0.0", WARN),
])
def test_doctor_says_when_torch_is_outside_the_range(version, status) -> None:
    check = torch_range_check(version, version)
    assert check.status == status, check
    assert version in check.detail
    if status == WARN:
        assert f"{LOW} to {HIGH}.x" in check.detail and f"torch=={HIGH}.*" in check.detail


def test_docs_pyproject_and_setup_state_the_same_range() -> None:
    install = (REPO / "docs" / "install.md").read_text()
    assert f"**Supported range: PyTorch {LOW} to {HIGH}.x.**" in install
    assert f"`torch>={LOW}`" in install
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(rf'"torch>={re.escape(LOW)}"', pyproject), "pyproject.toml's torch floor"
    setup = (REPO / "scripts" / "setup-python.sh").read_text()
    default = re.search(r"TORCH_REQ=\$\{HPCDP_TORCH:-torch==([0-9.]+)\}", setup)
    assert default, "scripts/setup-python.sh names no default torch"
    installed = tuple(int(part) for part in default.group(1).split(".")[:2])
    low, high = (tuple(int(p) for p in v.split(".")) for v in (LOW, HIGH))
    assert low <= installed <= high, (
        f"make setup installs torch {default.group(1)}, outside the range {LOW} to {HIGH}")
    assert f"default `torch=={default.group(1)}`" in install


def test_the_floor_target_tests_the_floor() -> None:
    """`make test-torch-floor` installs the oldest release of the range, and docs/install.md
    names the target."""
    makefile = (REPO / "Makefile").read_text()
    floor = re.search(r"^TORCH_FLOOR := ([0-9.]+)$", makefile, re.MULTILINE)
    assert floor, "the Makefile names no TORCH_FLOOR"
    assert floor.group(1) == f"{LOW}.0", f"make test-torch-floor tests {floor.group(1)}"
    assert "HPCDP_TORCH=torch==$(TORCH_FLOOR)" in makefile
    assert "`make test-torch-floor`" in (REPO / "docs" / "install.md").read_text()
