"""Per-block part files and the record that lets a preparation resume: ``OUT/.hpcdp-prep/``.

Every rank turns each of its input blocks into a part (a folder of .npy arrays, one per
output dataset plus whatever the recipe needs later) before the final files are written
from the parts in block order (`merge.write_parts`). A part is written under a temporary
name and renamed, so after a kill (a time limit's SIGTERM, then SIGKILL) it is there whole
or not at all, and a resumed run redoes only the blocks without one. ``fingerprint.json``
holds the recipe, the checked inputs that change the output and each input file's size and
time (`fingerprint`; not the number of ranks, which changes nothing): a resumed run with
other inputs is refused, naming them, instead of mixing two datasets. Without ``--resume``
an existing work folder is refused too, so a partial output is never silently reused. The
cost of the design: the output is written twice (parts, then the final files), and the work
folder needs as much disk as the output until it is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from hpcdp.data.prep import stall
from hpcdp.data.prep.world import PrepError, agree

#: The work folder of a preparation in progress, inside its output folder.
WORK_DIR = ".hpcdp-prep"

FINGERPRINT = "fingerprint.json"
#: Each part's record of its arrays' lengths, written last.
META = "meta.json"
#: What `merge.replacing` names a file while it is written, and what the MPI-IO library
#: may make beside it (Open MPI's ``NAME.locktest.N``, left when the job is killed).
_STALE = re.compile(r"\..+\.tmp-[0-9a-f]{12}(\.locktest\.[0-9]+)?")


def work_dir(out_dir: str) -> str:
    return os.path.join(out_dir, WORK_DIR)


#: Metadata of a checked input's dataclass field that changes no byte of the output (the
#: MPI-IO transfer mode), or that follows from the other fields (the sources they open):
#: `fingerprint` leaves it out, so that a resume may change it.
SAME_BYTES = {"same_bytes": True}


def fingerprint(*inputs: Any, files: Iterable[str] = ()) -> dict[str, Any]:
    """What a resumed run must share with the run it continues: `inputs` (dataclasses, their
    `SAME_BYTES` fields left out and the fields of a dataclass field merged in, or
    mappings; JSON values), the checked values the output
    is made from, merged; and the size and modification time of each of `files` (as
    ``file PATH``), so that an input changed in between is refused too.

    Never the parsed command line: an option that changes no byte (``--stall-timeout``,
    ``--resume``, progress) must not block a resume, and a list of such options misses
    the next one added; a value the output is made from is checked, so it is here.
    """
    found: dict[str, Any] = {}
    for value in inputs:
        if dataclasses.is_dataclass(value):
            fields = [f for f in dataclasses.fields(value) if not f.metadata.get("same_bytes")]
            value = {f.name: getattr(value, f.name) for f in fields}
            for name, inner in list(value.items()):  # a dataclass field: its fields merged
                if dataclasses.is_dataclass(inner):
                    del value[name]
                    found.update(fingerprint(inner))
        found.update(value)
    for path in files:
        stat = os.stat(path)
        found[f"file {os.path.realpath(path)}"] = [stat.st_size, stat.st_mtime_ns]
    return found


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys whose values differ between two fingerprints, as ``key: old -> new``."""
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def _write_json(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, sort_keys=True)
    os.replace(tmp, path)


def _remove_leftovers(work: str) -> None:
    """What a run killed while making or removing its work folder left beside it."""
    parent, name = os.path.split(work)
    if os.path.isdir(parent):
        for entry in os.listdir(parent):
            if entry.startswith((f"{name}.tmp-", f"{name}.removed-")):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def _remove_stale_temporaries(out_dir: str) -> None:
    """The final files' temporaries (`merge.replacing`) left by the killed run."""
    for name in os.listdir(out_dir):
        if _STALE.fullmatch(name):
            os.remove(os.path.join(out_dir, name))


