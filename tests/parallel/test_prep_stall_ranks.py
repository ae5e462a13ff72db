"""A preparation rank that stops making progress ends the job within its bound, naming
itself and where it stopped; the blocks saved are kept and --resume finishes the files."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from h5_files import assert_same_h5

from hpcdp.data.prep import stall
from hpcdp.data.prep.text import recipe as text
from hpcdp.data.synth import corpus as corpus_synth

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]

#: The text recipe, with rank 1 stuck before it tokenizes (a hung read, as far as its
#: progress shows) when HPCDP_TEST_STALL is set.
STALLING = """
import os, sys, time
from hpcdp.data.prep.text import passes, recipe
tokenize = passes.tokenize_blocks
def stuck(*args, **kwargs):
    if os.environ.get("OMPI_COMM_WORLD_RANK") == "1" and os.environ.get("HPCDP_TEST_STALL"):
        time.sleep(600)
    return tokenize(*args, **kwargs)
passes.tokenize_blocks = stuck
sys.exit(recipe.main(sys.argv[1:]))
"""


def test_a_stalled_rank_ends_the_job_named_and_resume_finishes(ranks, tmp_path: Path,
                                                                monkeypatch) -> None:
    corpus_synth.make_corpus(str(tmp_path / "c"), 1 << 20, files=2)
    args = ["--files", str(tmp_path / "c" / "*.jsonl"), "--block-mib", "0.05"]
    assert text.main([*args, "--out", str(tmp_path / "whole")]) == 0
    script = tmp_path / "stalling.py"
    script.write_text(STALLING)
    out = tmp_path / "out"
    command = [sys.executable, str(script), *args, "--out", str(out)]
    monkeypatch.setenv("HPCDP_TEST_STALL", "1")
    start = time.monotonic()
    run = ranks(command + ["--stall-timeout", "3"], np=2, timeout=90, expect_ok=False)
    took = time.monotonic() - start
    assert run.returncode == stall.EXIT_STALLED and took < 60, run.describe()
    assert "stall: rank 1 on " in run.output and "(--stall-timeout 3); its last: " \
        in run.output, run.describe()
    assert "in stuck" in run.output  # its stack: where it stopped
    assert "stall: rank 0" not in run.output  # rank 0 waited for it: no stall of its own
    assert (out / ".hpcdp-prep").is_dir() and not (out / "train.h5").exists()

    monkeypatch.delenv("HPCDP_TEST_STALL")
    ranks(command + ["--resume"], np=2, timeout=90)
    for split in ("train.h5", "val.h5"):
        assert_same_h5(tmp_path / "whole" / split, out / split)
