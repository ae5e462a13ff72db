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
    """A config from BASE and `overrides`, for the task whose section they name (if any)."""
    task = [f"task.name={o.split('.')[0]}" for o in overrides if o.startswith(("lm.", "recsys."))]
    return c.build(None, [*BASE, *task[:1], *overrides])


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
    sections = ", ".join(build().sections())
    assert msg == f"unknown section 'zzz' in override 'zzz.a=1'; known: {sections}"


# ---- more bounds and messages (mutation survivors) -------------------------------------

MORE_POSITIVE = ["recsys.embed_dim", "lm.seq_len", "lm.layers", "lm.heads", "lm.width",
                 "lm.mlp_ratio"]
MORE_NON_NEGATIVE = ["lm.peak_tflops", "preempt.max_requeues", "optim.grad_clip"]


@pytest.mark.parametrize("key", MORE_POSITIVE)
def test_model_shape_keys_refuse_zero_naming_the_key(key: str) -> None:
    assert refused(f"{key}=0") == f"{key}=0: must be at least 1"


@pytest.mark.parametrize("key", MORE_NON_NEGATIVE)
def test_more_non_negative_keys(key: str) -> None:
    section, name = key.split(".")
    assert getattr(getattr(build(f"{key}=0"), section), name) == 0
    assert refused(f"{key}=-1") in (f"{key}=-1: must not be negative",
                                    f"{key}=-1.0: must not be negative")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task.name=vision"], "task.name='vision': choose one of image, lm, recsys; or a task "
         "of your own as package.module:ATTR or path/to/file.py:ATTR"),
        (['preempt.signals=["KILL"]'],
         "preempt.signals: 'KILL' is not one of USR1, USR2, TERM, INT, HUP"),
        (["schedule.kind=step"], "schedule.kind='step' needs schedule.milestones (epochs)"),
        (["horovod.op=adasum", "horovod.gradient_predivide_factor=2"],
         "horovod.gradient_predivide_factor must be 1.0 with horovod.op='adasum'"),
        (["horovod.op=adasum", "run.precision=fp16"],
         "horovod.op='adasum' cannot be combined with run.precision='fp16' (Adasum steps inside "
         "its hooks, where a GradScaler cannot act)"),
        (["horovod.op=adasum", "optim.grad_clip=1"],
         "optim.grad_clip cannot be combined with horovod.op='adasum' (Adasum steps inside its "
         "hooks, before any averaged gradient exists)"),
        (["run.precision=fp16", "run.device=cpu"],
         "run.precision='fp16' needs a GPU (use bf16 or fp32 on CPUs)"),
        (["recsys.table_lr=0"],
         "recsys.table_lr must be positive, recsys.initial_accumulator not negative"),
        (["recsys.initial_accumulator=-0.1"],
         "recsys.table_lr must be positive, recsys.initial_accumulator not negative"),
        (["recsys.bottom=[8, 0]"], "recsys.bottom and recsys.top: every width must be at least 1"),
        (["recsys.top=[0]"], "recsys.bottom and recsys.top: every width must be at least 1"),
        (['run.name="a\\u0000b"'],
         "run.name='a\\x00b': must be a plain folder name (set run.dir for a path)"),
        (["optim.betas=[0.9, 1.0]"], "optim.betas=[0.9, 1.0]: two numbers in [0, 1)"),
        (["optim.betas=[1.5, 0.9]"], "optim.betas=[1.5, 0.9]: two numbers in [0, 1)"),
        (["optim.betas=[-0.1, 0.9]"], "optim.betas=[-0.1, 0.9]: two numbers in [0, 1)"),
        (["optim.betas=[0.9]"], "optim.betas=[0.9]: two numbers in [0, 1)"),
        (["lm.dropout=1"], "lm.dropout=1.0: must lie in [0, 1)"),
        (["lm.dropout=1.5"], "lm.dropout=1.5: must lie in [0, 1)"),
        (["lm.width=10", "lm.heads=4"], "lm.width=10 is not a multiple of lm.heads=4"),
        (["data.x_name=a"], "data.x_name in override 'data.x_name=a' has moved to image.x_name "
                            "(the task's own section): write [image] x_name = ... instead"),
        (["run.stall_floor_s=-1"], "run.stall_floor_s=-1: must be positive (turn the watchdog "
                                   "off with run.step_timeout_s=0)"),
        (["run.stall_warmup_factor=0.9"], "run.stall_warmup_factor=0.9: must be at least 1"),
    ],
)
def test_more_refusals_in_full(overrides: list[str], message: str) -> None:
    assert refused(*overrides) == message


