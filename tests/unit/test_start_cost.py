"""What a process pays for at start: the entry points import only what their path uses.

The suite and every job start hundreds of Python processes (training ranks, prep recipes,
`hpcdp` commands), and each pays for its imports before it does anything. Each case
imports an entry point in a fresh interpreter and lists the heavy packages it loaded, so
that a module-level import of one of them (a plotting library in a shared helper, the
benchmarks from the training path) fails here instead of silently costing every start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Never needed to train, prepare data or answer a command line's first checks.
UNUSED_AT_START = ("matplotlib", "tensorboard", "torch.utils.tensorboard", "scipy", "sklearn",
                   "pandas", "pyarrow", "tokenizers", "safetensors", "hpcdp.bench",
                   "hpcdp.plan", "hpcdp.export", "hpcdp.doctor")
#: What the training command defers until the config is checked (hpcdp.train.command).
TRAINING_STACK = ("torch", "horovod", "h5py", "mpi4py", "numpy", "PIL")

PREP_RECIPES = ("hpcdp.data.prep.cli", "hpcdp.data.prep.text.markov_recipe",
                "hpcdp.data.prep.clicks.recipe", "hpcdp.data.prep.images.recipe",
                "hpcdp.data.prep.text.recipe", "hpcdp.data.prep.clicks.criteo_recipe")


def loaded_after(code: str, watched: tuple[str, ...]) -> list[str]:
    """The modules of `watched` that a fresh interpreter has loaded after running `code`."""
    probe = (f"{code}\nimport json, sys\n"
             f"print(json.dumps([m for m in {list(watched)!r} if m in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_probe_sees_an_import() -> None:
    # The check can fail: a module that is imported is reported.
    assert loaded_after("import hpcdp.plan", ("hpcdp.plan", "hpcdp.bench")) == ["hpcdp.plan"]


@pytest.mark.parametrize("entry", ["hpcdp.cli", "hpcdp.train.command"])
def test_commands_start_without_the_training_stack(entry: str) -> None:
    assert loaded_after(f"import {entry}", UNUSED_AT_START + TRAINING_STACK) == []


@pytest.mark.parametrize("recipe", PREP_RECIPES)
def test_prep_recipes_start_without_torch_or_the_unused(recipe: str) -> None:
    assert loaded_after(f"import {recipe}", UNUSED_AT_START + ("torch", "horovod")) == []


def test_the_training_path_imports_none_of_the_unused() -> None:
    code = ("import hpcdp.train.command, hpcdp.train.loop, hpcdp.runtime.dist\n"
            "import hpcdp.tasks.image, hpcdp.tasks.lm, hpcdp.tasks.recsys")
    assert loaded_after(code, UNUSED_AT_START) == []
