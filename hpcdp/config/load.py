"""Building a config: defaults < the task's defaults < TOML file < `key.sub=value`
overrides, strictly, then the checks (hpcdp.config.checks)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcdp import references
from hpcdp.config.checks import check_paths, validate
from hpcdp.config.schema import (
    RENAMED,
    Config,
    ConfigError,
    TaskConfig,
    TaskSection,
    find_task,
    task_names,
)
from hpcdp.config.values import _section_types, _unknown, coerce, parse_override, tomllib


def apply_mapping(cfg: Config, data: dict[str, Any], where: str) -> None:
    """Apply a nested {section: {key: value}} mapping, strictly."""
    sections = cfg.sections()
    for sec, values in data.items():
        if sec not in sections:
            raise _other_tasks_section(cfg, sec, values, where) or _unknown(
                "section", sec, list(sections), where)
        if not isinstance(values, dict):
            raise ConfigError(f"[{sec}] {where} must be a table, got {values!r}")
        obj = sections[sec]
        types = _section_types(type(obj))
        for key, value in values.items():
            if f"{sec}.{key}" in RENAMED:
                raise ConfigError(f"{sec}.{key} {where} is no longer a key: use "
                                  f"{RENAMED[f'{sec}.{key}']}")
            if key not in types:
                new = _moved_to(cfg, f"{sec}.{key}")
                if new:
                    raise ConfigError(f"{sec}.{key} {where} has moved to {new} (the task's own "
                                      f"section): write [{new.split('.')[0]}] {key} = ... "
                                      "instead")
                raise _unknown("key", f"{sec}.{key}", [f"{sec}.{k}" for k in types], where)
            setattr(obj, key, coerce(f"{sec}.{key}", value, types[key]))


def _task_sections(first: str) -> list[tuple[str, TaskSection]]:
    """(task, its section) for every task with one, task `first` first (error paths only:
    this imports every task)."""
    found = [(name, find_task(name).section) for name in [first, *task_names()]]
    return [(name, section) for name, section in found if section is not None]


def _moved_to(cfg: Config, old: str) -> str | None:
    """The key `old` ("data.x_name") moved to in a task's own section, or None."""
    for _, section in _task_sections(cfg.task.name):
        if old in section.moved:
            return f"{section.key}.{section.moved[old]}"
    return None


def _other_tasks_section(cfg: Config, sec: str, values: Any, where: str) -> ConfigError | None:
    """The error for another task's section ([lm] in an image config), or None."""
    owners = [name for name, section in _task_sections(cfg.task.name) if section.key == sec]
    if not owners:
        return None
    keys = list(values) if isinstance(values, dict) else []
    what = f"{sec}.{keys[0]}" if keys else f"[{sec}]"
    return ConfigError(f"{what} {where}: [{sec}] is the section of task {owners[0]!r}, and "
                       f"this config's task is {cfg.task.name!r} (task.name)")


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, with errors that name the file."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a folder, not a TOML file")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text (TOML expected)") from None
    except OSError as e:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {e}") from None


TaskDefaults = Callable[[str], Mapping[str, Mapping[str, Any]]]


def build(path: str | Path | None = None, overrides: Sequence[str] = (),
          task_defaults: TaskDefaults | None = None,
          environ: Mapping[str, str] | None = None) -> Config:
    """Defaults, then the task's defaults, then the file, then the overrides; then checks.

    The task is named by the file or an override (task.name) and found by name
    (find_task); its own section joins the config and its defaults apply before the
    file. `task_defaults(name)`, when given, stands in for the task's own defaults.
    `environ` (default: os.environ) expands `${NAME}` in paths and is the environment
    the checks read (Horovod's stall times): a submission checks the config with the
    job's variables standing in.
    """
    cfg = Config()
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"--config: expected a file path, got {path!r}")  # e.g. --config=--
    mapping = load_file(path) if path is not None else {}
    parsed = [(text, *parse_override(text)) for text in overrides]
    name = chosen_task(mapping, parsed, path)
    task = find_task(name)
    cfg.task.name = name
    cfg.task_section = (task.section.key, task.section.type()) if task.section else ("", None)
    defaults = task.defaults if task_defaults is None else task_defaults(name)
    apply_mapping(cfg, dict(defaults), f"in task {name!r}'s defaults")
    if path is not None:
        apply_mapping(cfg, mapping, f"in {str(path)!r}")
    for text, sec, key, value in parsed:
        apply_mapping(cfg, {sec: {key: value}}, f"in override {text!r}")
    cfg.task.name = name  # a file reference as chosen_task made it: absolute
    cfg.model.name = absolute_model(cfg.model.name, model_folder(mapping, parsed, path))
    environ = os.environ if environ is None else environ
    expand_paths(cfg, environ)
    validate(cfg, environ)
    check_paths(cfg)
    return cfg


