"""`hpcdp doctor`: check the stack this job would run on, and say what is wrong.

As one process it checks the build (Horovod's frameworks, controllers and
tensor operations; the MPI library; parallel HDF5; PyTorch and CUDA; Slurm's
commands and the `srun --mpi` plugin that fits the MPI library). Under a launcher
with several ranks it also gathers every rank's placement and checks that ranks,
local ranks and sizes agree and that no two local ranks on a node share a GPU.
Alone or under a launcher, it reports the compute threads and MPI yielding
training will set on each node (hpcdp's rule, hpcdp.runtime.thread_plan) and warns when
threads x ranks outnumber the CPUs. It exits non-zero, naming each problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import itertools
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcdp.cliargs import parse_args
from hpcdp.data.prep import inflate
from hpcdp.runtime import hvd_build, hvd_settings, thread_plan
from hpcdp.runtime.cpus import format_cpu_list
from hpcdp.runtime.placement import (
    RankPlacement,
    check_placement,
    device_index_for_local_rank,
    physical_gpu,
)

OK, WARN, FAIL = "ok", "warn", "FAIL"

# Variables through which each launcher tells a process the world size and its rank.
_SIZE_VARS = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")
_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


@dataclass(frozen=True)
class Check:
    status: str
    name: str
    detail: str


def launcher_world_size(env: Mapping[str, str]) -> int:
    """The number of ranks a launcher started, or 1 when none did."""
    for var in _SIZE_VARS:
        value = env.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def launcher_rank(env: Mapping[str, str]) -> int | None:
    for var in _RANK_VARS:
        value = env.get(var, "")
        if value.isdigit():
            return int(value)
    return None


#: The PyTorch releases hpcdp supports, oldest and newest minor release: the floor is
#: pyproject.toml's (`torch>=2.6`, the first safe `torch.load`), the newest is the release
#: `make setup` installs and `make test` runs on (scripts/setup-python.sh). docs/install.md
#: states the same range (tests/unit/test_torch_range.py holds all of them to this value).
TORCH_RANGE = ((2, 6), (2, 15))

#: The oldest versions under which hpcdp's guarantees hold (pyproject.toml's floors), and
#: what fails below them.
FLOORS = {
    "pytorch": (TORCH_RANGE[0], "below 2.6, torch.load(weights_only=True) can be made to "
                                "run code (CVE-2025-32434): checkpoints are not safe to load"),
    "pillow": ((12, 3), "older Pillow has image-decoder vulnerabilities fixed up to 12.3: "
                        "image preparation and hpcdp predict are not safe on untrusted files"),
}


def version_tuple(text: str) -> tuple[int, ...]:
    """The leading numbers of a version ("2.13.0+cpu" -> (2, 13, 0))."""
    out = []
    for part in text.split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        out.append(int(digits))
        if len(digits) < len(part):  # "0rc1", "0a2": the rest is a pre-release tag
            break
    return tuple(out)


def floor_check(name: str, version: str, detail: str) -> Check:
    """OK when `version` of `name` is at least its floor (`FLOORS`), else FAIL saying why."""
    floor, why = FLOORS[name]
    if version_tuple(version) >= floor:
        return Check(OK, name, detail)
    need = ".".join(map(str, floor))
    return Check(FAIL, name, f"{version} is below {need}: {why}; install {name} >= {need}")


def torch_range_check(version: str, detail: str) -> Check:
    """The torch floor (FAIL below it, `floor_check`), then WARN above the newest minor
    release of TORCH_RANGE: it may well work, but no test of hpcdp has run on it."""
    check = floor_check("pytorch", version, detail)
    if check.status == FAIL or version_tuple(version)[:2] <= TORCH_RANGE[1]:
        return check
    low, high = (".".join(map(str, v)) for v in TORCH_RANGE)
    return Check(WARN, "pytorch", f"{detail}: newer than the supported range {low} to {high}.x "
                 f"(docs/install.md); hpcdp's tests have not run on it: install "
                 f"torch=={high}.* to be on tested ground")


def check_pillow() -> list[Check]:
    try:
        version = importlib.metadata.version("pillow")
    except importlib.metadata.PackageNotFoundError:
        return [Check(WARN, "pillow", "not installed: image preparation and hpcdp predict "
                                      "need it")]
    return [floor_check("pillow", version, version)]


def check_inflate() -> list[Check]:
    """Which gzip reader preparing gzipped logs uses: ISA-L's is about 3x zlib's."""
    if inflate.LIBRARY.startswith("isal"):
        return [Check(OK, "gzip", inflate.LIBRARY)]
    return [Check(WARN, "gzip", f"{inflate.LIBRARY}: gzipped logs inflate about 3x slower "
                                "than with ISA-L (pip install isal, where it has wheels)")]


def model_library_checks(rows: Sequence[Mapping[str, object]]) -> list[Check]:
    """One check per optional model library (hpcdp.models.libraries.report): missing is
    fine (only its named networks need it), a mismatch with the torch in use fails, a
    torchvision whose compiled operators do not load is a warning (its networks work)."""
    checks = []
    for row in rows:
        name, version = str(row["name"]), row["version"]
        if version is None:
            checks.append(Check(OK, name, f"not installed (optional: model.name = {name}:... "
                                          "needs it; pip install 'hpcdp[models]')"))
        elif row["problem"]:
            checks.append(Check(FAIL, name, str(row["problem"])))
        elif row["note"]:
            checks.append(Check(WARN, name, f"{version}: {row['note']}"))
        else:
            checks.append(Check(OK, name, str(version)))
    return checks


def check_model_libraries() -> list[Check]:
    try:
        from hpcdp.models import libraries

        return model_library_checks(libraries.report())
    except Exception as exc:  # noqa: BLE001 - torch itself is checked (and named) above
        return [Check(WARN, "models", f"the model libraries were not checked: {exc}")]


def check_torch() -> list[Check]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - report any import failure
        return [Check(FAIL, "pytorch", f"cannot import torch: {exc}")]
    checks = [torch_range_check(torch.__version__,
                                f"{torch.__version__} (CUDA build: {torch.version.cuda or 'no'})")]
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        checks.append(Check(OK, "gpus", f"{len(names)} visible: {', '.join(names)}"))
    else:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        note = f" (CUDA_VISIBLE_DEVICES={visible})" if visible else ""
        checks.append(Check(OK, "gpus", f"none usable by PyTorch: training runs on CPU{note}"))
    return checks


def check_horovod() -> list[Check]:
    try:
        import horovod
        import horovod.torch as hvd
    except Exception as exc:  # noqa: BLE001
        return [Check(FAIL, "horovod", f"cannot import horovod.torch: {exc}")]
    controllers = [
        n for n, built in (("MPI", hvd.mpi_built()), ("Gloo", hvd.gloo_built())) if built
    ]
    ops = [
        n
        for n, built in (
            ("NCCL", hvd.nccl_built()),
            ("MPI", hvd.mpi_built()),
            ("Gloo", hvd.gloo_built()),
        )
        if built
    ]
    detail = (
        f"{horovod.__version__}: frameworks PyTorch;"
        f" controllers {', '.join(controllers) or 'none'};"
        f" tensor ops {', '.join(ops) or 'none'}; CUDA {'yes' if hvd.cuda_built() else 'no'}"
    )
    status = OK if controllers else FAIL
    checks = [
        Check(status, "horovod", detail if controllers else detail + " (no controller built)"),
        build_check(hvd_build.installed_build()),
        wake_check(hvd_settings.horovod_wakes()),
        gloo_check(hvd_settings.horovod_patches()),
    ]
    try:
        import torch

        if torch.cuda.is_available() and not hvd.nccl_built():
            checks.append(
                Check(
                    WARN,
                    "nccl",
                    "GPUs present but Horovod has no NCCL ops: "
                    "rebuild with 'make setup' on a node with CUDA and NCCL",
                )
            )
    except ImportError:
        pass
    return checks


def build_check(build: hvd_build.BuildIdentity) -> Check:
    """Which Horovod build this is: hpcdp's patched one, stock, or partly patched."""
    if not build.patches:
        kind = "stock Horovod, none of hpcdp's patches (docs/install.md says what is lost)"
    elif build.patches == frozenset(hvd_settings.PATCH_SWITCHES):
        kind = "hpcdp's patched build (training switches the patches on)"
    else:
        kind = "partly patched"
    return Check(OK, "hvd build", f"{build.describe(switches=False)}: {kind}")


