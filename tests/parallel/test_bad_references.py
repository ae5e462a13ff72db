"""Bad references, one table: each is a clear error on every one of 2 ranks, exit status 2.

The table holds task references (task.name) and network builders (model.name =
package.module:callable or path/file.py:callable, hpcdp.models.named). A reference that
cannot be imported, names no attribute, or names something that is no Task (or no
callable) fails while the config is built; a builder (a task's or a network's) that raises
or returns no network fails when it is run once before Horovod starts
(hpcdp.train.model_check.check_user_builder). The table runs in one 2-rank launch whose
ranks each run `hpcdp train` in-process once per row, and Horovod is never imported (no
collective can have run). The sources are tests/user_tasks.py's, written into a temporary
folder outside the repository.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import user_tasks

pytestmark = pytest.mark.parallel

N_TRAIN, N_VAL = 64, 32
TRAIN = [sys.executable, "-m", "hpcdp.train"]
BOUND = 120.0

#: (what is wrong, the key, its value, the error after "<key>=<value>: ").
#: {dir} is the folder holding tests/user_tasks.py's BROKEN as broken.py,
#: FAILS_ON_IMPORT as failing.py and NETWORKS as nets.py.
TABLE = [
    ("a missing module", "task.name", "no_such_pkg.tasks:TASK",
     "module 'no_such_pkg.tasks' cannot be imported: ModuleNotFoundError: No module named "
     "'no_such_pkg'"),
    ("a missing file", "task.name", "{dir}/nope.py:TASK", "file {dir}/nope.py does not exist"),
    ("a module failing on import", "task.name", "{dir}/failing.py:TASK",
     "file {dir}/failing.py cannot be imported: ZeroDivisionError: division by zero"),
    ("a missing attribute", "task.name", "{dir}/broken.py:TASKK",
     "file {dir}/broken.py has no attribute 'TASKK' (did you mean 'TASK'?)"),
    ("an attribute that is no Task", "task.name", "{dir}/broken.py:build",
     "build in file {dir}/broken.py is a function, not a hpcdp.tasks.Task"),
    ("a builder that raises", "task.name", "{dir}/broken.py:RAISES",
     "its build_model failed for model 'digits_cnn': RuntimeError: my builder is out of order"),
    ("a builder returning no network", "task.name", "{dir}/broken.py:NOT_MODULE",
     "its build_model returned a dict, not a torch.nn.Module"),
    ("a network's missing module", "model.name", "no_such_pkg.nets:build",
     "module 'no_such_pkg.nets' cannot be imported: ModuleNotFoundError: No module named "
     "'no_such_pkg'"),
    ("a network's missing callable", "model.name", "{dir}/nets.py:biuld",
     "file {dir}/nets.py has no attribute 'biuld' (did you mean 'build'?)"),
    ("a network builder that raises", "model.name", "{dir}/nets.py:raising",
     "the builder raised RuntimeError: my network builder broke"),
    ("a network builder returning no network", "model.name", "{dir}/nets.py:not_a_module",
     "the builder returned a list, not a torch.nn.Module"),
]

@pytest.fixture
def folder(tmp_path: Path) -> Path:
    own = tmp_path / "own"
    user_tasks.write(own, "broken.py", user_tasks.BROKEN)
    user_tasks.write(own, "failing.py", user_tasks.FAILS_ON_IMPORT)
    user_tasks.write(own, "nets.py", user_tasks.NETWORKS)
    return own


def rows(folder: Path) -> list[tuple[str, str, str]]:
    """(what, the setting "key=value", the error) of each of the table's rows."""
    return [(what, f"{key}={ref.format(dir=folder)}", f"{key}={ref.format(dir=folder)!r}: "
             + message.format(dir=folder)) for what, key, ref, message in TABLE]


def test_a_bad_reference_fails_on_every_rank_before_horovod(ranks, data: Path, folder: Path,
                                                            tmp_path: Path) -> None:
    table = rows(folder)
    argvs = [[setting, f"data.path={data}", f"run.dir={tmp_path / 'run'}"]
             for _, setting, _ in table]
    out = tmp_path / "results"
    out.mkdir()
    worker = [sys.executable, str(Path(__file__).parent / "workers" / "bad_references.py")]
    ranks(worker, json.dumps(argvs), str(out), np=2, timeout=BOUND)
    for rank in (0, 1):
        results = json.loads((out / f"rank-{rank}.json").read_text())
        for (what, _, message), got in zip(table, results, strict=True):
            assert got["code"] == 2, (what, got)
            assert got["stderr"] == f"hpcdp train: error: {message}\n", (what, got)
            assert not got["horovod"], what
    assert not (tmp_path / "run").exists()
