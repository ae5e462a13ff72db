"""Resuming under a real launcher never runs a planted checkpoint's code, and refuses
checkpoints that others could have written, on every rank, before training starts."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat

pytestmark = pytest.mark.parallel

TRAIN = [sys.executable, "-m", "hpcdp.train"]
BOUND = 120.0


class Planted:
    """Pickles to a call of os.system: what a planted checkpoint would run when unpickled."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


def plant(path: Path, marker: Path) -> None:
    """An hpcdp header with a correct sha256 over a payload that would touch `marker`."""
    buf = io.BytesIO()
    torch.save({"step": 500, "model_name": "digits_cnn",
                "model": Planted(f"touch {shlex.quote(str(marker))}")}, buf)
    payload = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(ckformat.MAGIC + b"sha256 " + hashlib.sha256(payload).hexdigest().encode()
                     + b"\n" + payload)


@pytest.fixture
def data(make_data) -> Path:
    return make_data(480, 96)


RUN_SETTINGS = (  # after the args fixture's SMALL_RUN; a later value of a key wins
    "checkpoint.every_steps=0", "run.epochs=1",
)


_TAGGED = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:((?:(?!\[\d+,\d+\]<std).)*)", re.S)


def refused(ranks, argv: list[str], np: int) -> str:
    """Run a job that must fail within the bound; its output."""
    run = ranks(argv, np=np, timeout=60.0, expect_ok=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    return run.output


def on_every_rank(output: str, np: int, needle: str) -> None:
    """Every rank reported `needle` (mpirun tags each rank's writes)."""
    saying = {int(r) for r, text in _TAGGED.findall(output) if needle in text}
    assert saying == set(range(np)), output


@pytest.mark.parametrize("np", [1, 2])
@pytest.mark.parametrize("resume", ["auto", "path"])
def test_planted_checkpoint_never_runs(args, ranks, data: Path, tmp_path: Path, np: int,
                                       resume: str) -> None:
    run, marker = tmp_path / "run", tmp_path / "marker"
    if resume == "auto":
        planted, extra = run / "checkpoints" / "step-00000500.pt", []
    else:
        planted = tmp_path / "shared" / "best.pt"
        extra = [f"checkpoint.resume={planted}"]
    plant(planted, marker)
    out = refused(ranks, [*TRAIN, *args(data, run, *extra)], np)
    assert not marker.exists(), "the planted checkpoint's code ran"
    on_every_rank(out, np, f"{planted}: refused: it holds a reference to posix.system")


def test_writable_checkpoints_are_refused_unless_overridden(args, ranks, data: Path,
                                                            tmp_path: Path) -> None:
    run = tmp_path / "run"
    ranks(TRAIN, *args(data, run, "run.stop_at_step=2"), np=1, timeout=BOUND)
    folder, path = run / "checkpoints", ckfolder.step_path(run / "checkpoints", 2)
    folder.chmod(0o777)
    out = refused(ranks, [*TRAIN, *args(data, run)], 2)
    on_every_rank(out, 2, f"checkpoint folder '{folder}' is writable by others (mode 0o777)")
    folder.chmod(0o755)
    path.chmod(0o666)
    out = refused(ranks, [*TRAIN, *args(data, run, f"checkpoint.resume={path}")], 2)
    on_every_rank(out, 2, f"checkpoint '{path}' is writable by others (mode 0o666)")
    out = ranks(TRAIN, *args(data, run, "checkpoint.strict_permissions=false",
                             "run.stop_at_step=3"), np=1, timeout=BOUND).output
    assert "resuming anyway: checkpoint.strict_permissions=false" in out
    assert f"resumed from {path}" in out