def wake_check(patched: bool) -> Check:
    """Whether CPU training's all-reduces start when the last rank's tensors arrive."""
    if patched:
        return Check(OK, "horovod wake", "built with hpcdp's wake-on-enqueue patch: CPU "
                     "training sets HOROVOD_WAKE_ON_ENQUEUE=1 and a "
                     f"{hvd_settings.WOKEN_CYCLE_MS} ms cycle")
    return Check(WARN, "horovod wake", "Horovod without hpcdp's wake-on-enqueue patch: each "
                 "step's last all-reduce waits for the next cycle (HOROVOD_CYCLE_TIME); "
                 "'make setup' builds the patched one")


GLOO_PATCHES = hvd_settings.GLOO_PATCHES


def gloo_check(patches: frozenset[str]) -> Check:
    """Whether Horovod's Gloo has hpcdp's two changes (what `horovodrun --gloo` runs on)."""
    missing = [p for p in GLOO_PATCHES if p not in patches]
    if not missing:
        return Check(OK, "horovod gloo", "built with hpcdp's Gloo patches: the event loop "
                     "yields its core when busy; two ranks all-reduce up to 256 KiB in one "
                     "exchange")
    return Check(WARN, "horovod gloo", f"Horovod without hpcdp's {', '.join(missing)} "
                 "patch: under horovodrun --gloo a small model's steps are slower "
                 "(docs/benchmarks.md); 'make setup' builds the patched one")


