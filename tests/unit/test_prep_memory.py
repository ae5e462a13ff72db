"""A recipe's peak memory does not grow with its input: 8x the documents, about the same
peak RSS (small blocks, so that the input is many blocks at both sizes)."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tracemalloc
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


def gzipped_corpus(folder: Path, nbytes: int) -> str:
    """One gzipped JSON Lines file of about `nbytes` of documents: one block, however big."""
    from hpcdp.data.synth import corpus as corpus_synth

    (plain,) = corpus_synth.make_corpus(str(folder), nbytes, files=1)
    with open(plain, "rb") as src, gzip.open(f"{plain}.gz", "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(plain)
    return f"{plain}.gz"


def test_text_peak_memory_does_not_grow_with_a_gzipped_file(tmp_path: Path) -> None:
    """A gzipped file is one block; its tokens are appended to the part a batch at a time
    (holding them would add 2 bytes a token, about 48 MB more at 24 MB more documents,
    and as much again while they were joined)."""
    peaks = [peak_kib(["text", "--files", gzipped_corpus(tmp_path / f"c{mb}", mb << 20),
                       "--val-fraction", "0.01", "--out", str(tmp_path / f"out{mb}")])
             for mb in (8, 32)]
    assert peaks[1] - peaks[0] < 12 << 10, peaks


def test_the_bpe_sample_pass_holds_the_sample_not_the_file(tmp_path: Path) -> None:
    """Reading a gzipped file (one block) for the BPE sample keeps only the sampled
    documents: the traced peak stays far below the file's 16 MiB of documents."""
    from hpcdp.data.prep.text import corpus as tc
    from hpcdp.data.prep.text import passes
    from hpcdp.data.prep.world import SerialComm

    corpus = tc.Corpus([gzipped_corpus(tmp_path, 16 << 20)], lines=False)
    blocks = corpus.blocks(1 << 20)
    tracemalloc.start()
    try:
        sample, error = passes.sample_for_bpe(corpus, blocks, range(len(blocks)), 0.01,
                                              256 << 10, SerialComm())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert error is None and 128 << 10 < sum(map(len, sample)) <= 300 << 10
    assert peak < 8 << 20, peak  # a few MiB of reads, whatever the file's size
