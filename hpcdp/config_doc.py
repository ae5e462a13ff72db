"""The config reference (docs/config.md), generated from the config dataclasses.

Each key's text is the comment on its line in hpcdp/config.py (or the comment
lines right above it), so the reference cannot drift from the code: a test
regenerates it and compares. `python -m hpcdp.config_doc > docs/config.md`
rewrites it.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import tokenize
import typing

from hpcdp import config as cfgmod

HEADER = """\
# Config reference

Generated from `hpcdp/config.py` by `python -m hpcdp.config_doc` (a test
checks that this file is current). A config is a TOML file with these
sections; any key can be overridden on the command line as
`section.key=value`. Precedence: command line, then the file, then the
defaults below. `--print-config` shows the merged result.
"""


def field_docs(cls: type) -> dict[str, str]:
    """{field name: its comment}: the comment on the field's line, else the lines above."""
    source = inspect.getsource(cls)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    names = {f.name for f in dataclasses.fields(cls)}
    docs: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        name = line.strip().split(":", 1)[0]
        if name not in names or ":" not in line or name in docs:
            continue
        if number in comments and not line.strip().startswith("#"):
            docs[name] = comments[number]
            continue
        above = []
        k = number - 1
        while k >= 1 and lines[k - 1].strip().startswith("#"):
            above.insert(0, comments.get(k, ""))
            k -= 1
        docs[name] = " ".join(above)
    return docs


def _type_name(tp: typing.Any) -> str:
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return f"list of {item.__name__}"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:
    missing = f.default is dataclasses.MISSING
    value = f.default_factory() if missing else f.default  # type: ignore[misc]
    return f"`{json.dumps(value)}`"


def section_markdown(name: str, cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    types = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        meaning = docs.get(f.name, "").replace("|", "\\|")
        choices = cfgmod.CHOICES.get(f"{name}.{f.name}")
        if choices and not any(c in meaning for c in choices[1:]):
            meaning = f"one of {', '.join(choices)}. {meaning}".strip()
        rows.append(f"| `{name}.{f.name}` | {_type_name(types[f.name])} | {_default(f)} "
                    f"| {meaning} |")
    return f"## [{name}]\n\n{doc}\n\n" + "\n".join(rows) + "\n"


def reference() -> str:
    """The whole reference as Markdown (pure: the same text for the same code)."""
    parts = [HEADER]
    hints = typing.get_type_hints(cfgmod.Config)
    for f in dataclasses.fields(cfgmod.Config):
        parts.append(section_markdown(f.name, hints[f.name]))
    renamed = getattr(cfgmod, "RENAMED", {})
    if renamed:
        parts.append("## Renamed keys\n\nNaming one of these is an error that names its "
                     "successor.\n\n" + "\n".join(f"- `{old}`: use {new}"
                                                  for old, new in renamed.items()) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(reference(), end="")