def check_mpi() -> list[Check]:
    try:
        from mpi4py import MPI
    except Exception as exc:  # noqa: BLE001
        return [Check(FAIL, "mpi", f"cannot import mpi4py: {exc}")]
    version = MPI.Get_library_version().strip().splitlines()[0]
    root = root_check(os.geteuid(), version, os.environ)
    return [Check(OK, "mpi", version), *([root] if root else [])]


#: What Open MPI's mpirun needs to start as root (a container), as a shell line.
ROOT_EXPORTS = "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"


def root_check(euid: int, library: str, environ: Mapping[str, str]) -> Check | None:
    """As root under Open MPI: whether mpirun will start, and the two exports it needs."""
    if euid != 0 or "Open MPI" not in library:
        return None
    names = ROOT_EXPORTS.split()[1:]
    if all(environ.get(n.split("=")[0]) == "1" for n in names):
        return Check(OK, "root", "running as root; OMPI_ALLOW_RUN_AS_ROOT and _CONFIRM are "
                     "set, so mpirun starts")
    return Check(WARN, "root", f"running as root: Open MPI's mpirun refuses to start until "
                 f"you run `{ROOT_EXPORTS}` (or pass --allow-run-as-root); horovodrun passes "
                 "the flag itself; README.md, 'As root'")


def check_hdf5() -> list[Check]:
    try:
        import h5py
    except Exception as exc:  # noqa: BLE001
        return [Check(FAIL, "hdf5", f"cannot import h5py: {exc}")]
    parallel = h5py.get_config().mpi
    detail = (
        f"h5py {h5py.__version__}, HDF5 {h5py.version.hdf5_version}, parallel (mpio): {parallel}"
    )
    if not parallel:
        return [
            Check(FAIL, "hdf5", detail + " -- rebuild h5py against parallel HDF5 ('make setup')")
        ]
    return [Check(OK, "hdf5", detail)]


def check_slurm() -> list[Check]:
    commands = ("sbatch", "srun", "scontrol", "squeue")
    missing = [c for c in commands if shutil.which(c) is None]
    if missing:
        return [
            Check(
                WARN,
                "slurm",
                f"commands not found: {', '.join(missing)} "
                "(needed only to submit jobs from this machine)",
            )
        ]
    return [Check(OK, "slurm", "sbatch, srun, scontrol, squeue found")]


# The srun --mpi plugins each MPI library starts under, best first. Cray MPICH and
# Intel MPI name themselves before the MPICH they derive from.
PLUGINS_FOR = (
    ("CRAY MPICH", ("cray_shasta",)),
    ("Intel(R) MPI", ("pmi2", "pmix")),
    ("Open MPI", ("pmix",)),
    ("MVAPICH", ("pmi2",)),
    ("MPICH", ("pmi2", "pmix")),
)


def srun_plugins(listing: str) -> list[str]:
    """`srun --mpi=list` output -> the plugin names it offers (pure)."""
    names: list[str] = []
    for line in listing.splitlines():
        if "versions available:" in line:
            names += line.split(":", 1)[1].replace(",", " ").split()
        elif line[:1] in ("\t", " ") and line.strip():
            names.append(line.strip())
    return names


