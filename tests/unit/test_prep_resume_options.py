"""Every recipe resumes a stalled run (exit 3) with a raised --stall-timeout, and refuses to
resume with an option that changes the bytes, or an input file changed since, naming it: a
resume is judged on what the output is made from, never on the command line as typed.

One process each: the stall is a real one (the recipe's own guard ends it), in a child
that sleeps in its second part's commit; the children of every recipe run at once (a
stall is mostly waiting for the bound), the resumes in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from h5_files import assert_same_h5
from PIL import Image
from test_cifar import cifar100_archives
from test_criteo import logs

from hpcdp.data.prep import cli as prep
from hpcdp.data.prep import stall
from hpcdp.data.synth import corpus as corpus_synth

#: All tests here share one set of stalled runs: on one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("prep-resume-options")

#: `hpcdp prep` with the second part's commit stuck (a hung write, as far as the recipe's
#: progress shows): the first part is saved, then the stall guard ends the run.
STALLING = """
import sys, time
from hpcdp.data.prep import cli, parts
commit, committed = parts.Parts._commit, []
def stuck(*args, **kwargs):
    if committed:
        time.sleep(600)
    commit(*args, **kwargs)
    committed.append(1)
parts.Parts._commit = stuck
sys.exit(cli.main(sys.argv[1:]))
"""
#: The stalled runs' bound: far above any block of these small inputs, even with nine
#: runs sharing the cores.
BOUND_S = "3"


@dataclass
class Case:
    args: list[str]
    changes: list[list[str]]  # each: options that change the bytes
    input_file: Path | None = None
    stalled: subprocess.CompletedProcess | None = field(default=None, repr=False)
    same: list[str] = field(default_factory=list)  # options that change no byte either


def _digits(d: Path) -> Case:
    return Case(["--chunk-mib", "0.001", "--block-mib", "0.002"], [["--seed", "1"]])


def _synthetic(d: Path) -> Case:
    return Case(["--samples", "400", "--shape", "4,4", "--val-samples", "50", "--chunk-mib",
                 "0.001", "--block-mib", "0.002"], [["--samples", "401"], ["--seed", "1"]],
                same=["--mpio", "collective", "--report", str(d / "report.json")])


def _arrays(d: Path) -> Case:
    rng = np.random.default_rng(0)
    np.savez(d / "xy.npz", x=rng.integers(0, 256, (300, 4, 4), dtype=np.uint8),
             z=rng.integers(0, 256, (300, 4, 4), dtype=np.uint8), y=np.arange(300) % 3)
    return Case(["--x", str(d / "xy.npz"), "--chunk-mib", "0.001", "--block-mib", "0.002"],
                [["--x-key", "z"]], d / "xy.npz")


def _npz(d: Path) -> Case:
    rng = np.random.default_rng(0)
    np.savez_compressed(d / "a.npz", x=rng.integers(0, 256, (200, 4, 4), dtype=np.uint8),
                        y=np.arange(200) % 3, z=np.arange(200) % 5)
    np.savez(d / "b.npz", x=rng.integers(0, 256, (100, 4, 4), dtype=np.uint8),
             y=np.arange(100) % 3, z=np.arange(100) % 5)
    return Case(["--files", str(d / "*.npz"), "--chunk-mib", "0.001", "--block-mib", "0.002"],
                [["--y-key", "z"]], d / "b.npz")


def _cifar(d: Path) -> Case:
    _, python = cifar100_archives(d)
    return Case(["--archive", str(python), "--block-mib", "0.02"], [["--labels", "coarse"]],
                python)


def _markov(d: Path) -> Case:
    return Case(["--docs", "2100", "--val-docs", "100", "--block-mib", "0.001"],
                [["--seed", "1"], ["--docs", "2200"]])


def _clicks(d: Path) -> Case:
    return Case(["--rows", "2000", "--val-rows", "200", "--users", "50", "--items", "40",
                 "--max-table", "500", "--block-mib", "0.01"], [["--seed", "1"]])


def _images(d: Path) -> Case:
    for label in ("cat", "dog"):
        (d / "photos" / label).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (9, 7), (i * 40, 0, 0)).save(d / "photos" / label / f"{i}.png")
    return Case(["--root", str(d / "photos"), "--size", "8", "--val-fraction", "0.3",
                 "--block-mib", "0.0001"], [["--size", "6"], ["--seed", "1"]],
                same=["--follow-symlinks"])


def _text(d: Path) -> Case:
    paths = corpus_synth.make_corpus(str(d / "c"), 1 << 16, files=2)
    return Case(["--files", str(d / "c" / "*.jsonl"), "--val-fraction", "0.1"],
                [["--val-fraction", "0.2"]], Path(paths[0]))


def _criteo(d: Path) -> Case:
    train, val = logs(d / "logs")
    return Case(["--files", *train, "--val-files", *val, "--buckets", "9", "--block-mib",
                 "0.005"], [["--buckets", "10"]], Path(val[0]))


#: Each recipe's small input (at least two parts), options that change its bytes, and an
#: input file whose change must refuse the resume.
RECIPES: dict[str, Callable[[Path], Case]] = {
    "arrays": _arrays, "digits": _digits, "cifar": _cifar, "synthetic": _synthetic,
    "markov": _markov, "clicks": _clicks, "images": _images, "text": _text, "criteo": _criteo,
    "npz": _npz,
}


def test_the_table_covers_every_recipe() -> None:
    assert sorted(RECIPES) == sorted(["arrays", "digits", "cifar", "synthetic", *prep.RECIPES])


def _saved_parts(work: Path) -> int:
    return sum(1 for folder, _, files in os.walk(work)
               if not os.path.basename(folder).startswith(".") and "meta.json" in files)


@pytest.fixture(scope="module")
def stalled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Case]]:
    """Every recipe's input and the run of it that stalled, in its own folder."""
    cases, children = {}, {}
    for recipe, make in RECIPES.items():
        root = tmp_path_factory.mktemp(recipe)
        (root / "in").mkdir()
        cases[recipe] = (root, make(root / "in"))
        argv = [recipe, *cases[recipe][1].args, "--out", str(root / "out"),
                "--stall-timeout", BOUND_S]
        children[recipe] = subprocess.Popen([sys.executable, "-c", STALLING, *argv],
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True)
    for recipe, child in children.items():
        try:
            out, err = child.communicate(timeout=120)
        finally:
            child.kill()
        cases[recipe][1].stalled = subprocess.CompletedProcess(child.args, child.returncode,
                                                               out, err)
    return cases


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_stalled_run_resumes_with_a_raised_stall_timeout_but_not_other_bytes(
        stalled, capsys, recipe: str) -> None:
    root, case = stalled[recipe]
    done = case.stalled
    assert done.returncode == stall.EXIT_STALLED, done.stderr
    assert "stall: rank 0 on " in done.stderr and "in stuck" in done.stderr, done.stderr
    whole, out, work = root / "whole", root / "out", root / "out" / ".hpcdp-prep"
    assert work.is_dir() and _saved_parts(work) >= 1 and not (out / "train.h5").exists()
    assert prep.main([recipe, *case.args, "--out", str(whole)]) == 0
    capsys.readouterr()

    for change in case.changes:  # each option that changes the bytes refuses, naming itself
        assert prep.main([recipe, *case.args, *change, "--out", str(out), "--resume"]) == 2
        err = capsys.readouterr().err
        assert "--resume with other options than the run it continues" in err, err
        assert change[0].lstrip("-").replace("-", "_") in err.split("continues (")[-1], err
    if case.input_file is not None:  # so does an input file changed since, naming it
        stat = case.input_file.stat()
        os.utime(case.input_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert prep.main([recipe, *case.args, "--out", str(out), "--resume"]) == 2
        err = capsys.readouterr().err
        assert f"{case.input_file.resolve()}" in err.split("continues (")[-1], err
        os.utime(case.input_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert work.is_dir() and _saved_parts(work) >= 1

    assert prep.main([recipe, *case.args, "--out", str(out), "--resume", "--stall-timeout",
                      "30", *case.same]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in whole.iterdir())
    for path in whole.glob("*.h5"):
        assert_same_h5(path, out / path.name)
