"""Bad references, one table: each is a clear error on every one of 2 ranks, exit status 2.

The table holds task references (task.name) and network builders (model.name =
package.module:callable or path/file.py:callable, hpcdp.models.named). A reference that
cannot be imported, names no attribute, or names something that is no Task (or no
callable) fails while the config is built: the rows marked "config" run in one 2-rank launch
whose ranks each run `hpcdp train` in-process once per row, and Horovod is never imported
(no collective can have run). A builder (a task's or a network's) that raises or returns
no network fails at set-up, where every rank's errors are agreed on before training's
first collective (hpcdp.agree.setup): those rows are launches of their own. The sources are
tests/user_tasks.py's, written into a temporary folder outside the repository.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import user_tasks

pytestmark = pytest.mark.parallel

N_TRAIN, N_VAL = 64, 32
TRAIN = [sys.executable, "-m", "hpcdp.train"]
BOUND = 120.0

#: (what is wrong, the key, its value, the error after "<key>=<value>: ", where it fails).
#: {dir} is the folder holding tests/user_tasks.py's BROKEN as broken.py,
#: FAILS_ON_IMPORT as failing.py and NETWORKS as nets.py.
TABLE = [
    ("a missing module", "task.name", "no_such_pkg.tasks:TASK",
     "module 'no_such_pkg.tasks' cannot be imported: ModuleNotFoundError: No module named "
     "'no_such_pkg'", "config"),
    ("a missing file", "task.name", "{dir}/nope.py:TASK", "file {dir}/nope.py does not exist",
     "config"),
    ("a module failing on import", "task.name", "{dir}/failing.py:TASK",
     "file {dir}/failing.py cannot be imported: ZeroDivisionError: division by zero", "config"),
    ("a missing attribute", "task.name", "{dir}/broken.py:TASKK",
     "file {dir}/broken.py has no attribute 'TASKK' (did you mean 'TASK'?)", "config"),
    ("an attribute that is no Task", "task.name", "{dir}/broken.py:build",
     "build in file {dir}/broken.py is a function, not a hpcdp.tasks.Task", "config"),
    ("a builder that raises", "task.name", "{dir}/broken.py:RAISES",
     "its build_model failed for model 'digits_cnn': RuntimeError: my builder is out of order",
     "setup"),
    ("a builder returning no network", "task.name", "{dir}/broken.py:NOT_MODULE",
     "its build_model returned a dict, not a torch.nn.Module", "setup"),
    ("a network's missing module", "model.name", "no_such_pkg.nets:build",
     "module 'no_such_pkg.nets' cannot be imported: ModuleNotFoundError: No module named "
     "'no_such_pkg'", "config"),
    ("a network's missing callable", "model.name", "{dir}/nets.py:biuld",
     "file {dir}/nets.py has no attribute 'biuld' (did you mean 'build'?)", "config"),
    ("a network builder that raises", "model.name", "{dir}/nets.py:raising",
     "the builder raised RuntimeError: my network builder broke", "setup"),
    ("a network builder returning no network", "model.name", "{dir}/nets.py:not_a_module",
     "the builder returned a list, not a torch.nn.Module", "setup"),
]

# mpirun --tag-output prefixes what each rank writes; split the output at the tags.
_TAGGED = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:((?:(?!\[\d+,\d+\]<std).)*)", re.S)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    own = tmp_path / "own"
    user_tasks.write(own, "broken.py", user_tasks.BROKEN)
    user_tasks.write(own, "failing.py", user_tasks.FAILS_ON_IMPORT)
    user_tasks.write(own, "nets.py", user_tasks.NETWORKS)
    return own


def rows(stage: str, folder: Path) -> list[tuple[str, str, str]]:
    """(what, the setting "key=value", the error) of the table's rows failing at `stage`."""
    return [(what, f"{key}={ref.format(dir=folder)}", f"{key}={ref.format(dir=folder)!r}: "
             + message.format(dir=folder)) for what, key, ref, message, at in TABLE
            if at == stage]


def test_a_bad_reference_fails_on_every_rank_before_horovod(ranks, data: Path, folder: Path,
                                                            tmp_path: Path) -> None:
    table = rows("config", folder)
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


@pytest.mark.parametrize(("what", "index"), [(row[0], i) for i, row in enumerate(TABLE)
                                             if row[4] == "setup"])
def test_a_bad_builder_fails_on_every_rank_at_set_up(ranks, data: Path, folder: Path,
                                                     tmp_path: Path, what: str,
                                                     index: int) -> None:
    (_, setting, message), = [r for r in rows("setup", folder) if r[0] == what]
    run = ranks(TRAIN, setting, f"data.path={data}", f"run.dir={tmp_path / 'run'}",
                "log.tensorboard=false", np=2, timeout=BOUND, expect_ok=False)
    assert not run.timed_out and run.returncode == 2, run.describe()
    saying = {int(r) for r, text in _TAGGED.findall(run.output) if message in text}
    assert saying == {0, 1}, run.output
