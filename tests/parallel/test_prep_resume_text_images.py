"""Text and image preparation on 2 ranks killed half way (SIGKILL to the launcher and its
ranks, as a time limit does) and run again with --resume: the files of an uninterrupted run."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from h5_files import assert_same_h5

from hpcdp.data.prep.images import recipe as images
from hpcdp.data.prep.text import recipe as text
from hpcdp.data.synth import corpus as corpus_synth
from hpcdp.runtime.launcher import kill_tree, launch_command, rank_environment

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]
TEXT = [sys.executable, str(REPO / "datasets" / "text.py")]
IMAGES = [sys.executable, str(REPO / "datasets" / "images.py")]
WORK = ".hpcdp-prep"


def saved_parts(work: Path, skip: str | None = None) -> int:
    """Parts saved so far: folders holding .npy files under their final name, outside
    split folders ending in `skip`. A part being written sits in a hidden temporary folder
    that a kill leaves unfinished; counting it would expect more blocks back than saved."""
    return sum(1 for folder, _, files in os.walk(work)
               if not os.path.basename(folder).startswith(".")
               and not (skip and os.path.basename(os.path.dirname(folder)).endswith(skip))
               and any(f.endswith(".npy") for f in files))


def kill_half_way(argv: list[str], out: Path, parts: int, timeout: float = 90,
                  skip: str | None = None) -> int:
    """Start `argv` on 2 ranks; SIGKILL every process of the run once `parts` parts are
    saved (those of splits ending in `skip` not counted); the parts saved then."""
    proc = subprocess.Popen(launch_command(argv, np=2), env=rank_environment(np=2),
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"the run ended (exit {proc.returncode}) before it was killed")
            if (out / WORK).is_dir() and (saved := saved_parts(out / WORK, skip)) >= parts:
                kill_tree(proc.pid)
                proc.wait()
                return saved
            time.sleep(0.005)
        pytest.fail("no blocks saved in time")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def resume_and_compare(ranks, main, argv: list[str], out: Path, whole: Path, saved: int,
                       capsys, parts_a_block: int = 1) -> None:
    """Without --resume the partial run is refused; with it, the files of the whole run,
    from at least the blocks saved before the kill (`saved` parts, `parts_a_block`
    each)."""
    assert not (out / "train.h5").exists() and (out / WORK).is_dir()
    assert main(argv[2:]) != 0
    assert "--resume" in capsys.readouterr().err
    run = ranks(argv + ["--resume"], np=2, timeout=120)
    reused = re.findall(r": resuming: (\d+) of \d+ blocks already done", run.output)
    assert sum(map(int, reused)) >= saved // parts_a_block > 0, run.describe()
    for split in ("train.h5", "val.h5"):
        assert_same_h5(whole / split, out / split)
    assert not (out / WORK).exists()


def test_text_killed_half_way_resumes_to_the_assert_same_h5(ranks, tmp_path: Path, capsys):
    corpus_synth.make_corpus(str(tmp_path / "c"), 3 << 19, files=3)
    args = ["--files", str(tmp_path / "c" / "*.jsonl"), "--val-fraction", "0.1",
            "--block-mib", "0.01"]
    assert text.main([*args, "--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "out"
    argv = [*TEXT, *args, "--out", str(out)]
    saved = kill_half_way(argv, out, 20)
    assert 20 <= saved < 150  # blocks of 10 KiB: about 150 of them
    resume_and_compare(ranks, text.main, argv, out, tmp_path / "whole", saved, capsys,
                       parts_a_block=2)


def test_images_killed_half_way_resume_to_the_assert_same_h5(ranks, tmp_path: Path, capsys):
    spec = importlib.util.spec_from_file_location("make_image_folder",
                                                  REPO / "scripts" / "make_image_folder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.make_folder(str(tmp_path / "in"), 50, classes=3, extras=False)
    args = ["--root", str(tmp_path / "in"), "--size", "16", "--val-fraction", "0.2",
            "--block-mib", "0.002"]  # 2 images a block: 75 blocks
    assert images.main([*args, "--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "out"
    argv = [*IMAGES, *args, "--out", str(out)]
    saved = kill_half_way(argv, out, 5, skip=".stats")  # a block's image part is its last
    assert 5 <= saved < 75
    resume_and_compare(ranks, images.main, argv, out, tmp_path / "whole", saved, capsys)
