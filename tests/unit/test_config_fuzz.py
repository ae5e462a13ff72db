"""`hpcdp train` configs: every key with values of every wrong type, out-of-range numbers,
empty strings, paths of the wrong kind and broken files all end in a `ConfigError` that
names the key or file; generated override text never escapes as another exception.

In-process through `hpcdp.config.build` (what `hpcdp train` runs on every rank before
anything else), plus two real `python -m hpcdp.train` runs for the exit status and stderr.
"""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdp import config as c
from hpcdp import config_doc
from hpcdp.config import ConfigError

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, print_blob=True)
BASE = ["data.path=some/data"]  # the one key without a usable default


# Each task's own section, valid with its task only: {section: task}.
TASK_OF = {key: task for key, (task, _) in config_doc.task_sections().items()}


def all_keys() -> list[tuple[str, typing.Any]]:
    """(section.key, declared type) for every field of every config section (every task's)."""
    sections = {name: type(getattr(c.Config(), name)) for name in c.SHARED_SECTIONS}
    sections.update({key: s.type for key, (_, s) in config_doc.task_sections().items()})
    keys = []
    for section, cls in sections.items():
        hints = typing.get_type_hints(cls)
        keys += [(f"{section}.{name}", tp) for name, tp in hints.items()]
    return keys


def base(key: str) -> list[str]:
    """BASE, and the task whose section `key` is in."""
    section = key.split(".")[0]
    return [*BASE, f"task.name={TASK_OF[section]}"] if section in TASK_OF else BASE


KEYS = all_keys()

# TOML literals by the type they parse to (bare words that are not TOML become strings).
LITERALS: dict[str, st.SearchStrategy[str]] = {
    "int": st.integers(-(2**63), 2**63 - 1).map(str),
    "float": st.floats(allow_nan=False, allow_infinity=False).map(repr).map(
        lambda r: r if "." in r or "e" in r else r + ".0"),
    "nonfinite": st.sampled_from(["nan", "inf", "-inf", "+nan", "1e400"]),
    "bool": st.sampled_from(["true", "false"]),
    "str": st.text(st.characters(blacklist_characters='"\\\0', blacklist_categories=("Cc",)),
                   max_size=8).map(lambda t: f'"{t}"'),
    "list": st.sampled_from(["[]", "[1, 2]", '["a"]', "[true]", "[[1]]", "[1.5]"]),
    "table": st.sampled_from(["{}", "{a = 1}"]),
    "date": st.sampled_from(["1979-05-27", "07:32:00", "1979-05-27T07:32:00Z"]),
}
# What each declared type accepts; everything else is a wrong type.
ACCEPTS = {int: {"int"}, float: {"int", "float"}, bool: {"bool"}, str: {"str"},
           list[str]: {"list"}, list[float]: {"list"}, list[int]: {"list"},
           int | str: {"int", "str"}, dict[str, Any]: {"table"}}


@st.composite
def wrong_type(draw: st.DrawFn) -> tuple[str, str]:
    key, tp = draw(st.sampled_from(KEYS))
    kind = draw(st.sampled_from(sorted(set(LITERALS) - ACCEPTS[tp] - {"nonfinite"})))
    return key, draw(LITERALS[kind])


@FUZZ
@given(case=wrong_type())
def test_every_key_refuses_every_wrong_type(case: tuple[str, str]) -> None:
    key, literal = case
    with pytest.raises(ConfigError) as err:
        c.build(None, [*base(key), f"{key}={literal}"])
    assert key in str(err.value), (key, literal, str(err.value))


@FUZZ
@given(key=st.sampled_from([k for k, tp in KEYS if tp in (float, list[float])]),
       literal=LITERALS["nonfinite"])
def test_numbers_must_be_finite(key: str, literal: str) -> None:
    value = f"[{literal}]" if dict(KEYS)[key] == list[float] else literal
    with pytest.raises(ConfigError, match="finite") as err:
        c.build(None, [*base(key), f"{key}={value}"])
    assert key in str(err.value)


# Values out of each key's range (the contract `validate` keeps).
OUT_OF_RANGE: dict[str, st.SearchStrategy[typing.Any]] = {
    **{k: st.integers(max_value=0) for k in (
        "run.epochs", "data.batch_size", "image.num_classes", "horovod.backward_passes_per_step",
        "checkpoint.keep", "preempt.check_every", "log.every_steps", "optim.ref_batch")},
    **{k: st.integers(max_value=-1) for k in (
        "run.max_steps", "run.stop_at_step", "data.global_batch_size", "data.val_batch_size",
        "data.window_samples", "data.virtual_shards", "data.prefetch", "image.width",
        "checkpoint.every_steps", "preempt.max_requeues")},
    "run.seed": st.one_of(st.integers(max_value=-1), st.integers(2**63, 2**70)),
    **{k: st.floats(max_value=-1e-300, allow_infinity=False) for k in (
        "schedule.warmup_epochs", "optim.weight_decay", "optim.momentum")},
    **{k: st.floats(max_value=0.0, allow_infinity=False) for k in ("run.stall_floor_s",)},
    **{k: st.floats(max_value=1.0 - 1e-9, allow_infinity=False) for k in (
        "run.stall_multiple", "run.stall_warmup_factor")},
    **{k: st.floats(max_value=0.0, allow_infinity=False) for k in (
        "optim.lr", "image.scale", "image.std", "horovod.gradient_predivide_factor",
        "schedule.gamma")},
    **{k: st.one_of(st.floats(max_value=-1e-300, allow_infinity=False),
                    st.floats(min_value=1.0 + 1e-9, allow_infinity=False))
       for k in ("schedule.warmup_start_factor", "schedule.min_factor")},
    **{k: st.just("") for k in (
        "run.name", "data.path", "data.train_file", "data.val_file", "image.x_name",
        "image.y_name", "checkpoint.resume", "run.precision", "run.device", "run.on_nan",
        "optim.name", "optim.lr_scaling", "schedule.kind", "horovod.compression",
        "horovod.op")},
    "run.name": st.sampled_from(["", ".", "..", "a/b", "/abs"]),
    "schedule.milestones": st.sampled_from([[-1.0], [2.0, 1.0]]),
    "preempt.signals": st.sampled_from([["KILL"], [""], ["usr1"]]),
}


