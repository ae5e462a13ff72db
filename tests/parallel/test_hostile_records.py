"""A record Python cannot hold as data, in one rank's share of a corpus, under mpirun: every
rank names its file and line and all stop together, not an MPI abort mid-write."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.parallel

TEXT = [sys.executable, str(Path(__file__).resolve().parents[2] / "datasets" / "text.py")]


def test_a_record_past_pythons_limits_is_named_on_every_rank(ranks, tmp_path: Path) -> None:
    lines = [json.dumps({"text": f"document {i}"}).encode() for i in range(40)]
    lines[30] = b'{"text": "x", "n": ' + b"9" * 5000 + b"}"  # in the second rank's bytes
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out"
    run = ranks(TEXT, "--files", str(corpus), "--out", str(out), np=2, timeout=90,
                expect_ok=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    assert "error while writing" not in run.output, run.describe()
    problem = f"{corpus}: line 31: cannot be read as data: a number of more than 4300 digits"
    for rank in (0, 1):
        assert f"[rank {rank}] datasets/text.py: error: {problem}" in run.output, run.describe()
    assert not out.exists() or not any(out.iterdir())
