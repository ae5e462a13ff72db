"""The shape of the training package: short functions, one owner of the collectives."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hpcdp import config as cfgmod
from hpcdp.config import ConfigError

PKG = Path(__file__).resolve().parents[2] / "hpcdp"
MAX_LINES = 80


def functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return [(f"{path.name}:{node.name}", node.end_lineno - node.lineno + 1)  # type: ignore[operator]
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_function_in_the_training_package_is_longer_than_80_lines() -> None:
    found = [f for p in sorted((PKG / "train").glob("*.py")) for f in functions(p)]
    assert len(found) > 20  # the walk sees the package
    too_long = [(name, n) for name, n in found if n > MAX_LINES]
    assert not too_long, too_long


def test_the_length_check_can_fail(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n")
    assert functions(tmp_path / "long.py") == [("long.py:long", MAX_LINES + 1)]


def test_only_the_entry_point_imports_the_cli() -> None:
    pattern = re.compile(r"hpcdp\.cli\b|from hpcdp import cli\b")
    importers = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                       if p.name != "cli.py" and pattern.search(p.read_text()))
    assert importers == ["__main__.py"]


def test_the_training_package_calls_horovod_only_through_dist() -> None:
    users = sorted(p.name for p in (PKG / "train").glob("*.py")
                   if re.search(r"\bhvd\.|import horovod", p.read_text()))
    assert users == []


def test_moved_keys_name_their_new_place(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model.num_classes .* has moved to image.num_classes"):
        cfgmod.build(None, ["data.path=d", "model.num_classes=3"])
    old = tmp_path / "old.toml"
    old.write_text("[data]\npath = 'd'\nscale = 1.0\n")
    with pytest.raises(ConfigError, match="data.scale in '.*old.toml' has moved to image.scale"):
        cfgmod.build(old)
    with pytest.raises(ConfigError, match="task.name='video': choose one of image"):
        cfgmod.build(None, ["data.path=d", "task.name=video"])


def test_task_defaults_sit_between_hpcdp_defaults_and_the_file(tmp_path: Path) -> None:
    def defaults(name: str) -> dict:
        assert name == "image"
        return {"optim": {"name": "adamw", "lr": 0.003}}

    cfg = cfgmod.build(None, ["data.path=d", "optim.lr=0.01"], defaults)
    assert (cfg.optim.name, cfg.optim.lr) == ("adamw", 0.01)


def test_the_shipped_config_selects_the_image_task() -> None:
    from hpcdp import tasks

    cfg = cfgmod.build(PKG / "configs" / "digits.toml", [], tasks.defaults)
    assert cfg.task.name == "image" and cfg.image.num_classes == "auto"
    task = tasks.get(cfg.task.name)
    task.check_model(cfg.model.name)
    with pytest.raises(ConfigError, match="unknown model 'vgg11' for task 'image'"):
        task.check_model("vgg11")
