"""Which Horovod build this process runs, and what a site's own Horovod lacks.

A build's identity is Horovod's version, the hpcdp patches its library was built
with (their marks, hvd_settings.PATCH_MARKS) and which of them this process
switches on (hvd_settings.PATCH_SWITCHES). Ranks whose identities differ must not
run one job: the Gloo pair all-reduce changes the messages on the wire, and a job
mixing it with Gloo's ring waits until Gloo's timeout (hpcdp.runtime.build_guard
compares them at start). Also `python -m hpcdp.runtime.hvd_build --check-site`:
setup-python.sh's check of a Horovod it did not build (HPCDP_HOROVOD=site).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcdp.runtime import hvd_settings

#: The oldest Horovod hpcdp runs on (the API it calls; its C++17 fix for torch >= 2.1
#: is needed only to build it).
MIN_VERSION = (0, 28, 1)


@dataclass(frozen=True)
class BuildIdentity:
    """One rank's Horovod: version, hpcdp patches built in, and those switched on."""

    version: str
    patches: frozenset[str]
    active: frozenset[str]

    def describe(self, switches: bool = True) -> str:
        """'horovod 0.28.1 stock' or 'horovod 0.28.1 with hpcdp's patches
        gloo-pair-allreduce (on), gloo-yield-when-busy (off), wake-on-enqueue (on)'
        (without `switches`, the patches alone)."""
        if not self.patches:
            return f"horovod {self.version} stock"
        parts = [f"{p} ({'on' if p in self.active else 'off'})" if switches else p
                 for p in sorted(self.patches)]
        return f"horovod {self.version} with hpcdp's patches {', '.join(parts)}"

    def to_json(self) -> dict[str, object]:
        return {"version": self.version, "patches": sorted(self.patches),
                "active": sorted(self.active)}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> BuildIdentity:
        """From another rank's `to_json` (plain data: a malformed one raises ValueError)."""
        try:
            version = str(data["version"])
            patches = frozenset(str(p) for p in data["patches"])  # type: ignore[union-attr]
            active = frozenset(str(p) for p in data["active"])  # type: ignore[union-attr]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a build identity: {data!r}") from exc
        return cls(version, patches, active)


def horovod_version() -> str:
    """The importable Horovod's version ('' when there is none)."""
    try:
        import horovod
    except ImportError:
        return ""
    return str(getattr(horovod, "__version__", "unknown"))


def installed_build(environ: Mapping[str, str] | None = None,
                    library: str | None = None) -> BuildIdentity:
    """This process's build, with the switches `environ` (os.environ) sets."""
    environ = os.environ if environ is None else environ
    patches = hvd_settings.horovod_patches(library)
    return BuildIdentity(horovod_version(), patches,
                         hvd_settings.active_patches(environ, patches))


@dataclass(frozen=True)
class RankBuild:
    """A rank's build, and where it runs (for the message that names them)."""

    rank: int
    host: str
    build: BuildIdentity


def _ranks_text(members: Sequence[RankBuild]) -> str:
    by_host: dict[str, list[int]] = {}
    for m in sorted(members, key=lambda m: m.rank):
        by_host.setdefault(m.host, []).append(m.rank)
    return "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))} on {host}"
                     for host, r in by_host.items())


def mismatch(builds: Sequence[RankBuild]) -> str | None:
    """Why these ranks cannot run one job (their builds differ), or None (pure)."""
    groups: dict[BuildIdentity, list[RankBuild]] = {}
    for rb in builds:
        groups.setdefault(rb.build, []).append(rb)
    if len(groups) < 2:
        return None
    lines = [f"  {build.describe()}: {_ranks_text(members)}"
             for build, members in sorted(groups.items(), key=lambda g: min(m.rank for m in g[1]))]
    return ("the ranks of this job run different Horovod builds, which cannot run one job "
            "(the Gloo pair all-reduce changes what goes on the wire):\n" + "\n".join(lines)
            + "\ninstall one build on every node (docs/install.md), or switch a patch off on "
            "every rank alike (e.g. HOROVOD_GLOO_PAIR_ALLREDUCE=0)")


# --------------------------------------------------------------------------- a site's Horovod

#: What is lost without each patch (figures: docs/benchmarks.md).
PATCH_LOSS: Mapping[str, str] = {
    "wake-on-enqueue": "each step's last all-reduce waits for Horovod's next cycle",
    "gloo-yield-when-busy": "under Gloo, ranks pinned to one core spin on a busy connection",
    "gloo-pair-allreduce": "under Gloo, two ranks all-reduce small buffers in Gloo's ring "
                           "(four segments in two phases) instead of one exchange",
}


def _version_tuple(version: str) -> tuple[int, ...]:
    numbers = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits) if digits else 0)
    return tuple(numbers)


def check_site() -> tuple[list[str], list[str]]:
    """A Horovod hpcdp did not build: (notes, problems). Problems stop setup."""
    notes: list[str] = []
    version = horovod_version()
    if not version:
        return notes, ["no Horovod can be imported (HPCDP_HOROVOD=site uses the one the venv "
                       "sees: load the site's module first, or create the venv with "
                       "--system-site-packages)"]
    if _version_tuple(version) < MIN_VERSION:
        return notes, [f"Horovod {version} is older than "
                       f"{'.'.join(map(str, MIN_VERSION))}, which hpcdp needs"]
    try:
        import horovod.torch as hvd
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is the answer
        return notes, [f"Horovod {version} does not import against this PyTorch: {exc} "
                       "(it was built for another torch: rebuild it, or HPCDP_HOROVOD=stock)"]
    notes.append(f"Horovod {version} imports against torch {torch.__version__}")
    problems: list[str] = []
    controllers = [n for n, built in (("MPI", hvd.mpi_built()), ("Gloo", hvd.gloo_built()))
                   if built]
    if not controllers:
        problems.append("it has neither the MPI nor the Gloo controller")
    notes.append(f"controllers: {', '.join(controllers) or 'none'}")
    if not hvd.mpi_built():
        notes.append("missing: the MPI controller (mpirun, srun and the Slurm scripts need it; "
                     "horovodrun --gloo still works)")
    if not hvd.gloo_built():
        notes.append("missing: the Gloo controller (horovodrun --gloo)")
    ops = [n for n, built in (("NCCL", hvd.nccl_built()), ("MPI", hvd.mpi_built()),
                              ("Gloo", hvd.gloo_built())) if built]
    notes.append(f"tensor operations: {', '.join(ops) or 'none'}")
    if torch.version.cuda and not hvd.nccl_built():
        notes.append("missing: NCCL operations (this torch is a CUDA build: GPU gradients "
                     "would go through MPI or Gloo on the host)")
    patches = hvd_settings.horovod_patches()
    for name in hvd_settings.PATCH_SWITCHES:
        if name not in patches:
            notes.append(f"without hpcdp's {name} patch: {PATCH_LOSS[name]}")
    return notes, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcdp.runtime.hvd_build",
                                     description="The Horovod build this Python imports.")
    parser.add_argument("--check-site", action="store_true",
                        help="check a Horovod hpcdp did not build; exit 1 if hpcdp cannot use it")
    args = parser.parse_args(argv)
    if not args.check_site:
        print(installed_build().describe())
        return 0
    notes, problems = check_site()
    for line in notes:
        print(f"hvd_build: {line}")
    for line in problems:
        print(f"hvd_build: error: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
