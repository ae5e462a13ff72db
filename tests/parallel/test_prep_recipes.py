"""The frame's recipes on several ranks: the files of one rank on 3 and 8 ranks, and after a
kill mid-way (SIGKILL to the launcher and its ranks, as a time limit does) and --resume."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from h5_files import assert_same_h5

from hpcdp.data.prep import cli as prep
from hpcdp.runtime.launcher import kill_group, kill_tree, launch_command, rank_environment

pytestmark = pytest.mark.parallel

PREP = [sys.executable, "-m", "hpcdp.data.prep.cli"]
RECIPES = {
    "synthetic": ["synthetic", "--samples", "6000", "--shape", "3,16,16", "--val-samples",
                  "3000", "--block-mib", "0.02"],
    "clicks": ["clicks", "--rows", "20000", "--val-rows", "2000", "--users", "50",
               "--items", "40", "--max-table", "500", "--block-mib", "0.02"],
}


def _parts(out: Path) -> int:
    folder = out / ".hpcdp-prep" / "train"
    return sum(1 for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else 0


def _temporary(out: Path) -> bool:
    return out.is_dir() and any(p.name.startswith(".train.h5.tmp-") for p in out.iterdir())


def kill_when(argv: list[str], ready, np_: int = 2, timeout: float = 120) -> str:
    """Start `argv` on `np_` ranks; SIGKILL the launcher's whole process group once
    ``ready()``; the output so far."""
    proc = subprocess.Popen(launch_command(argv, np=np_), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=rank_environment(np=np_),
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while not ready() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        # Slurm's time limit kills every process of the step at once: the launcher and
        # its ranks (which an mpirun may start outside its own process group).
        kill_tree(proc.pid)
        out, _ = proc.communicate(timeout=30)
    finally:
        kill_group(proc.pid, grace=0.0)
    assert proc.returncode == -signal.SIGKILL, f"finished before the kill:\n{out}"
    return out


def same_files(a: Path, b: Path) -> None:
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for path in a.glob("*.h5"):
        assert_same_h5(path, b / path.name)


@pytest.mark.parametrize(("recipe", "moment"), [("synthetic", "parts"), ("clicks", "parts"),
                                                ("synthetic", "file")])
def test_killed_then_resumed_writes_what_one_run_writes(ranks, tmp_path: Path, capsys,
                                                        recipe: str, moment: str) -> None:
    args, out = RECIPES[recipe], tmp_path / "out"
    assert prep.main([*args, "--out", str(tmp_path / "whole")]) == 0

    if moment == "parts":
        ready = lambda: _parts(out) >= 1  # noqa: E731
    else:  # while train.h5 is written, or once it is (val still to do)
        ready = lambda: _temporary(out) or (out / "train.h5").exists()  # noqa: E731
    kill_when([*PREP, *args, "--out", str(out)], ready)
    assert (out / ".hpcdp-prep").is_dir() and not (out / "val.h5").exists()
    killed_parts = _parts(out)

    assert prep.main([*args, "--out", str(out)]) == 2  # without --resume: refused, untouched
    assert "partial preparation is there" in capsys.readouterr().err
    assert _parts(out) == killed_parts

    resumed = ranks(PREP, *args, "--out", str(out), "--resume", np=2, timeout=120)
    assert f"train: resuming: {killed_parts} of " in resumed.output, resumed.describe()
    same_files(tmp_path / "whole", out)  # and no work folder, no temporary left


#: Small blocks, so that some ranks have several blocks and some none.
SMALL = {
    "synthetic": ["synthetic", "--samples", "700", "--shape", "5,3", "--dtype", "float32",
                  "--val-samples", "90", "--chunk-mib", "0.001", "--block-mib", "0.002"],
    "markov": ["markov", "--docs", "5000", "--val-docs", "1500", "--block-mib", "0.2"],
}


@pytest.mark.parametrize(("recipe", "np_"), [("synthetic", 3), ("synthetic", 8),
                                             ("markov", 3)])
def test_any_number_of_ranks_writes_what_one_writes(ranks, tmp_path: Path, recipe: str,
                                                    np_: int) -> None:
    args = SMALL[recipe]
    assert prep.main([*args, "--out", str(tmp_path / "one")]) == 0
    ranks(PREP, *args, "--out", str(tmp_path / "many"), np=np_, timeout=120)
    same_files(tmp_path / "one", tmp_path / "many")
