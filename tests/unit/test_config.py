"""Config precedence and strictness: defaults < file < overrides; typos and wrong types fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdp import config as c
from hpcdp.config import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.toml"
    p.write_text(text)
    return p


def test_precedence_cli_over_file_over_defaults(tmp_path: Path) -> None:
    p = write(tmp_path, '[data]\npath = "d"\nbatch_size = 16\n[optim]\nlr = 0.5\n')
    cfg = c.build(p, ["optim.lr=0.05"])
    assert cfg.optim.lr == 0.05  # command line wins
    assert cfg.data.batch_size == 16  # file wins over default
    assert cfg.optim.momentum == c.OptimConfig().momentum  # default stays


def test_override_types_are_parsed() -> None:
    cfg = c.build(None, ["data.path=runs/x", "run.epochs=3", "schedule.warmup_epochs=1",
                         "image.cifar_stem=true", 'preempt.signals=["USR1"]',
                         "schedule.milestones=[1, 2.5]", 'run.name="7"'])
    assert cfg.data.path == "runs/x"
    assert cfg.run.epochs == 3 and isinstance(cfg.run.epochs, int)
    assert cfg.schedule.warmup_epochs == 1.0 and isinstance(cfg.schedule.warmup_epochs, float)
    assert cfg.image.cifar_stem is True
    assert cfg.preempt.signals == ["USR1"]
    assert cfg.schedule.milestones == [1.0, 2.5]
    assert cfg.run.name == "7"


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("optim.lrr=1", "unknown key 'optim.lrr'"),
        ("optimz.lr=1", "unknown section 'optimz'"),
        ("data.batch_size=abc", "data.batch_size: expected int"),
        ("data.batch_size=1.5", "data.batch_size: expected int"),
        ("model.sync_bn=1", "model.sync_bn: expected bool"),
        ("run.epochs=true", "run.epochs: expected int"),
        ("preempt.signals=USR1", "preempt.signals: expected a list"),
        ("lr=1", "section.key"),
        ("optim.lr", "section.key=value"),
        ("optim.name=lion", "optim.name='lion'"),
        ("data.batch_size=0", "data.batch_size=0: must be at least 1"),
        ("preempt.signals=[\"KILL\"]", "'KILL' is not one of"),
        ("optim.scale_lr=false", "optim.scale_lr in override 'optim.scale_lr=false' is no "
                                 "longer a key: use optim.lr_scaling"),
        ("optim.lr_scaling=cubic", "optim.lr_scaling='cubic': choose one of linear, sqrt, none"),
        ("optim.ref_batch=0", "optim.ref_batch=0: must be at least 1"),
    ],
)
def test_bad_overrides_name_the_key(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        c.build(None, ["data.path=d", override])
    assert needle in str(info.value)


def test_unknown_key_in_file_names_file_and_suggests(tmp_path: Path) -> None:
    p = write(tmp_path, '[data]\npath = "d"\nbatch_sise = 3\n')
    with pytest.raises(ConfigError) as info:
        c.build(p)
    msg = str(info.value)
    assert "data.batch_sise" in msg and str(p) in msg and "data.batch_size" in msg


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        c.build(tmp_path / "nope.toml")
    bad = write(tmp_path, "[data\npath = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        c.build(bad)


def test_semantic_checks() -> None:
    with pytest.raises(ConfigError, match="data.path"):
        c.build(None, [])
    with pytest.raises(ConfigError, match="milestones"):
        c.build(None, ["data.path=d", "schedule.kind=step"])
    with pytest.raises(ConfigError, match="adasum"):
        c.build(None, ["data.path=d", "horovod.op=adasum", "horovod.gradient_predivide_factor=2"])
    with pytest.raises(ConfigError, match="fp16"):
        c.build(None, ["data.path=d", "run.precision=fp16", "run.device=cpu"])


def test_dumps_round_trips(tmp_path: Path) -> None:
    cfg = c.build(None, ["data.path=d", "optim.lr=0.003", "schedule.milestones=[1,2]"])
    again = c.build(write(tmp_path, c.dumps(cfg)))
    assert again == cfg


def test_run_dir_defaults() -> None:
    cfg = c.build(None, ["data.path=d", "run.name=abc"])
    assert cfg.run_dir == Path("runs/abc")
    assert cfg.checkpoint_dir == Path("runs/abc/checkpoints")


def test_shipped_configs_are_valid() -> None:
    files = sorted((REPO / "hpcdp" / "configs").glob("*.toml"))
    assert files
    for f in files:
        c.build(f)


def test_print_config_through_the_hpcdp_command() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "hpcdp", "train", "--config",
         str(REPO / "hpcdp" / "configs" / "digits.toml"), "--print-config", "optim.lr=0.5"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "lr = 0.5" in done.stdout and 'name = "digits_cnn"' in done.stdout
