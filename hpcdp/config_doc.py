"""The config reference (docs/config.md), generated from the config dataclasses.

Each key's text is the comment on its line in hpcdp/config/schema.py, or in the task's
module for a task's own section (hpcdp/tasks/<name>.py), or the comment lines
right above it, so the reference cannot drift from the code: a test regenerates
it and compares. `python -m hpcdp.config_doc > docs/config.md` rewrites it.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import tokenize
import types
import typing
from collections.abc import Mapping

from hpcdp import config as cfgmod
from hpcdp import tasks

HEADER = """\
# Config reference

Generated from `hpcdp/config/schema.py` and the tasks (`hpcdp/tasks/<name>.py`) by
`python -m hpcdp.config_doc` (a test checks that this file is current). A
config is a TOML file with these sections; any key can be overridden on the
command line as `section.key=value`. Precedence: command line, then the file,
then the task's defaults, then the defaults below. Each task has its own
section, valid only with that task. `--print-config` shows the merged result.
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
    if typing.get_origin(tp) is types.UnionType:  # int | str: a count or "auto"
        return " or ".join(_type_name(t) for t in typing.get_args(tp))
    if typing.get_origin(tp) is dict:  # a free table (model.kwargs)
        return "table"
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return f"list of {item.__name__}"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:
    missing = f.default is dataclasses.MISSING
    value = f.default_factory() if missing else f.default  # type: ignore[misc]
    return f"`{json.dumps(value)}`"


def section_markdown(name: str, cls: type, choices_of: Mapping[str, tuple[str, ...]],
                     generated: Mapping[str, str], owner: str = "") -> str:
    doc = inspect.getdoc(cls) or ""
    if owner:
        doc += f"\n\nValid with `task.name = \"{owner}\"` only (hpcdp/tasks/{owner}.py)."
    types = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        meaning = docs.get(f.name, "") + generated.get(f"{name}.{f.name}", "")
        meaning = meaning.replace("|", "\\|")
        choices = choices_of.get(f"{name}.{f.name}")
        if choices and not any(c in meaning for c in choices[1:]):
            meaning = f"one of {', '.join(choices)}. {meaning}".strip()
        rows.append(f"| `{name}.{f.name}` | {_type_name(types[f.name])} | {_default(f)} "
                    f"| {meaning} |")
    return f"## [{name}]\n\n{doc}\n\n" + "\n".join(rows) + "\n"


def task_sections() -> dict[str, tuple[str, cfgmod.TaskSection]]:
    """{section key: (its task, the section)} for every task in hpcdp.tasks, by task name."""
    found: dict[str, tuple[str, cfgmod.TaskSection]] = {}
    for task in cfgmod.task_names():
        section = cfgmod.find_task(task).section
        if section is not None:
            found.setdefault(section.key, (task, section))
    return found


def reference() -> str:
    """The whole reference as Markdown (pure: the same text for the same code)."""
    parts = [HEADER]
    hints = typing.get_type_hints(cfgmod.Config)
    own = task_sections()
    choices = {**cfgmod.CHOICES, "task.name": tuple(cfgmod.task_names())}
    for key, (_, section) in own.items():
        choices.update({f"{key}.{k}": v for k, v in section.choices.items()})
    models = "; ".join(f"{name}: {' | '.join(tasks.get(name).models)}"
                       for name in cfgmod.task_names())
    generated = {"model.name": f" ({models})"}
    for name in cfgmod.SHARED_SECTIONS:
        parts.append(section_markdown(name, hints[name], choices, generated))
        if name == "model":
            parts += [section_markdown(key, section.type, choices, generated, owner=task)
                      for key, (task, section) in own.items()]
    renamed = getattr(cfgmod, "RENAMED", {})
    if renamed:
        parts.append("## Renamed keys\n\nNaming one of these is an error that names its "
                     "successor.\n\n" + "\n".join(f"- `{old}`: use {new}"
                                                  for old, new in renamed.items()) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(reference(), end="")
