"""Stop a job whose ranks run different Horovod builds before Horovod starts.

The check cannot go through Horovod itself: under Gloo the controller's first
negotiation is already an all-reduce, and a rank with the pair all-reduce waits
for a message a stock rank never sends, until Gloo's timeout. So every rank
posts its build identity (hpcdp.runtime.hvd_build) where its launcher gives a
channel of its own, and reads everyone's:
- horovodrun --gloo: the launcher's rendezvous key-value store (plain JSON over
  HTTP, the store Gloo's own rendezvous uses, in a scope of hpcdp's);
- an MPI launcher (mpirun, horovodrun, srun with an MPI plugin): an MPI
  allgather (mpi4py) before Horovod initializes; Horovod then uses that MPI.
A single rank, or a launcher with neither, is not checked.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

from hpcdp.runtime.hvd_build import BuildIdentity, RankBuild, mismatch

#: The key-value store's scope for the identities (not one of Horovod's own).
KV_SCOPE = "hpcdp-build"
#: Variables through which MPI launchers give the world size.
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_STEP_NUM_TASKS")


class BuildMismatch(RuntimeError):
    """Ranks run different Horovod builds (every rank raises it, with the same message)."""


def _int(environ: Mapping[str, str], var: str) -> int | None:
    text = environ.get(var, "").strip()
    return int(text) if text.isdigit() else None


def gloo_rendezvous(environ: Mapping[str, str]) -> tuple[str, int, int, int] | None:
    """(address, port, rank, size) where horovodrun --gloo started this rank, else None."""
    addr = environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "").strip()
    port, rank = _int(environ, "HOROVOD_GLOO_RENDEZVOUS_PORT"), _int(environ, "HOROVOD_RANK")
    size = _int(environ, "HOROVOD_SIZE")
    if not addr or port is None or rank is None or size is None:
        return None
    return addr, port, rank, size


def mpi_world_size(environ: Mapping[str, str]) -> int:
    for var in MPI_SIZE_VARS:
        size = _int(environ, var)
        if size:
            return size
    return 1


def _kv_url(addr: str, port: int, rank: int) -> str:
    return f"http://{addr}:{port}/{KV_SCOPE}/{rank}"


def exchange_kv(identity: RankBuild, addr: str, port: int, size: int,
                timeout: float) -> list[RankBuild]:
    """Post this rank's identity to the store and read every rank's, waiting up to
    `timeout` seconds for the last one (ranks start seconds apart)."""
    body = json.dumps({"host": identity.host, "build": identity.build.to_json()}).encode()
    put = urllib.request.Request(_kv_url(addr, port, identity.rank), data=body, method="PUT")
    with urllib.request.urlopen(put, timeout=timeout):
        pass
    deadline = time.monotonic() + timeout
    found: dict[int, RankBuild] = {}
    while True:
        for rank in range(size):
            if rank in found:
                continue
            try:
                with urllib.request.urlopen(_kv_url(addr, port, rank), timeout=timeout) as resp:
                    data = json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:  # not posted yet
                    continue
                raise
            found[rank] = RankBuild(rank, str(data["host"]),
                                    BuildIdentity.from_json(data["build"]))
        if len(found) == size:
            return [found[r] for r in range(size)]
        if time.monotonic() > deadline:
            missing = sorted(set(range(size)) - set(found))
            raise TimeoutError(f"ranks {missing} did not post their Horovod build within "
                               f"{timeout:.0f}s")
        time.sleep(0.05)


def exchange_mpi(identity: RankBuild) -> list[RankBuild]:
    """Every rank's identity through MPI, before Horovod starts (it then uses this MPI)."""
    from mpi4py import MPI  # loaded only where an MPI launcher started the job

    gathered = MPI.COMM_WORLD.allgather(
        json.dumps({"rank": identity.rank, "host": identity.host,
                    "build": identity.build.to_json()}))
    out = []
    for rank, text in enumerate(gathered):
        data = json.loads(text)
        out.append(RankBuild(rank, str(data["host"]), BuildIdentity.from_json(data["build"])))
    return out


def check_same_build(build: BuildIdentity, environ: Mapping[str, str],
                     timeout: float = 60.0) -> list[RankBuild]:
    """Every rank's build (one entry when not checked); raises BuildMismatch, on every
    rank, where they differ. Call on every rank before `hvd.init()`."""
    host = socket.gethostname()
    gloo = gloo_rendezvous(environ)
    if gloo is not None and gloo[3] > 1:
        addr, port, rank, size = gloo
        builds = exchange_kv(RankBuild(rank, host, build), addr, port, size, timeout)
    elif mpi_world_size(environ) > 1:
        from mpi4py import MPI  # see exchange_mpi

        builds = exchange_mpi(RankBuild(MPI.COMM_WORLD.Get_rank(), host, build))
    else:
        return [RankBuild(0, host, build)]
    problem = mismatch(builds)
    if problem:
        raise BuildMismatch(problem)
    return builds
