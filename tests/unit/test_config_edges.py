"""Config checks at their edges: each bound, each type, and the messages in full.

Each test pins down a behaviour that mutation testing (`make mutate`) found
unguarded: a bound off by one, a type let through, a message cut short.
"""

from __future__ import annotations

import dataclasses

import pytest

from hpcdp import config as c
from hpcdp.config import ConfigError

BASE = ["data.path=d"]

POSITIVE = ["run.epochs", "data.batch_size", "optim.ref_batch", "image.num_classes",
            "horovod.backward_passes_per_step", "checkpoint.keep", "preempt.check_every",
            "log.every_steps"]
NON_NEGATIVE = ["run.max_steps", "run.stop_at_step", "data.global_batch_size",
                "data.val_batch_size", "data.window_samples", "data.virtual_shards",
                "data.prefetch", "image.width", "checkpoint.every_steps",
                "schedule.warmup_epochs", "optim.weight_decay"]


def build(*overrides: str) -> c.Config:
    return c.build(None, [*BASE, *overrides])


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        build(*overrides)
    return str(err.value)


@pytest.mark.parametrize("key", POSITIVE)
def test_positive_keys_take_one_and_refuse_zero(key: str) -> None:
    section, name = key.split(".")
    assert getattr(getattr(build(f"{key}=1"), section), name) == 1
    assert refused(f"{key}=0") == f"{key}=0: must be at least 1"


@pytest.mark.parametrize("key", NON_NEGATIVE)
def test_non_negative_keys_take_zero_and_refuse_minus_one(key: str) -> None:
    section, name = key.split(".")
    assert getattr(getattr(build(f"{key}=0"), section), name) == 0
    assert refused(f"{key}=-1") in (f"{key}=-1: must not be negative",
                                    f"{key}=-1.0: must not be negative")


@pytest.mark.parametrize("value", ["true", "false"])
def test_float_fields_refuse_booleans(value: str) -> None:
    assert refused(f"optim.lr={value}") == f"optim.lr: expected float, got bool {value.title()}"
    assert refused(f"schedule.milestones=[1, {value}]").startswith(
        "schedule.milestones[1]: expected float, got bool")


def test_ints_widen_to_float_but_not_to_bool_or_str() -> None:
    cfg = build("optim.lr=2")
    assert cfg.optim.lr == 2.0 and type(cfg.optim.lr) is float
    assert refused("run.epochs=2.0") == "run.epochs: expected int, got float 2.0"
    assert refused("log.jsonl=1") == "log.jsonl: expected bool, got int 1"
    assert refused('run.name=["a"]') == "run.name: expected str, got list ['a']"
    assert refused("optim.lr=inf") == "optim.lr: expected a finite number, got inf"


def test_milestones_must_increase() -> None:
    assert build("schedule.kind=step", "schedule.milestones=[1, 3]").schedule.milestones == [1, 3]
    assert refused("schedule.kind=step", "schedule.milestones=[3, 1]") == (
        "schedule.milestones=[3.0, 1.0]: must be increasing")
    assert refused("schedule.milestones=[-1, 2]") == (
        "schedule.milestones=[-1.0, 2.0]: must not be negative")


def test_override_splits_at_the_first_equals_sign() -> None:
    assert c.parse_override("run.name=a=b") == ("run", "name", "a=b")
    assert build("run.name=a=b").run.name == "a=b"
    assert c.parse_override(" optim.lr = 0.5") == ("optim", "lr", 0.5)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("schedule.warmup_start_factor=1.01", "schedule.warmup_start_factor must lie in [0, 1]"),
        ("schedule.warmup_start_factor=-0.01", "schedule.warmup_start_factor must lie in [0, 1]"),
        ("schedule.min_factor=1.5", "schedule.min_factor must lie in [0, 1]"),
        ("schedule.min_factor=-0.5", "schedule.min_factor must lie in [0, 1]"),
        ("optim.lr=0", "optim.lr=0.0: must be positive"),
        ("image.scale=0", "image.scale and image.std must be positive"),
        ("image.std=0", "image.scale and image.std must be positive"),
        ("horovod.gradient_predivide_factor=0", "horovod.gradient_predivide_factor must be "
                                                "positive"),
        ("run.seed=-1", "run.seed=-1: must lie in [0, 2**63)"),
        (f"run.seed={2**63}", f"run.seed={2**63}: must lie in [0, 2**63)"),
        ("optim.momentum=-0.1", "optim.momentum=-0.1: must not be negative"),
        ("schedule.gamma=0", "schedule.gamma=0.0: must be positive"),
        ("run.name=..", "run.name='..': must be a plain folder name (set run.dir for a path)"),
        ("run.name=.", "run.name='.': must be a plain folder name (set run.dir for a path)"),
        ("run.name=a/b", "run.name='a/b': must be a plain folder name (set run.dir for a path)"),
        ('run.name=""', "run.name='': must be a plain folder name (set run.dir for a path)"),
        ('data.train_file=""', "data.train_file must not be empty"),
        ('image.y_name=""', "image.y_name must not be empty"),
        ('checkpoint.resume=""', "checkpoint.resume must not be empty"),
        ('run.dir="a\\u0000b"', "run.dir must not hold a NUL character"),
        ('horovod.timeline="t\\u0000"', "horovod.timeline must not hold a NUL character"),
    ],
)
def test_range_checks_in_full(override: str, message: str) -> None:
    assert refused(override) == message


def test_ranges_include_their_ends() -> None:
    cfg = build("schedule.warmup_start_factor=1", "schedule.min_factor=0", f"run.seed={2**63 - 1}",
                "optim.momentum=0", "run.name=a.b")
    assert cfg.schedule.warmup_start_factor == 1.0 and cfg.run.seed == 2**63 - 1
    build("schedule.warmup_start_factor=0", "schedule.min_factor=1", "run.seed=0")


def test_nesterov_needs_momentum_only_with_sgd() -> None:
    assert refused("optim.nesterov=true", "optim.momentum=0") == (
        "optim.nesterov=true needs a positive optim.momentum")
    assert build("optim.name=adamw", "optim.nesterov=true", "optim.momentum=0").optim.nesterov


def test_unknown_names_get_one_suggestion_and_the_list() -> None:
    msg = refused("checkpoint.kepp=2")
    keys = ", ".join(f"checkpoint.{f.name}" for f in dataclasses.fields(c.CheckpointConfig))
    assert msg == ("unknown key 'checkpoint.kepp' in override 'checkpoint.kepp=2' (did you mean "
                   f"'checkpoint.keep'?); known: {keys}")
    msg = refused("zzz.a=1")
    sections = ", ".join(f.name for f in dataclasses.fields(c.Config))
    assert msg == f"unknown section 'zzz' in override 'zzz.a=1'; known: {sections}"
