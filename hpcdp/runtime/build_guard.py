"""Stop a job whose ranks run different Horovod builds, at start, naming them.

Under Gloo the check cannot go through Horovod itself: the Gloo controller's
first negotiation is already an all-reduce, and a rank with the pair all-reduce
waits for a message a stock rank never sends, until Gloo's timeout. So under
horovodrun --gloo every rank posts its build identity (hpcdp.runtime.hvd_build)
to the launcher's rendezvous key-value store (plain JSON over HTTP, the store
Gloo's own rendezvous uses, in a scope of hpcdp's) before Horovod starts, and
reads everyone's. Under the MPI controller (mpirun, horovodrun, srun) Horovod
negotiates through MPI, and an allgather (no all-reduce) is safe whatever the
builds: the identities are gathered right after `hvd.init()` (`check_gathered`).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping

from hpcdp.runtime.hvd_build import BuildIdentity, RankBuild, mismatch

#: The key-value store's scope for the identities (not one of Horovod's own).
KV_SCOPE = "hpcdp-build"


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


def _raise_if_mixed(builds: list[RankBuild]) -> list[RankBuild]:
    problem = mismatch(builds)
    if problem:
        raise BuildMismatch(problem)
    return builds


def check_before_init(build: BuildIdentity, environ: Mapping[str, str],
                      timeout: float = 60.0) -> list[RankBuild] | None:
    """Under horovodrun --gloo with several ranks: every rank's build, compared before
    `hvd.init()` (raises BuildMismatch on every rank where they differ). Elsewhere
    None: compare after init with `check_gathered`."""
    gloo = gloo_rendezvous(environ)
    if gloo is None or gloo[3] < 2:
        return None
    addr, port, rank, size = gloo
    return _raise_if_mixed(exchange_kv(RankBuild(rank, socket.gethostname(), build), addr,
                                       port, size, timeout))


def check_gathered(build: BuildIdentity, rank: int,
                   allgather: Callable[[dict[str, object]], list[dict[str, object]]]
                   ) -> list[RankBuild]:
    """Every rank's build through `allgather` (Horovod's allgather_object under the MPI
    controller, after init); raises BuildMismatch on every rank where they differ."""
    gathered = allgather({"rank": rank, "host": socket.gethostname(),
                          "build": build.to_json()})
    return _raise_if_mixed([RankBuild(int(g["rank"]), str(g["host"]),  # type: ignore[call-overload]
                                      BuildIdentity.from_json(g["build"]))  # type: ignore[arg-type]
                            for g in gathered])