def toml_literal(value: typing.Any) -> str:
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    return repr(value)


@FUZZ
@given(case=st.sampled_from(sorted(OUT_OF_RANGE)).flatmap(
    lambda k: st.tuples(st.just(k), OUT_OF_RANGE[k])))
def test_out_of_range_values_are_refused_naming_the_key(case: tuple[str, typing.Any]) -> None:
    key, value = case
    overrides = [*base(key), f"{key}={toml_literal(value)}"]
    if key == "schedule.milestones":
        overrides.append("schedule.kind=step")
    with pytest.raises(ConfigError) as err:
        c.build(None, overrides)
    assert key in str(err.value), (key, value, str(err.value))


OVERRIDE_TEXT = st.text(st.characters(blacklist_characters="\0"), max_size=30)


@FUZZ
@given(key=st.sampled_from([k for k, _ in KEYS]), raw=OVERRIDE_TEXT)
def test_any_override_text_builds_or_names_the_key(key: str, raw: str) -> None:
    """Whatever follows `key=`: a valid config, or a ConfigError naming the key."""
    try:
        cfg = c.build(None, [*base(key), f"{key}={raw}"])
    except ConfigError as e:
        assert key in str(e) or "data.path" in str(e), (key, raw, str(e))
        return
    sec, name = key.split(".")
    assert getattr(getattr(cfg, sec), name) is not None


@FUZZ
@given(text=OVERRIDE_TEXT)
def test_any_override_shape_is_an_error_or_a_config(text: str) -> None:
    try:
        c.build(None, [*BASE, text])
    except ConfigError as e:
        assert "override" in str(e) or "unknown" in str(e) or "." in str(e), str(e)


FILE_CONTENT = st.one_of(
    st.binary(max_size=60),
    st.text(max_size=60).map(str.encode),
    st.sampled_from([b"", b"[run", b"[run]\nepochs = ", b"\xff\xfe[run]", b"run = 1",
                     b"[data]\npath = 'd'\n[data]\n", b"[[run]]\n"]),
)


@FUZZ
@given(content=FILE_CONTENT)
def test_any_config_file_builds_or_names_the_file(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cfg.toml"
        path.write_bytes(content)
        try:
            c.build(path, BASE)
        except ConfigError as e:
            assert str(path) in str(e) or "unknown" in str(e) or "." in str(e), str(e)


def test_paths_of_the_wrong_kind_name_the_key(tmp_path: Path) -> None:
    afile, adir = tmp_path / "afile", tmp_path / "adir"
    afile.write_text("x")
    (adir / "train.h5").mkdir(parents=True)
    cases = {
        f"data.path={afile}": "data.path",
        f"run.dir={afile}": "run.dir",
        f"checkpoint.dir={afile}": "checkpoint.dir",
        f"checkpoint.resume={adir}": "checkpoint.resume",
        f"horovod.timeline={adir}": "horovod.timeline",
    }
    for override, key in cases.items():
        with pytest.raises(ConfigError, match=key):
            c.build(None, [*BASE, override])
    with pytest.raises(ConfigError, match="data.train_file"):
        c.build(None, [f"data.path={adir}"])
    with pytest.raises(ConfigError, match="is a folder"):
        c.build(adir, BASE)
    with pytest.raises(ConfigError, match="--config"):
        c.build([], BASE)  # type: ignore[arg-type]  # what `--config=--` gave argparse


def test_nan_is_refused_where_it_used_to_pass() -> None:
    for override in ("optim.lr=nan", "image.scale=inf", "schedule.warmup_epochs=nan"):
        with pytest.raises(ConfigError, match="finite"):
            c.build(None, [*BASE, override])
    assert math.isfinite(c.build(None, BASE).optim.lr)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--config", "{d}/junk.toml", "--print-config"], "junk.toml' is not UTF-8"),
        (["--config=--"], "--config"),
    ],
)
def test_train_command_exits_2_without_a_traceback(tmp_path: Path, args: list[str],
                                                    needle: str) -> None:
    (tmp_path / "junk.toml").write_bytes(b"\xff\xfe\x00junk")
    argv = [a.format(d=tmp_path) for a in args]
    done = subprocess.run([sys.executable, "-m", "hpcdp.train", *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr and "Traceback" not in done.stderr, done.stderr
