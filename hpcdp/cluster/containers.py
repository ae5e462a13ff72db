"""Containers for the training ranks: what srun is given and what it runs.

A container wraps the training command alone, under srun: the batch shell stays
outside it, so the shell that traps the time-limit signal, passes it to srun and
requeues the job (with `scontrol`, which images seldom carry) is the host's.
Three ways a site runs one:

- Apptainer or Singularity: a launch prefix, `apptainer exec --nv IMAGE`, before
  the command on each rank (`--bind` for the mounts).
- Shifter: a launch prefix, `shifter --image=IMAGE` (`--volume` for the mounts).
- Pyxis (enroot's Slurm plugin): srun options, `--container-image=IMAGE` and
  `--container-mounts=...`; nothing before the command.

`Container` holds the settings (from a site profile's `[container]` table or the
command line, validated by `from_mapping`); `srun_options()` and `prefix()` give
what the batch script adds. Pure: nothing here runs a container.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RUNTIMES = ("apptainer", "singularity", "shifter", "pyxis")
# GPU access for apptainer/singularity: NVIDIA (--nv), AMD (--rocm), or none. Pyxis
# gets GPUs from enroot's hooks, Shifter from a site module given in `options`.
GPUS = {"nvidia": ("--nv",), "amd": ("--rocm",), "none": ()}
KEYS = ("runtime", "image", "mounts", "gpus", "options")
# Pyxis adds these srun options; image and mounts have keys of their own.
_PYXIS_OPTION = re.compile(r"^--(?:no-)?container-(?P<name>[a-z][a-z-]*)(?:=.+)?\Z")
_FLAG = re.compile(r"^-{1,2}[A-Za-z]")


class ContainerError(ValueError):
    """Container settings that cannot become a working launch."""


@dataclass(frozen=True)
class Container:
    """How each rank's training command runs inside an image."""

    runtime: str
    image: str
    mounts: tuple[str, ...] = ()
    gpus: str | None = None  # apptainer/singularity only; None: nvidia
    options: tuple[str, ...] = ()

    def srun_options(self) -> list[str]:
        """Options srun takes for this container (pyxis only)."""
        if self.runtime != "pyxis":
            return []
        opts = [f"--container-image={self.image}"]
        if self.mounts:
            opts.append("--container-mounts=" + ",".join(self.mounts))
        return opts + list(self.options)

    def prefix(self) -> list[str]:
        """The words before the training command on each rank (none for pyxis)."""
        if self.runtime in ("apptainer", "singularity"):
            binds = ["--bind", ",".join(self.mounts)] if self.mounts else []
            gpus = GPUS[self.gpus or "nvidia"]
            return [self.runtime, "exec", *gpus, *binds, *self.options, self.image]
        if self.runtime == "shifter":
            return ["shifter", f"--image={self.image}",
                    *(f"--volume={m}" for m in self.mounts), *self.options]
        return []


def _closest(name: str, known: Sequence[str]) -> str:
    near = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def line_problem(key: str, value: object) -> str | None:
    """Why `value` cannot go into one line of a batch script, or None (pure; the
    renderer's options and the container settings share the rule)."""
    if not isinstance(value, str) or not value.strip():
        return f"{key} must be a non-empty string, got {value!r}"
    if "\n" in value or "\r" in value:
        return f"{key} must be one line, got {value!r}"
    return None


def _text(key: str, value: object) -> str:
    problem = line_problem(key, value)
    if problem:
        raise ContainerError(problem)
    return str(value)