def test_data_path_unset_is_named_in_full() -> None:
    with pytest.raises(ConfigError) as err:
        c.build(None, [])
    assert str(err.value) == "data.path is not set: the folder holding the training data"


def test_values_just_inside_the_bounds_are_taken() -> None:
    cfg = build("image.scale=0.5", "schedule.kind=step", "schedule.milestones=[0, 0.5]",
                "optim.betas=[0, 0.999]", "run.stall_floor_s=0.5", "run.stall_multiple=1",
                "run.stall_warmup_factor=1.5")
    assert cfg.image.scale == 0.5 and cfg.schedule.milestones == [0.0, 0.5]
    assert build("recsys.bottom=[1]", "recsys.top=[1, 1]").recsys.bottom == [1]
    assert build("lm.dropout=0.99").lm.dropout == 0.99 and cfg.optim.betas == [0.0, 0.999]
    assert cfg.run.stall_floor_s == 0.5 and cfg.run.stall_multiple == 1.0


def test_fp16_is_refused_only_on_cpus_and_only_with_adasum_otherwise() -> None:
    assert build("run.precision=fp16", "run.device=cuda").run.precision == "fp16"
    assert build("run.precision=fp16").run.device == "auto"  # decided at run time
    assert build("run.device=cpu").run.device == "cpu"  # fp32 on CPUs


def test_unsupported_field_type_is_a_named_bug() -> None:
    with pytest.raises(TypeError) as err:
        c.coerce("x.y", 1, dict)
    assert str(err.value) == "x.y: unsupported field type <class 'dict'>"


def test_the_files_task_picks_the_task_defaults(tmp_path) -> None:
    asked: list[str] = []

    def task_defaults(name: str) -> dict:
        asked.append(name)
        return {"lm": {"layers": 5}} if name == "lm" else {}

    f = tmp_path / "c.toml"
    f.write_text('[task]\nname = "lm"\n[data]\npath = "d"\n')
    assert c.build(f, [], task_defaults=task_defaults).lm.layers == 5
    image = c.build(f, ["task.name=image"], task_defaults=task_defaults)
    assert "lm" not in image.sections() and image.image.num_classes == "auto"
    assert asked == ["lm", "image"]


def test_a_broken_task_default_names_the_task() -> None:
    with pytest.raises(ConfigError) as err:
        c.build(None, BASE, task_defaults=lambda name: {"zzz": {}})
    assert str(err.value).startswith("unknown section 'zzz' in task 'image''s defaults; known: ")


# ---- check_paths: a path of the wrong kind is named -------------------------------------


def test_file_where_a_folder_belongs_is_named(tmp_path) -> None:
    f = tmp_path / "f"
    f.write_text("")
    assert refused(f"data.path={f}") == f"data.path: {str(f)!r} is a file, not a folder"
    assert refused(f"run.dir={f}") == f"run.dir: {str(f)!r} is a file, not a folder"
    assert refused(f"checkpoint.dir={f}") == f"checkpoint.dir: {str(f)!r} is a file, not a folder"


