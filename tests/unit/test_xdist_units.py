"""make test's pytest-xdist scheduler (tests/conftest.py): every Slurm test in one work
unit, so one worker and one local cluster run them all; every other test on its own."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent


def suite_conftest():
    spec = importlib.util.spec_from_file_location("suite_conftest", TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TwoWorkers:
    """This session's config as make test's controller sees it: two local workers."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config

    def getvalue(self, name: str) -> object:
        return ["2*popen"] if name == "tx" else self._config.getvalue(name)

    def __getattr__(self, name: str) -> object:
        return getattr(self._config, name)


def test_every_slurm_test_shares_one_unit_and_no_other_test_joins_it(
        pytestconfig: pytest.Config) -> None:
    pytest.importorskip("xdist")
    scheduler = suite_conftest().pytest_xdist_make_scheduler(TwoWorkers(pytestconfig), None)
    slurm_ids = [f"tests/slurm/{f.name}::test_x" for f in (TESTS / "slurm").glob("test_*.py")]
    assert len(slurm_ids) >= 5
    assert {scheduler._split_scope(i) for i in slurm_ids} == {"slurm"}
    others = ["tests/unit/test_config.py::test_x", "tests/parallel/test_slurmish.py::test_y",
              "tests/unit/test_slurm_render.py::test_z"]
    assert [scheduler._split_scope(i) for i in others] == others
