"""A key's value in and out: checked against its declared type, read from an override,
written back as TOML."""

from __future__ import annotations

import difflib
import json
import math
import sys
import types
import typing
from typing import TYPE_CHECKING, Any

from hpcdp.config.schema import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

if TYPE_CHECKING:
    from hpcdp.config.schema import Config


def _section_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(tp: Any) -> str:
    return getattr(tp, "__name__", None) if typing.get_origin(tp) is None else str(tp)


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the declared type `tp`; ints widen to float, nothing else.

    A union (`int | str`: a count or "auto") takes the first member that accepts it.
    """
    origin = typing.get_origin(tp)
    if origin is types.UnionType:
        for member in typing.get_args(tp):
            try:
                return coerce(key, value, member)
            except ConfigError:
                continue
    if origin is dict:
        return free_table(key, value)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list of {item_tp.__name__}, got {value!r}")
        return [coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{key}: expected a finite number, got {value!r}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin is not types.UnionType:  # pragma: no cover - an unsupported type is a bug
        raise TypeError(f"{key}: unsupported field type {tp!r}")
    raise ConfigError(
        f"{key}: expected {_describe(tp)}, got {type(value).__name__} {value!r}"
    )


def free_table(key: str, value: Any) -> dict[str, Any]:
    """A table of any keys (a builder's keyword arguments): names are strings, and every
    value is one TOML can write back (no null, no infinity), so the run's config.toml
    and the checkpoint's config rebuild the same network."""
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table, got {type(value).__name__} {value!r}")
    return {str(k): _table_value(f"{key}.{k}", v) for k, v in value.items()}


def _table_value(key: str, value: Any) -> Any:
    if isinstance(value, dict):
        return free_table(key, value)
    if isinstance(value, list):
        return [_table_value(f"{key}[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    if not isinstance(value, (bool, int, float, str)):
        raise ConfigError(f"{key}: {type(value).__name__} {value!r} is not a TOML value")
    return value


def _unknown(kind: str, name: str, known: list[str], where: str) -> ConfigError:
    near = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return ConfigError(f"unknown {kind} {name!r} {where}{hint}; known: {', '.join(known)}")


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.key=value` -> (section, key, value); the value is read as TOML when it can be.

    Bare words that are not valid TOML (`optim.name=sgd`, `run.dir=runs/x`)
    are taken as strings, so quoting is only needed for strings like "1".
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    path, raw = text.split("=", 1)
    parts = path.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"override {text!r}: the key must look like section.key")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return parts[0], parts[1], value


def dumps(cfg: Config) -> str:
    """The effective config as TOML text (for --print-config and the run dir)."""
    lines: list[str] = []
    for sec, values in cfg.to_dict().items():
        lines.append(f"[{sec}]")
        for key, value in values.items():
            lines.append(f"{key} = {toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def toml_value(value: Any) -> str:
    """`value` as TOML: JSON's text for numbers, strings and lists of them; a table
    (model.kwargs) inline, its keys quoted."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)
