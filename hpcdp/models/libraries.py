"""The optional model libraries (torchvision, timm, transformers: `pip install hpcdp[models]`).

None of them is imported when hpcdp is: a network named `torchvision:...`, `timm:...`
or `transformers:...` imports its library when the model is built, so a missing or
mismatched library never stops hpcdp from starting, and `hpcdp doctor` names it.

torchvision ships compiled operators (`torchvision._C`: nms, roi_align, deformable
convolutions) built against one torch build, and the wheel pins that torch version
exactly. Beside another build (a CUDA torchvision next to a CPU torch of the same
version, the usual case for the package index's wheels) the library does not load, and
torchvision's `__init__` then fails while it registers fake kernels for those operators:
`import torchvision` raises, and so does `import timm` and much of transformers, which
import it. Its model builders are pure Python. `torchvision()` therefore imports it with
those two registration modules skipped when, and only when, its compiled operators did
not load: the classification networks build and train; calling one of the compiled
operators raises torchvision's own "Couldn't load custom C++ ops" error.
`ops_problem()` says so (hpcdp doctor).

Every import sets the Hugging Face libraries offline (HF_HUB_OFFLINE): hpcdp builds
networks from configs and never downloads weights.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import types
from typing import Any

#: The libraries of the `models` extra, in the order they depend on each other.
NAMES = ("torchvision", "timm", "transformers")
#: torchvision modules that only register kernels for its compiled operators.
_REGISTRATIONS = ("torchvision._meta_registrations", "torchvision._autograd_registrations")

_ops_problem: str | None = None


class LibraryError(ImportError):
    """A model library that is not installed or cannot be imported: the message says which."""


def version(name: str) -> str | None:
    """The installed version of distribution `name`, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_pin(name: str) -> str | None:
    """The exact torch version `name`'s wheel requires (`torch==X`), or None."""
    try:
        requires = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in requires:
        m = re.fullmatch(r"torch\s*\(?\s*==\s*([0-9][^;,)\s]*)\s*\)?\s*", line.split(";")[0])
        if m and "extra" not in line:
            return m[1]
    return None


def mismatch(name: str, torch_version: str) -> str | None:
    """Why `name`'s build does not match the torch in use (its pin names another torch
    version), or None: it matches, is not installed, or pins none."""
    pin = torch_pin(name)
    base = torch_version.split("+")[0]
    if pin is None or pin.split("+")[0] == base:
        return None
    return (f"{name} {version(name)} is built for torch {pin}, but torch {torch_version} is "
            f"in use: install the {name} release made for torch {base}")


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _missing(name: str) -> LibraryError:
    return LibraryError(f"{name} is not installed: pip install 'hpcdp[models]' (the optional "
                        f"model libraries), or pip install {name}")


def torchvision() -> types.ModuleType:
    """torchvision, imported with its operator registrations skipped where its compiled
    operators do not load beside this torch (see the module doc)."""
    global _ops_problem
    if "torchvision" in sys.modules and hasattr(sys.modules["torchvision"], "models"):
        return sys.modules["torchvision"]
    if importlib.util.find_spec("torchvision") is None:
        raise _missing("torchvision")
    try:
        return importlib.import_module("torchvision")
    except Exception as e:  # noqa: BLE001 - retried below only when the compiled ops failed
        extension = sys.modules.get("torchvision.extension")
        if extension is None or extension._has_ops():
            raise LibraryError(f"torchvision {version('torchvision')} cannot be imported: "
                               f"{type(e).__name__}: {e}") from None
        first = e
    for key in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[key]
    for key in _REGISTRATIONS:
        sys.modules[key] = types.ModuleType(key, "skipped: torchvision's compiled ops did not load")
    try:
        module = importlib.import_module("torchvision")
    except Exception as e:  # noqa: BLE001 - reported with the first failure
        raise LibraryError(f"torchvision {version('torchvision')} cannot be imported: {e} "
                           f"(first: {first})") from None
    import torch

    _ops_problem = (f"torchvision {version('torchvision')}'s compiled operators do not load "
                    f"beside torch {torch.__version__} ({first}); its model builders are used "
                    "without them (classification networks work; torchvision.ops kernels such "
                    "as nms do not)")
    return module


def ops_problem() -> str | None:
    """What `torchvision()` had to work around, once it ran; None if nothing."""
    return _ops_problem


def timm() -> types.ModuleType:
    """timm (it imports torchvision: that goes through `torchvision()` first)."""
    return _import_after_torchvision("timm")


def transformers() -> types.ModuleType:
    """Hugging Face transformers, offline (its image helpers import torchvision)."""
    return _import_after_torchvision("transformers")


def _import_after_torchvision(name: str) -> types.ModuleType:
    if importlib.util.find_spec(name) is None:
        raise _missing(name)
    _offline()
    if importlib.util.find_spec("torchvision") is not None:
        torchvision()
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any import failure is named, with the library
        raise LibraryError(f"{name} {version(name)} cannot be imported: "
                           f"{type(e).__name__}: {e}") from None


def import_named(model_name: str) -> None:
    """The library a `library:network` model name names, imported now when it is
    installed: a shapes-only build (torch.device("meta")) must not be the first import,
    since torchvision's import (timm and transformers import it too) computes on tensors,
    which the meta device refuses (torch 2.6 with torchvision 0.21). A failure is left for
    the build to report."""
    loaders = {"torchvision": torchvision, "timm": timm, "transformers": transformers}
    library = model_name.partition(":")[0] if ":" in model_name else ""
    if library in loaders:
        with contextlib.suppress(LibraryError):
            loaders[library]()


def prepare_for_user_code() -> None:
    """Before a user's builder module is imported: torchvision (which it may import,
    directly or through timm) made importable, when it is installed."""
    _offline()
    if importlib.util.find_spec("torchvision") is not None:
        with contextlib.suppress(LibraryError):  # the user's module reports it, if it needs it
            torchvision()


def report(load: bool = True) -> list[dict[str, Any]]:
    """Per library of the extra: name, version (None: not installed), problem (a version
    pin that names another torch, or an import that fails; None: none) and note (what
    `torchvision()` worked around), for hpcdp doctor. With `load`, each installed library
    is imported the way a named network imports it."""
    import torch

    loaders = {"torchvision": torchvision, "timm": timm, "transformers": transformers}
    rows = []
    for name in NAMES:
        row: dict[str, Any] = {"name": name, "version": version(name),
                               "problem": mismatch(name, torch.__version__), "note": None}
        if load and row["version"] is not None and row["problem"] is None:
            try:
                loaders[name]()
            except LibraryError as e:
                row["problem"] = str(e)
            row["note"] = ops_problem() if name == "torchvision" else None
        rows.append(row)
    return rows