#: Bytes of a growing array's .npy header: room for any length, rewritten when it is closed.
_HEADER_BYTES = 128


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A version 1.0 .npy header of exactly `_HEADER_BYTES` bytes (padded with spaces, as
    the format allows), so it can be written before the length is known and again after."""
    text = str({"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                "shape": tuple(int(n) for n in shape)})
    room = _HEADER_BYTES - 10  # magic (6), version (2), header length (2)
    if len(text) >= room:
        raise ValueError(f"a .npy header for {dtype} {shape} needs more than {room} bytes")
    return (b"\x93NUMPY\x01\x00" + room.to_bytes(2, "little")
            + (text.ljust(room - 1) + "\n").encode("latin1"))


class PartWriter:
    """The arrays of one part written a slice at a time: each .npy file grows by `append`;
    `close` writes each header with its final shape."""

    def __init__(self, folder: str, dtypes: dict[str, Any]) -> None:
        self.dtypes = {key: np.dtype(d) for key, d in dtypes.items()}
        self.rows = dict.fromkeys(dtypes, 0)
        self.shapes: dict[str, tuple[int, ...]] = {}  # each array's shape past its rows
        self.files = {}
        for key in dtypes:
            self.files[key] = open(os.path.join(folder, f"{key}.npy"), "wb")  # noqa: SIM115
            self.files[key].write(bytes(_HEADER_BYTES))

    def append(self, **arrays: np.ndarray) -> None:
        """Rows at the end of the named arrays; each of its part's dtype and row shape."""
        for key, array in arrays.items():
            array = np.ascontiguousarray(array)
            if array.dtype != self.dtypes[key]:
                raise ValueError(f"{key}: {array.dtype} appended to an array of "
                                 f"{self.dtypes[key]}")
            if self.shapes.setdefault(key, array.shape[1:]) != array.shape[1:]:
                raise ValueError(f"{key}: rows of shape {array.shape[1:]} appended to rows "
                                 f"of shape {self.shapes[key]}")
            if array.size:
                self.files[key].write(memoryview(array).cast("B"))
            self.rows[key] += len(array)

    def close(self) -> dict[str, int]:
        """Every file's header written with its shape, the files closed; their rows."""
        for key, fh in self.files.items():
            fh.seek(0)
            fh.write(npy_header(self.dtypes[key], (self.rows[key], *self.shapes.get(key, ()))))
            fh.close()
        return dict(self.rows)

    def abandon(self) -> None:
        for fh in self.files.values():
            fh.close()


