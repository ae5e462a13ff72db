"""The Criteo recipe under mpirun: the files of 1, 2 and 3 ranks alike and alike to those of
the code before streaming; bad lines named on every rank; a killed run resumed; nothing
replaced without --overwrite."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.prep.clicks import criteo_recipe as criteo_prep
from hpcdp.data.synth import criteo_logs as cs
from hpcdp.runtime.launcher import kill_group, kill_tree, launch_command, rank_environment

pytestmark = pytest.mark.parallel

SCRIPT = [sys.executable, str(Path(__file__).resolve().parents[2] / "datasets" / "criteo.py")]
RSS_WORKER = "criteo_rss"
#: What the recipe wrote for `logs(seed=7)` before it streamed (one rank, the whole share in
#: memory, the vocabulary all-gathered): the ids must not change.
BEFORE = {"--min-count": {"train": "398031da1daa8b0a8f35", "val": "10e683bcc0745b041247"},
          "--buckets": {"train": "ef608f27bc75c2493187", "val": "7dcb16ce39c373bd51de"}}
RULES = {"--min-count": ["--min-count", "3"], "--buckets": ["--buckets", "1000"]}


def line(rng: np.random.Generator) -> bytes:
    counts = ["" if rng.random() < 0.1 else str(int(rng.integers(-1, 40))) for _ in range(13)]
    cats = ["" if rng.random() < 0.1 else f"{int(rng.zipf(1.5)) % 500 * 2654435761 % 2**32:08x}"
            for _ in range(26)]
    return "\t".join([str(int(rng.random() < 0.25)), *counts, *cats]).encode()


def logs(root: Path, seed: int = 3) -> list[str]:
    """Two plain training files (split between the ranks by bytes), a gzipped one, a val file."""
    root.mkdir()
    rng = np.random.default_rng(seed)
    for name, rows in (("day_0.txt", 700), ("day_1.gz", 300), ("day_2.txt", 500),
                       ("val.txt", 400)):
        data = b"\n".join(line(rng) for _ in range(rows)) + b"\n"
        (root / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return ["--files", str(root / "day_*"), "--val-files", str(root / "val.txt")]


def digest(path: Path) -> dict[str, str]:
    with h5py.File(path) as f:
        out = {k: hashlib.sha256(f[k][...].tobytes()).hexdigest() for k in f}
        out.update({f"attr {k}": str(v) for k, v in f.attrs.items()})
        out.update({f"chunks {k}": str(f[k].chunks) for k in f})
    return out


def ids_digest(path: Path) -> str:
    """The rows, chunks and counts of a file (not its paths): what BEFORE pins."""
    h = hashlib.sha256()
    with h5py.File(path) as f:
        for k in ("dense", "sparse", "label"):
            h.update(f[k][...].tobytes())
            h.update(str(f[k].chunks).encode())
        for k in ("table_sizes", "num_samples", "click_rate", "skipped_rows"):
            value = f.attrs[k]
            h.update(str(value.tolist() if hasattr(value, "tolist") else value).encode())
    return h.hexdigest()[:20]


@pytest.mark.parametrize("rule", list(RULES))
def test_one_two_and_three_ranks_write_what_the_code_before_wrote(ranks, tmp_path: Path,
                                                                  rule: str) -> None:
    args = [*logs(tmp_path / "logs", seed=7), *RULES[rule]]
    assert criteo_prep.main([*args, "--out", str(tmp_path / "one")]) == 0
    for np_ in (2, 3):  # small blocks: several rounds, some ranks idle in the last
        out = tmp_path / f"np{np_}"
        run = ranks(SCRIPT, *args, "--out", str(out), "--block-mib", "0.01", np=np_,
                    timeout=120)
        assert f"on {np_} rank(s)" in run.output and not (out / ".hpcdp-prep").exists()
        for split in ("train", "val"):
            assert digest(tmp_path / "one" / f"{split}.h5") == digest(out / f"{split}.h5")
    for split in ("train", "val"):
        assert ids_digest(tmp_path / "one" / f"{split}.h5") == BEFORE[rule][split], split
    with h5py.File(tmp_path / "np3" / "train.h5") as f:
        assert f.attrs["num_samples"] == 1500
        if rule == "--min-count":  # a vocabulary counted over every rank's rows
            sizes = f.attrs["table_sizes"]
            assert sizes.min() > 2 and sizes.max() < 500


def test_the_first_bad_line_is_named_on_every_rank_and_nothing_replaced(ranks,
                                                                        tmp_path: Path) -> None:
    args = [*logs(tmp_path / "logs"), "--buckets", "50", "--block-mib", "0.02"]
    out = tmp_path / "out"
    day0, bad = tmp_path / "logs" / "day_0.txt", tmp_path / "logs" / "day_2.txt"
    good0 = day0.read_bytes()
    for path, at in ((day0, 649), (bad, 4)):  # in rank 0's last blocks, rank 1's first ones
        lines = path.read_bytes().split(b"\n")
        lines[at] = lines[at].replace(b"\t", b" ", 1)
        path.write_bytes(b"\n".join(lines))
    run = ranks(SCRIPT, *args, "--out", str(out), np=2, timeout=90, expect_ok=False)
    assert not run.timed_out and run.returncode == 2, run.describe()
    for rank in (0, 1):  # the first in file order, though rank 1 met its own first
        assert (f"[rank {rank}] datasets/criteo.py: error: {day0}: line 650: 39 tab-separated "
                "fields, expected 40") in run.output, run.describe()
    assert not out.exists() or not list(out.iterdir())
    day0.write_bytes(good0)
    run = ranks(SCRIPT, *args, "--out", str(out), np=2, timeout=90, expect_ok=False)
    problem = f"{bad}: line 5: 39 tab-separated fields, expected 40"
    for rank in (0, 1):
        assert f"[rank {rank}] datasets/criteo.py: error: {problem}" in run.output, run.describe()
    run = ranks(SCRIPT, *args, "--out", str(out), "--skip-bad", np=2, timeout=90)
    assert "1 bad lines skipped" in run.output
    before = (out / "train.h5").read_bytes()
    run = ranks(SCRIPT, *args, "--out", str(out), "--skip-bad", "--buckets", "60", np=2,
                timeout=90, expect_ok=False)
    assert run.returncode == 2 and run.output.count("exists; pass --overwrite") == 2
    assert (out / "train.h5").read_bytes() == before


def parts_saved(out: Path, split: str | None = None) -> int:
    """Parts in the work folder (of one split's folder, or of all)."""
    work = out / ".hpcdp-prep"
    folders = [work / split] if split else (list(work.iterdir()) if work.exists() else [])
    return sum(len(os.listdir(d)) for d in folders if d.is_dir())


def kill_midway(argv: list[str], out: Path, parts: int, split: str | None, np_: int = 2
                ) -> None:
    """Start `argv` on `np_` ranks and SIGKILL the launcher and its ranks (as a time limit
    does) once `parts` parts (of `split`) are saved; fail if it finished first."""
    proc = subprocess.Popen(launch_command(argv, np=np_), env=rank_environment(np=np_),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while (parts_saved(out, split) < parts and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.005)
        assert proc.poll() is None, "the run ended before it could be killed"
        kill_tree(proc.pid)
        proc.wait(timeout=30)
    finally:
        kill_group(proc.pid, grace=0.0)


#: Where each test kills the run, and on how many ranks it resumes: with hashed ids while the
#: blocks are parsed, on 3 ranks; with a vocabulary once it is counted and the ids are being
#: asked (the parts with ids in "train"), on 2 ranks again, so the saved shards are used.
KILL_AT = {"--buckets": (40, None, 3), "--min-count": (4, "train", 2)}


@pytest.mark.parametrize("rule", list(RULES))
def test_a_killed_run_resumes_to_the_same_files(ranks, tmp_path: Path, capsys,
                                                rule: str) -> None:
    args = [*logs(tmp_path / "logs"), *RULES[rule]]
    assert criteo_prep.main([*args, "--out", str(tmp_path / "whole")]) == 0
    args += ["--block-mib", "0.004"]  # many blocks, to be killed among them
    out = tmp_path / "out"
    parts, split, resume_np = KILL_AT[rule]
    kill_midway([*SCRIPT, *args, "--out", str(out)], out, parts, split)
    assert not (out / "train.h5").exists() and parts_saved(out, split) >= parts
    assert criteo_prep.main([*args, "--out", str(out)]) == 2  # a partial output: refused
    assert "pass --resume to continue it" in capsys.readouterr().err
    ranks(SCRIPT, *args, "--out", str(out), "--resume", np=resume_np, timeout=120)
    assert not (out / ".hpcdp-prep").exists()
    for split_file in ("train.h5", "val.h5"):
        assert digest(tmp_path / "whole" / split_file) == digest(out / split_file), split_file


#: Small vocabularies, so that what grows with the rows is what the recipe holds of them.
SMALL_FIELDS = tuple(min(c, 5_000) for c in cs.TERABYTE_LIKE)


@pytest.mark.parametrize("rule", list(RULES))
def test_peak_memory_does_not_grow_with_the_rows(ranks, tmp_path: Path, rule: str) -> None:
    """8x the rows: each rank's peak grows by far less than the rows it held before streaming
    (about 740 bytes a row), and stays within 1.25x."""
    spec = cs.ScaleSpec(cardinalities=SMALL_FIELDS)
    peaks = {}
    for rows in (20_000, 160_000):
        logs = tmp_path / f"logs{rows}"
        logs.mkdir()
        cs.write_scale(spec, "train", rows, [str(logs / "day_0.txt")])
        cs.write_scale(spec, "val", 1000, [str(logs / "val.txt")])
        run = ranks(RSS_WORKER, "--files", str(logs / "day_0.txt"), "--val-files",
                    str(logs / "val.txt"), *RULES[rule], "--block-mib", "1", "--out",
                    str(tmp_path / f"out{rows}"), np=2, timeout=120)
        peaks[rows] = [int(kib) / 1024 for kib in re.findall(r"maxrss_kib (\d+)", run.output)]
        assert len(peaks[rows]) == 2, run.describe()
    held_before = 740 * 140_000 / 2 / 2**20  # MiB a rank held more at 8x, before streaming
    for small, big in zip(peaks[20_000], peaks[160_000]):
        assert big - small < held_before / 4 and big < 1.25 * small, peaks