def mpi_plugin_check(library: str, offered: Sequence[str], site_default: str | None,
                     chosen: str | None) -> Check:
    """Whether srun will start this MPI library's ranks as one world (pure).

    `chosen` is HPCDP_SRUN_MPI (what the batch scripts pass as --mpi), else the
    site's MpiDefault applies.
    """
    used = chosen or site_default
    how = f"HPCDP_SRUN_MPI={chosen}" if chosen else f"the site's MpiDefault={site_default}"
    kinds = next((k for name, k in PLUGINS_FOR if name in library), None)
    if kinds is None:
        return Check(WARN, "srun --mpi", f"unknown MPI library; srun uses {how}")
    fits = [p for kind in kinds for p in offered if p.split("_v")[0] == kind]
    if used and used.split("_v")[0] in kinds:
        return Check(OK, "srun --mpi", f"{how} fits {library.split(',')[0]}")
    if not fits:
        return Check(FAIL, "srun --mpi", f"srun offers {', '.join(offered) or 'no plugin'}, "
                     f"none of {', '.join(kinds)} that {library.split(',')[0]} needs")
    return Check(FAIL, "srun --mpi", f"{how} does not start {library.split(',')[0]} ranks as "
                 f"one world: export HPCDP_SRUN_MPI={fits[0]} (srun offers {', '.join(offered)})")


def check_srun_mpi(timeout: float = 20.0) -> list[Check]:
    """Which `srun --mpi` plugin fits this MPI library, when Slurm is reachable."""
    if shutil.which("srun") is None or shutil.which("scontrol") is None:
        return []
    try:
        from mpi4py import MPI

        listing = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True,
                                 timeout=timeout, check=False)
        config = subprocess.run(["scontrol", "show", "config"], capture_output=True,
                                text=True, timeout=timeout, check=False)
    except Exception as exc:  # noqa: BLE001 - no MPI or no Slurm controller here
        return [Check(WARN, "srun --mpi", f"not checked: {exc}")]
    if listing.returncode != 0:
        return [Check(WARN, "srun --mpi", "not checked: `srun --mpi=list` failed")]
    default = next((line.split("=", 1)[1].strip() for line in config.stdout.splitlines()
                    if line.split("=", 1)[0].strip() == "MpiDefault"), None)
    return [mpi_plugin_check(MPI.Get_library_version(), srun_plugins(listing.stdout + "\n"
                             + listing.stderr), default, os.environ.get("HPCDP_SRUN_MPI"))]


def stack_checks() -> list[Check]:
    return (check_torch() + check_model_libraries() + check_pillow() + check_inflate()
            + check_horovod() + check_mpi() + check_hdf5() + check_slurm() + check_srun_mpi())


@dataclass(frozen=True)
class RuntimeReport:
    """One rank's threads and yielding as training will set them (or why it cannot)."""

    rank: int
    host: str
    summary: str
    oversubscribed: bool
    error: str | None = None


def my_runtime(rank: int, host: str, environ: Mapping[str, str]) -> RuntimeReport:
    """thread_plan's plan for this process, as training would make it before hvd.init()."""
    try:
        plan = thread_plan.plan_runtime(thread_plan.probe(), thread_plan.local_ranks(environ),
                                         environ)
    except ValueError as exc:
        return RuntimeReport(rank, host, "", False, str(exc))
    summary = plan.describe()
    if plan.oversubscribed:
        summary += (f"; oversubscribed: {plan.sharers} rank(s) x {plan.threads} thread(s) >"
                    f" {plan.cpus:g} CPUs")
    return RuntimeReport(rank, host, summary, plan.oversubscribed)


def runtime_checks(reports: list[RuntimeReport]) -> list[Check]:
    """One line per node and distinct setting: what training sets there, and why."""
    groups: dict[tuple[str, str, str | None], list[RuntimeReport]] = {}
    for rep in sorted(reports, key=lambda r: r.rank):
        groups.setdefault((rep.host, rep.summary, rep.error), []).append(rep)
    checks = []
    for (host, summary, error), members in groups.items():
        ranks = [r.rank for r in members]
        who = f"{host}, rank{'s' if len(ranks) > 1 else ''} {format_cpu_list(ranks)}"
        if error:
            checks.append(Check(FAIL, "runtime", f"{who}: {error}"))
        elif members[0].oversubscribed:
            hint = " (unset OMP_NUM_THREADS or lower it)" if "exported" in summary else ""
            checks.append(Check(WARN, "runtime", f"{who}: training sets {summary}{hint}"))
        else:
            checks.append(Check(OK, "runtime", f"{who}: training sets {summary}"))
    return checks