def _texts(key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ContainerError(f"{key} must be a list of strings, got {value!r}")
    return tuple(_text(f"{key}[{i}]", v) for i, v in enumerate(value))


def _mount(key: str, value: str) -> str:
    """SRC[:DST[:FLAGS]]: one mount; commas separate mounts on every runtime's line."""
    if "," in value or value.startswith(":") or value != value.strip():
        raise ContainerError(f"{key} {value!r} is not one mount SRC[:DST[:FLAGS]] "
                             "(no commas, no surrounding spaces)")
    return value


def from_mapping(data: Mapping[str, object], where: str = "container") -> Container:
    """Validated settings from a mapping (a profile's [container] table, the CLI's)."""
    if not isinstance(data, Mapping):
        raise ContainerError(f"{where} must be a table of settings, got {data!r}")
    for key in data:
        if key not in KEYS:
            raise ContainerError(f"{where}: unknown key {key!r}{_closest(str(key), KEYS)}; "
                                 f"known: {', '.join(KEYS)}")
    runtime = data.get("runtime")
    if runtime not in RUNTIMES:
        hint = _closest(runtime, RUNTIMES) if isinstance(runtime, str) else ""
        raise ContainerError(f"{where}.runtime must be one of {', '.join(RUNTIMES)}, "
                             f"got {runtime!r}{hint}")
    if "image" not in data:
        raise ContainerError(f"{where}.image is missing: a {runtime} container needs an image")
    image = _text(f"{where}.image", data["image"])
    mounts = tuple(_mount(f"{where}.mounts[{i}]", m) for i, m in
                   enumerate(_texts(f"{where}.mounts", data.get("mounts", ()))))
    if runtime == "shifter":
        for i, mount in enumerate(mounts):
            if ":" not in mount:
                raise ContainerError(f"{where}.mounts[{i}] {mount!r}: shifter needs SRC:DST")
    options = _texts(f"{where}.options", data.get("options", ()))
    gpus = data.get("gpus")
    if gpus is not None:
        if runtime not in ("apptainer", "singularity"):
            raise ContainerError(f"{where}.gpus applies to apptainer and singularity only; "
                                 f"{runtime} gets GPUs its own way")
        if gpus not in GPUS:
            raise ContainerError(f"{where}.gpus must be one of {', '.join(GPUS)}, got {gpus!r}")
    for i, option in enumerate(options):
        _check_option(f"{where}.options[{i}]", runtime, option)
    return Container(runtime, image, mounts, gpus, options)  # type: ignore[arg-type]


def _check_option(key: str, runtime: str, option: str) -> None:
    if runtime == "pyxis":
        m = _PYXIS_OPTION.match(option)
        if m is None:
            raise ContainerError(f"{key} {option!r} is not a pyxis srun option like "
                                 "--container-workdir=DIR or --no-container-mount-home")
        if m["name"] in ("image", "mounts"):
            raise ContainerError(f"{key} {option!r}: use the container's "
                                 f"{m['name']} setting instead")
    elif not _FLAG.match(option):
        raise ContainerError(f"{key} {option!r} is not a {runtime} option (it starts with -)")


def merge(site: Mapping[str, object] | None,
          given: Mapping[str, object] | None) -> dict[str, object] | None:
    """A profile's container settings with the command line's on top.

    The command line's fields win one by one; its mounts and options come after
    the profile's. A different runtime replaces the profile's container
    altogether (its image and options were for another runtime), and the runtime
    "none" runs no container at all.
    """
    if not given:
        return dict(site) if site else None
    if given.get("runtime") == "none":
        return None
    if not site or given.get("runtime", site.get("runtime")) != site.get("runtime"):
        return dict(given)
    merged = {**site, **given}
    for key in ("mounts", "options"):
        if key in site and key in given:
            merged[key] = [*site[key], *given[key]]  # type: ignore[misc]
    return merged


# ---- command line ---------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--container-* options of `hpcdp slurm render/submit`."""
    parser.add_argument("--container-runtime", choices=(*RUNTIMES, "none"),
                        help="run each rank in a container (none: not even the site's)")
    parser.add_argument("--container-image", help="the image: a .sif file, docker://..., "
                                                  "or what pyxis/shifter take")
    parser.add_argument("--container-mounts", action="append", metavar="SRC[:DST[:FLAGS]]",
                        help="a folder to mount in the container (repeatable)")
    parser.add_argument("--container-options", action="append", metavar="OPTION",
                        help="another runtime option, e.g. --container-options=--cleanenv "
                             "(repeatable)")
    parser.add_argument("--container-gpus", choices=tuple(GPUS),
                        help="apptainer/singularity GPU access (default: nvidia, --nv)")


def from_args(ns: argparse.Namespace) -> dict[str, object] | None:
    """The container settings given on the command line, or None."""
    given = {key: getattr(ns, f"container_{key}") for key in KEYS}
    given = {key: value for key, value in given.items() if value is not None}
    return given or None
