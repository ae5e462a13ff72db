"""A recipe's peak memory does not grow with its input: 8x the documents, about the same
peak RSS (small blocks, so that the input is many blocks at both sizes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

#: Runs the command line it is given as `hpcdp prep`, then prints its peak RSS in KiB.
PEAK = """
import resource, sys
from hpcdp.data.prep.cli import main
code = main(sys.argv[1:])
print("peak_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def peak_kib(args: list[str]) -> int:
    done = subprocess.run([sys.executable, "-c", PEAK, *args], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split("peak_kib")[-1])


@pytest.mark.slow
def test_markov_peak_memory_does_not_grow_with_the_corpus(tmp_path: Path) -> None:
    small, big = ([peak_kib(["markov", "--docs", str(docs), "--val-docs", "100",
                             "--block-mib", "0.1", "--out", str(tmp_path / str(docs))])
                   for docs in (10_000, 80_000)])
    # Holding the share (the drawn documents as int64 arrays) would add about 50 MB at 80k.
    assert big <= 1.25 * small, (small, big)