def test_folder_where_a_file_belongs_is_named(tmp_path) -> None:
    data = tmp_path / "data"
    for name in ("train.h5", "val.h5", "ckpt", "run/t.json"):
        (data / name).mkdir(parents=True)
    base = [f"data.path={data}"]
    for key, other in (("data.train_file", "data.val_file=v.h5"),
                       ("data.val_file", "data.train_file=t.h5")):
        with pytest.raises(ConfigError) as err:
            c.build(None, [*base, other])
        path = data / ("train.h5" if key == "data.train_file" else "val.h5")
        assert str(err.value) == f"{key}: {str(path)!r} is a folder, not a file"
    ok = [*base, "data.train_file=t.h5", "data.val_file=v.h5"]
    with pytest.raises(ConfigError) as err:
        c.build(None, [*ok, f"checkpoint.resume={data / 'ckpt'}"])
    assert str(err.value) == f"checkpoint.resume: {str(data / 'ckpt')!r} is a folder, not a file"
    with pytest.raises(ConfigError) as err:
        c.build(None, [*ok, f"run.dir={data / 'run'}", "horovod.timeline=t.json"])
    assert str(err.value) == (f"horovod.timeline: {str(data / 'run' / 't.json')!r} is a folder, "
                              "not a file")


def test_resume_auto_and_none_are_words_not_paths(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for word in ("auto", "none"):
        (tmp_path / word).mkdir()
        assert build(f"checkpoint.resume={word}").checkpoint.resume == word


# ---- load_file: every failure names the file -------------------------------------------


def test_unusable_config_files_are_named_in_full(tmp_path) -> None:
    for path, why in ((tmp_path, "is a folder, not a TOML file"),
                      (tmp_path / "nope.toml", "does not exist")):
        with pytest.raises(ConfigError) as err:
            c.load_file(path)
        assert str(err.value) == f"config file {str(path)!r} {why}"


def test_unreadable_config_file_is_named(tmp_path) -> None:
    # A regular file whose read fails (EIO), even for root: the process's own memory at 0.
    mem = "/proc/self/mem"
    import os

    if not os.path.isfile(mem):
        pytest.skip("needs Linux's /proc/self/mem")
    with pytest.raises(ConfigError) as err:
        c.load_file(mem)
    assert str(err.value).startswith(f"config file {mem!r} cannot be read: ")


# ---- Horovod's stall settings ----------------------------------------------------------


def test_stall_settings_must_be_whole_seconds_naming_the_key() -> None:
    why = c.horovod_stall_error(c.HorovodConfig(stall_check_s=0.5), {})
    assert why == "horovod.stall_check_s=0.5: Horovod reads whole seconds; use an integer"
    why = c.horovod_stall_error(c.HorovodConfig(stall_shutdown_s=1.5), {})
    assert why == "horovod.stall_shutdown_s=1.5: Horovod reads whole seconds; use an integer"


def test_a_bad_shutdown_variable_is_named() -> None:
    env = {c.SHUTDOWN_ENV: "soon"}
    assert c.horovod_stall_error(c.HorovodConfig(), env) == (
        f"{c.SHUTDOWN_ENV}='soon' in the environment is not a whole number of seconds")


def test_a_zero_check_time_is_taken_as_written() -> None:
    # 0 is a setting, not "unset" (negative is): a shutdown after it is honoured.
    assert c.horovod_stall_error(c.HorovodConfig(stall_check_s=0, stall_shutdown_s=30), {}) is None


@pytest.mark.parametrize(("shutdown", "suggested"), [(1, 1), (3, 1), (5, 2)])
def test_a_short_shutdown_is_refused_with_a_check_time_that_fits(shutdown: int,
                                                                 suggested: int) -> None:
    why = c.horovod_stall_error(c.HorovodConfig(stall_shutdown_s=shutdown), {})
    assert why == (
        f"horovod.stall_shutdown_s={shutdown} is below the stall check time (Horovod's default "
        f"{c.CHECK_ENV}=60): Horovod ignores such a shutdown time and the job would wait forever. "
        f"Set horovod.stall_check_s to at most {shutdown} (e.g. horovod.stall_check_s="
        f"{suggested}) or horovod.stall_shutdown_s to at least 60")