# Paths that may name environment variables, so that one batch script serves every task
# of a job array: run.dir=runs/r_${SLURM_ARRAY_TASK_ID}.
PATH_KEYS = ("run.dir", "data.path", "checkpoint.dir", "checkpoint.resume")


_VAR = re.compile(r"\$\{([^}]*)\}")


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def expand_vars(key: str, text: str, environ: Mapping[str, str]) -> str:
    """`${NAME}` in `text` replaced by its value in `environ`; unset or malformed: an error."""

    def value(m: re.Match[str]) -> str:
        name = m[1]
        if not _NAME.match(name):
            raise ConfigError(f"{key}={text!r}: ${{{name}}} is not a variable name")
        if name not in environ:
            raise ConfigError(f"{key}={text!r}: environment variable {name} is not set")
        return environ[name]

    return _VAR.sub(value, text)


def expand_paths(cfg: Config, environ: Mapping[str, str]) -> None:
    """Expand `${NAME}` in the path settings (PATH_KEYS), in place."""
    for key in PATH_KEYS:
        sec, name = key.split(".")
        section = getattr(cfg, sec)
        setattr(section, name, expand_vars(key, getattr(section, name), environ))


def chosen_task(mapping: Mapping[str, Any], parsed: Sequence[tuple[str, str, str, Any]],
                path: str | Path | None = None) -> str:
    """task.name as the overrides, else the file, else the default set it; a relative
    file reference made absolute from the config file's folder (set in the file) or the
    working folder (set by an override), so that every rank imports the same file."""
    name, folder = TaskConfig.name, Path.cwd()
    file_task = mapping.get("task")
    if isinstance(file_task, Mapping) and isinstance(file_task.get("name"), str):
        name = file_task["name"]
        folder = Path(path).parent if path is not None else folder
    for _, sec, key, value in parsed:
        if (sec, key) == ("task", "name") and isinstance(value, str):
            name, folder = value, Path.cwd()
    try:
        return references.absolute(name, folder)
    except references.TaskReferenceError as e:
        raise ConfigError(str(e)) from None


def model_folder(mapping: Mapping[str, Any], parsed: Sequence[tuple[str, str, str, Any]],
                 path: str | Path | None) -> Path:
    """Where a relative path in model.name is taken from: the working folder for an
    override, else the config file's folder."""
    if any((sec, key) == ("model", "name") for _, sec, key, _ in parsed) or path is None:
        return Path.cwd()
    return Path(path).parent


#: model.name prefixes that name a library's network, not a builder of the user's.
LIBRARIES = ("torchvision", "timm", "transformers")


def absolute_model(name: str, folder: Path) -> str:
    """model.name with a relative file in it (`path/file.py:callable`,
    `transformers:file.json`) made absolute from `folder`: every rank, a resume and an
    export then read the same file."""
    prefix, colon, rest = name.partition(":")
    if not colon:
        return name
    if prefix == "transformers" and rest.endswith(".json"):
        return f"{prefix}:{os.path.normpath(os.path.join(os.path.abspath(folder), rest))}"
    target, _, attr = name.rpartition(":")
    if prefix in LIBRARIES or not (target.endswith(".py") or "/" in target):
        return name
    return f"{os.path.normpath(os.path.join(os.path.abspath(folder), target))}:{attr}"


def from_record(mapping: Mapping[str, Any], where: str) -> Config:
    """The config a run recorded (a checkpoint's or an export's `config`), rebuilt with
    its keys and types checked strictly and its task's own checks, but no path checks:
    a trained model is rebuilt where its data and run folder may not be."""
    task_values = mapping.get("task")
    name = task_values.get("name") if isinstance(task_values, Mapping) else None
    if not isinstance(name, str):
        raise ConfigError(f"{where}: the recorded config names no task.name")
    task = find_task(name)
    cfg = Config()
    cfg.task_section = (task.section.key, task.section.type()) if task.section else ("", None)
    apply_mapping(cfg, {k: dict(v) if isinstance(v, Mapping) else v
                        for k, v in mapping.items()}, f"in {where}")
    if task.section is not None and task.section.check is not None:
        task.section.check(cfg)
    return cfg
