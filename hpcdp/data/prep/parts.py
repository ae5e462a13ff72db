"""Per-block spill files and the resume manifest of a preparation.

Placeholder with the agreed API until the frame's own module is merged.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Any

import numpy as np

from hpcdp.data.prep.frame import PrepError, agree

WORK = ".hpcdp-prep"


class Parts:
    """Collective: the work folder OUT/.hpcdp-prep/ of one recipe run."""

    def __init__(self, out_dir: str, recipe: str, fingerprint: dict, comm: Any,
                 resume: bool) -> None:
        self.root = os.path.join(out_dir, WORK)
        self.comm = comm
        want = {"recipe": recipe, **fingerprint}
        error = None
        path = os.path.join(self.root, "fingerprint.json")
        if os.path.isdir(self.root):
            if not resume:
                error = (f"{self.root}: a partial preparation is there; pass --resume to "
                         "continue it, or remove it")
            else:
                try:
                    with open(path) as fh:
                        have = json.load(fh)
                except (OSError, ValueError):
                    have = {}
                differ = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
                if differ:
                    error = (f"{self.root}: made with other options ({', '.join(differ)}); "
                             "remove it or run with the same options")
        error = agree(comm, error)
        if error:
            raise PrepError(error)
        comm.Barrier()
        if comm.rank == 0 and not os.path.isdir(self.root):
            os.makedirs(self.root + ".tmp", exist_ok=True)
            with open(os.path.join(self.root + ".tmp", "fingerprint.json"), "w") as fh:
                json.dump(want, fh, sort_keys=True)
            os.replace(self.root + ".tmp", self.root)
        comm.Barrier()

    def _dir(self, split: str, index: int) -> str:
        return os.path.join(self.root, split, f"{index:08d}")

    def done(self, split: str, index: int) -> bool:
        return os.path.isdir(self._dir(split, index))

    def save(self, split: str, index: int, **arrays: np.ndarray) -> None:
        final = self._dir(split, index)
        tmp = f"{final}.tmp-{uuid.uuid4().hex[:8]}"
        os.makedirs(tmp)
        for name, arr in arrays.items():
            np.save(os.path.join(tmp, f"{name}.npy"), np.asarray(arr))
        os.replace(tmp, final)

    def load(self, split: str, index: int) -> dict[str, np.ndarray]:
        d = self._dir(split, index)
        return {n[:-4]: np.load(os.path.join(d, n), mmap_mode="r")
                for n in sorted(os.listdir(d)) if n.endswith(".npy")}

    def rows(self, split: str, index: int) -> int:
        arrays = self.load(split, index)
        return len(next(iter(arrays.values()))) if arrays else 0

    def save_state(self, name: str, obj: Any) -> None:
        if self.comm.rank == 0:
            tmp = self.path(f"{name}.json.tmp")
            with open(tmp, "w") as fh:
                json.dump(obj, fh)
            os.replace(tmp, self.path(f"{name}.json"))

    def load_state(self, name: str) -> Any:
        try:
            with open(self.path(f"{name}.json")) as fh:
                return json.load(fh)
        except FileNotFoundError:
            return None

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def remove(self) -> None:
        self.comm.Barrier()
        if self.comm.rank == 0:
            shutil.rmtree(self.root, ignore_errors=True)
        self.comm.Barrier()