def my_placement(hvd) -> tuple[RankPlacement, list[str]]:
    """This rank's placement, and any disagreement between Horovod and the launcher."""
    # Imported here, not at the top: doctor must still report when torch or Horovod
    # fails to import. dist is training's own placement record, so both judge the same facts.
    import torch

    from hpcdp.runtime import dist

    if torch.cuda.is_available():
        index = device_index_for_local_rank(hvd.local_rank(), torch.cuda.device_count())
        place = dist.placement(torch.device("cuda", index))
    else:  # no CUDA here: the GPU the launcher's CUDA_VISIBLE_DEVICES gives this rank
        place = dataclasses.replace(
            dist.placement(torch.device("cpu")),
            gpu=physical_gpu(hvd.local_rank(), os.environ.get("CUDA_VISIBLE_DEVICES")))
    problems = []
    env_rank, env_size = launcher_rank(os.environ), launcher_world_size(os.environ)
    if env_rank is not None and env_rank != hvd.rank():
        problems.append(f"rank {hvd.rank()}: the launcher says rank {env_rank}")
    if env_size != hvd.size():
        problems.append(f"rank {hvd.rank()}: Horovod size {hvd.size()}, launcher size {env_size}")
    return place, problems


def placement_checks(timeout: float) -> tuple[list[Check], bool]:
    """Gather every rank's placement (a collective every rank must reach).

    A rank whose peers never arrive (one failed before the collective) gives
    up after `timeout` seconds instead of waiting forever.
    """
    import horovod.torch as hvd

    def give_up() -> None:
        print(
            f"hpcdp doctor: rank {os.environ.get('HOROVOD_RANK', '?')}: the other ranks did not "
            f"join the placement check within {timeout:.0f}s",
            file=sys.stderr,
            flush=True,
        )
        os._exit(3)

    watchdog = threading.Timer(timeout, give_up)
    watchdog.daemon = True
    watchdog.start()
    # Gloo's own all-reduce whatever the build, so that ranks of differing builds meet
    # in the gather below and are named instead of waiting for each other.
    os.environ.pop(hvd_settings.GLOO_PAIR_VAR, None)
    hvd.init()
    place, problems = my_placement(hvd)
    runtime = my_runtime(hvd.rank(), place.host, os.environ)
    build = hvd_build.RankBuild(hvd.rank(), place.host, hvd_build.installed_build())
    gathered = hvd.allgather_object((place, problems, runtime, build))
    watchdog.cancel()
    places = [p for p, _, _, _ in gathered]
    problems = [msg for _, msgs, _, _ in gathered for msg in msgs] + check_placement(places)
    mixed = hvd_build.mismatch([b for _, _, _, b in gathered])
    hosts = sorted({p.host for p in places})
    lines = [
        f"rank {p.rank}: host {p.host}, local rank {p.local_rank}/{p.local_size}, "
        f"GPU {p.gpu if p.gpu is not None else '-'}"
        for p in sorted(places, key=lambda p: p.rank)
    ]
    checks = [Check(OK, "ranks", f"{len(places)} ranks on {len(hosts)} host(s)")]
    checks += [Check(OK, "placement", line) for line in lines]
    checks += [Check(FAIL, "placement", msg) for msg in problems]
    same = gathered[0][3].build.describe(switches=False)
    checks.append(Check(FAIL, "hvd build", mixed) if mixed else
                  Check(OK, "hvd build", f"every rank runs {same}"))
    checks += runtime_checks([r for _, _, r, _ in gathered])
    return checks, hvd.rank() == 0


def render(checks: list[Check]) -> str:
    return "\n".join(f"  {c.status:<5} {c.name:<10} {c.detail}" for c in checks)


#: The stack checks the multi-rank placement check depends on.
PLACEMENT_NEEDS = ("pytorch", "gpus", "horovod")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hpcdp doctor", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--no-ranks",
        action="store_true",
        help="skip the multi-rank placement checks even under a launcher",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for every rank to join the placement check",
    )
    args = parse_args(parser, argv)
    checks = stack_checks()
    printer = True
    # The placement check needs only PyTorch and Horovod: a missing parallel HDF5 or
    # MPI library must not hide two ranks sharing a GPU.
    can_gather = all(c.status != FAIL for c in checks if c.name in PLACEMENT_NEEDS)
    if can_gather and not args.no_ranks and launcher_world_size(os.environ) > 1:
        rank_checks, printer = placement_checks(args.timeout)
        checks += rank_checks
    else:
        checks += runtime_checks([my_runtime(0, socket.gethostname(), os.environ)])
    failed = [c for c in checks if c.status == FAIL]
    if printer or failed:
        print("hpcdp doctor\n" + render(checks), flush=True)
        verdict = f"{len(failed)} problem(s)" if failed else "everything needed is in place"
        print(f"hpcdp doctor: {verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
