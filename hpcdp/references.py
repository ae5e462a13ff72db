"""A task named by reference: `package.module:ATTR`, `path/to/file.py:ATTR`, entry points.

`task.name` names a built-in task (a module of hpcdp.tasks), a task an installed package
declares under the entry-point group `hpcdp.tasks` (`name = "package.module:ATTR"`), or
the user's own code by reference. A file reference is recorded as an absolute path
(`absolute`), so that every rank, a resume and an export import the same file whatever
their working folder. This module imports the code a reference names and nothing of
hpcdp: `hpcdp.config.find_task` checks that what it gets is a Task.

Every failure is a `TaskReferenceError` naming the reference and the module or file.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

#: The entry-point group where installed packages declare their tasks.
GROUP = "hpcdp.tasks"
#: How a reference is written, for error messages.
FORMS = "package.module:ATTR or path/to/file.py:ATTR"


class TaskReferenceError(ValueError):
    """A reference that names no importable module or file, or no attribute in it."""


def is_reference(name: str) -> bool:
    """Whether `name` is a reference (it holds a colon) rather than a task's name."""
    return ":" in name


def is_file(target: str) -> bool:
    """Whether the part before the colon names a file (a path) rather than a module."""
    return target.endswith(".py") or "/" in target or os.sep in target


def split(reference: str) -> tuple[str, str]:
    """(module or file, attribute) of a reference; refuses a malformed one."""
    target, _, attr = reference.rpartition(":")
    dotted = all(part.isidentifier() for part in target.split("."))
    if not target or not attr.isidentifier() or not (is_file(target) or dotted):
        raise TaskReferenceError(f"task.name={reference!r}: not a reference; write {FORMS}")
    return target, attr


def absolute(reference: str, folder: Path) -> str:
    """`reference` with a relative file path made absolute from `folder` (the config
    file's folder, or the working folder for a command-line override)."""
    if not is_reference(reference):
        return reference
    target, attr = split(reference)
    if not is_file(target) or os.path.isabs(target):
        return reference
    return f"{os.path.normpath(os.path.join(os.path.abspath(folder), target))}:{attr}"


def entry_point(name: str) -> str | None:
    """The reference an installed package declares for task `name`, or None."""
    for point in importlib.metadata.entry_points(group=GROUP):
        if point.name == name:
            return str(point.value)
    return None


def installed_names() -> list[str]:
    """The task names installed packages declare (entry points), sorted."""
    return sorted({point.name for point in importlib.metadata.entry_points(group=GROUP)})


def import_target(shown: str, target: str, key: str = "task.name",
                  error: type[ValueError] = TaskReferenceError) -> tuple[ModuleType, str]:
    """(the module or file `target` names, imported; "module 'x'" or "file /p.py").

    Shared by task references and network builders (hpcdp.models.named): `key` and
    `error` are the config key and the exception each names a failure with. A file is
    imported once per process, under a name made from its path.
    """
    if is_file(target):
        return _import_file(shown, target, key, error), f"file {target}"
    try:
        return importlib.import_module(target), f"module {target!r}"
    except Exception as e:  # noqa: BLE001 - a missing module, or the module's own error
        raise error(f"{key}={shown!r}: module {target!r} cannot be imported: "
                    f"{type(e).__name__}: {e}") from None


def _import_file(shown: str, path: str, key: str, error: type[ValueError]) -> ModuleType:
    if not os.path.isfile(path):
        raise error(f"{key}={shown!r}: file {path} does not exist")
    digest = hashlib.sha256(path.encode()).hexdigest()[:12]
    name = f"_hpcdp_ref_{Path(path).stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise error(f"{key}={shown!r}: file {path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and type hints look their module up here
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module's own error, named
        del sys.modules[name]
        raise error(f"{key}={shown!r}: file {path} cannot be imported: "
                    f"{type(e).__name__}: {e}") from None
    return module


def resolve(reference: str, shown: str | None = None) -> tuple[Any, str]:
    """(the attribute `reference` names, "module 'x'" or "file /p.py": where it lives).

    `shown` is how the user named it (an entry point's name), for the messages.
    """
    shown = shown or reference
    target, attr = split(reference)
    module, where = import_target(shown, target)
    if not hasattr(module, attr):
        public = [n for n in vars(module) if not n.startswith("_")]
        near = difflib.get_close_matches(attr, public, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise TaskReferenceError(f"task.name={shown!r}: {where} has no attribute "
                                 f"{attr!r}{hint}")
    return getattr(module, attr), where
