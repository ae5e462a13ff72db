"""The README's workstation commands, run exactly as written, as a user types them after
`make setup`, so that a README that drifts from the code fails here.

Every ```bash block of README.md right below a `<!-- readme-test ... -->` line runs, in
the README's order, in one bash script (`set -e`: the first failing command ends it) in
a fresh folder holding what a clone holds (the package, the recipes, the scripts, the
configs) and `.venv`; the commands write data/, runs/ and the exports there. The
environment is a user's shell: none of hpcdp's runtime settings and no Open MPI root
permission, which the README's own `export` line has to give (as root, Open MPI's
mpirun refuses to start without it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.runtime.launcher import SETTINGS_VARS

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- readme-test"
#: What the commands read from the clone (they run from its top folder).
CLONE = ("hpcdp", "datasets", "scripts", "slurm", "pyproject.toml")
#: What the README's workstation commands must show: prep, train, using a model, plan.
COVERED = ("mpirun -np 2 .venv/bin/python datasets/", "-m hpcdp.train", "hpcdp eval",
           "hpcdp export", "hpcdp predict", "hpcdp generate", "hpcdp plan")
#: A user's shell has none of these (make test exports the first two; tests/conftest.py
#: the PML).
NOT_A_USERS = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
               "OMPI_MCA_rmaps_base_oversubscribe", "OMPI_MCA_pml", *SETTINGS_VARS)


def marked_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, body) of each ```bash block right below a marker, in order."""
    lines = text.splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if not line.startswith(MARKER):
            continue
        if i + 1 == len(lines) or lines[i + 1].strip() != "```bash":
            raise ValueError(f"README.md:{i + 1}: a readme-test marker must stand right "
                             "above a ```bash block")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"README.md:{i + 2}: the ```bash block is never closed")
        blocks.append((i + 3, "\n".join(lines[i + 2 : end])))
    return blocks


def script(blocks: list[tuple[int, str]]) -> str:
    """One bash script: each block as written, announced by its README line, traced."""
    parts = ["set -euo pipefail"]
    for line, body in blocks:
        parts += [f"echo '=== README.md line {line}'", "set -x", body, "{ set +x; } 2>/dev/null"]
    return "\n".join(parts) + "\n"


def user_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in NOT_A_USERS}


def test_marked_blocks_are_found_in_order_and_a_stray_marker_is_refused() -> None:
    text = ("intro\n<!-- readme-test -->\n```bash\na \\\n  b\n```\n```bash\nnot marked\n```\n"
            "<!-- readme-test: x -->\n```bash\nc\n```\n")
    assert marked_blocks(text) == [(4, "a \\\n  b"), (12, "c")]
    with pytest.raises(ValueError, match="README.md:1: a readme-test marker must stand"):
        marked_blocks("<!-- readme-test -->\ntext\n```bash\nx\n```\n")


def test_the_readme_marks_every_workstation_command_it_must_show() -> None:
    commands = "\n".join(body for _, body in marked_blocks((REPO / "README.md").read_text()))
    assert [c for c in COVERED if c not in commands] == []
    assert "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in commands
    assert "sbatch" not in commands  # a workstation: the Slurm lines need a cluster


@pytest.mark.parallel
@pytest.mark.extended  # every README command in turn, about a minute: CI's second tier
@pytest.mark.timeout(1200)  # minutes on a busy 2-core machine: a bound of its own
def test_the_readme_commands_run_as_written(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in CLONE:
        (clone / name).symlink_to(REPO / name)
    venv = REPO / ".venv" if (REPO / ".venv" / "bin" / "python").exists() else Path(sys.prefix)
    (clone / ".venv").symlink_to(venv)
    blocks = marked_blocks((REPO / "README.md").read_text())
    done = subprocess.run(["bash", "-c", script(blocks)], cwd=clone, env=user_environment(),
                          capture_output=True, text=True, timeout=1100, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-8000:]
    for made in ("runs/digits/summary.json", "runs/x/summary.json", "model/config.json",
                 "runs/lm_markov/summary.json", "results/allreduce.json",
                 "data/cifar-like/train.h5", "data/mine/train.h5", "shapes-model/config.json"):
        assert (clone / made).is_file(), made
    assert out.count("=== README.md line") == len(blocks)