class Parts:
    """The work folder of one preparation (collective to make and to remove)."""

    def __init__(self, out_dir: str, recipe: str, fingerprint: dict[str, Any], comm: Any,
                 resume: bool) -> None:
        self.dir = work_dir(out_dir)
        self.comm = comm
        self.fingerprint = json.loads(json.dumps({"recipe": recipe, **fingerprint},
                                                 sort_keys=True))
        self.resumed = False
        error = None
        if comm.rank == 0:
            try:
                self.resumed = self._open(resume)
            except (PrepError, OSError) as exc:
                error = str(exc)
        error = agree(comm, error)
        if error:
            raise PrepError(error)
        self.resumed = comm.bcast(self.resumed, root=0)

    def _open(self, resume: bool) -> bool:
        """Rank 0: check or make the work folder; whether earlier parts are kept."""
        _remove_leftovers(self.dir)
        there = os.path.exists(self.dir)
        if there and not resume:
            raise PrepError(f"{self.dir}: a partial preparation is there (a run that did not "
                            "finish); pass --resume to continue it with the same options, or "
                            "remove the folder to start again")
        if there:
            old = self._read_fingerprint()
            _remove_stale_temporaries(os.path.dirname(self.dir))
            changed = differences(old, self.fingerprint)
            if changed:
                raise PrepError(f"{self.dir}: --resume with other options than the run it "
                                f"continues ({'; '.join(changed)}); use the same options, or "
                                "remove the folder to start again")
            return True
        # Made whole under a temporary name, so a kill at any moment leaves either no work
        # folder or one with its fingerprint.
        tmp = f"{self.dir}.tmp-{uuid.uuid4().hex[:8]}"
        os.makedirs(tmp)
        _write_json(os.path.join(tmp, FINGERPRINT), self.fingerprint)
        os.rename(tmp, self.dir)
        return False

    def _read_fingerprint(self) -> dict[str, Any]:
        path = os.path.join(self.dir, FINGERPRINT)
        try:
            with open(path) as fh:
                old = json.load(fh)
        except (OSError, ValueError) as exc:
            raise PrepError(f"{path}: cannot be read ({exc}); remove {self.dir} to start "
                            "again") from None
        if not isinstance(old, dict):
            raise PrepError(f"{path}: not a fingerprint; remove {self.dir} to start again")
        return old

    # -- parts --------------------------------------------------------------------------

    def _part(self, split: str, index: int) -> str:
        return os.path.join(self.dir, split, f"{index:07d}")

    def done(self, split: str, index: int) -> bool:
        """Whether block `index` of `split` has its part (whole: parts appear by rename)."""
        return os.path.isdir(self._part(split, index))

    def save(self, split: str, index: int, tally: dict[str, int] | None = None, /,
             **arrays: np.ndarray) -> None:
        """Block `index` of `split` as one .npy per array, under a temporary name renamed
        into place. Its rows (`rows`) are the length of the first array. `tally`: the
        block's own counts (clicks, lines skipped), recorded with it for `merge.part_layout`
        to sum, so that no part is read again only to be counted."""
        tmp = self._begin(split, index)
        lengths = {}
        for key, array in arrays.items():
            array = np.ascontiguousarray(array)
            np.save(os.path.join(tmp, f"{key}.npy"), array, allow_pickle=False)
            lengths[key] = len(array)
        self._commit(tmp, split, index, lengths, tally)

    @contextlib.contextmanager
    def saving(self, split: str, index: int, **dtypes: Any) -> Iterator[PartWriter]:
        """`save` for a block made a slice at a time: the arrays (of these dtypes, in this
        order) grow by `PartWriter.append`, so the block is never held whole (a gzip file's
        documents, counted only as they are read). The part appears when the body ends;
        if it raises, nothing is left of it."""
        tmp = self._begin(split, index)
        writer = PartWriter(tmp, dtypes)
        try:
            yield writer
            lengths = writer.close()
        except BaseException:
            writer.abandon()
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._commit(tmp, split, index, lengths)

    def _begin(self, split: str, index: int) -> str:
        """A new temporary folder beside block `index`'s part, its name hidden."""
        folder, name = os.path.split(self._part(split, index))
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
        os.makedirs(tmp)
        return tmp

    def _commit(self, tmp: str, split: str, index: int, lengths: dict[str, int],
                tally: dict[str, int] | None = None) -> None:
        """The arrays in `tmp` (of `lengths`, in that order) become block `index`'s part."""
        _write_json(os.path.join(tmp, META), {"lengths": lengths, "order": list(lengths),
                                              "tally": {k: int(v) for k, v in
                                                        (tally or {}).items()}})
        final = self._part(split, index)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):  # not a part saved meanwhile: a real failure
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        stall.mark()

    def _meta(self, split: str, index: int) -> dict[str, Any]:
        with open(os.path.join(self._part(split, index), META)) as fh:
            return json.load(fh)

    def load(self, split: str, index: int) -> dict[str, np.ndarray]:
        """Block `index`'s arrays, memory-mapped (read as they are copied)."""
        folder = self._part(split, index)
        meta = self._meta(split, index)
        out = {}
        for key in meta["order"]:
            path = os.path.join(folder, f"{key}.npy")
            out[key] = np.load(path, mmap_mode="r" if meta["lengths"][key] else None,
                               allow_pickle=False)
        return out

    def rows(self, split: str, index: int) -> int:
        """Rows of block `index`: the length of the first array saved."""
        meta = self._meta(split, index)
        return int(meta["lengths"][meta["order"][0]]) if meta["order"] else 0

    def length(self, split: str, index: int, key: str) -> int:
        """The length of one array of block `index` (rows differ between arrays: tokens and
        documents)."""
        return int(self._meta(split, index)["lengths"][key])

    def lengths(self, split: str, index: int) -> dict[str, int]:
        """The length of every array of block `index`, in the order saved."""
        meta = self._meta(split, index)
        return {key: int(meta["lengths"][key]) for key in meta["order"]}

    def tally(self, split: str, index: int) -> dict[str, int]:
        """The counts block `index` was saved with (`save`)."""
        return dict(self._meta(split, index).get("tally", {}))

    # -- a recipe's own state -------------------------------------------------------------

    def path(self, name: str) -> str:
        """A recipe's own file or folder in the work folder (e.g. a vocabulary shard)."""
        return os.path.join(self.dir, name)

    def save_state(self, name: str, obj: Any) -> None:
        """Small JSON for a completed phase of the recipe (written whole or not at all)."""
        _write_json(self.path(f"state-{name}.json"), obj)

    def load_state(self, name: str) -> Any:
        """What `save_state` saved under `name`, or None."""
        try:
            with open(self.path(f"state-{name}.json")) as fh:
                return json.load(fh)
        except FileNotFoundError:
            return None

    def remove(self) -> None:
        """Collective: the work folder goes, once every rank is done with the parts."""
        self.comm.Barrier()
        if self.comm.rank == 0:  # renamed first: a kill mid-removal leaves no work folder
            gone = f"{self.dir}.removed-{uuid.uuid4().hex[:8]}"  # without its fingerprint
            os.rename(self.dir, gone)
            shutil.rmtree(gone, ignore_errors=True)
        self.comm.Barrier()

    def __enter__(self) -> Parts:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: Any) -> None:
        """Done: the parts go. Bad input found on the way (a `PrepError`, raised on every
        rank alike): they go too, so that nothing is left written. Any other failure (a
        kill, a full disk) keeps them for ``--resume``."""
        if kind is None or issubclass(kind, PrepError):
            self.remove()

