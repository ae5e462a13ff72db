"""Write one token split from every rank's documents into ONE file (collective).

Each rank holds its own share of the documents, already tokenized, in corpus
order (rank r's documents all come before rank r+1's). The ranks find where
their tokens and documents start with exclusive prefix sums (MPI ``Exscan``),
and the totals with an all-reduce; then every rank writes its own contiguous
slice of ``tokens`` and of ``doc_offsets`` through parallel HDF5 (driver
``mpio``, independent transfers: each slice is contiguous and no two ranks
write the same bytes). The file is written under a temporary name and renamed
when complete, so a failed run never replaces a good file.

Also the pieces both token recipes share: refusing to replace outputs without
``--overwrite``, agreeing on errors before any collective file operation, and
messages prefixed by the rank.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdp.data import tokens as tk

#: Tokens per write call at most: MPI-IO counts are 32-bit, and smaller calls bound staging.
WRITE_TOKENS = 1 << 26


class TokenPrepError(ValueError):
    """Bad preparation input or options: the message names the file or option."""


def crash_stacks() -> None:
    """Print every thread's Python stack if the process dies of a fatal signal (a rank killed
    in MPI or HDF5 otherwise leaves only the launcher's "exited on signal N")."""
    if not faulthandler.is_enabled():
        with contextlib.suppress(OSError, ValueError):  # stderr without a file descriptor
            faulthandler.enable(all_threads=True)


def world() -> Any:
    """mpi4py's COMM_WORLD under an MPI launcher, else a one-process world."""
    from hpcdp.data.prep import world as prep_world

    return prep_world()


def check_world(comm: Any) -> None:
    tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1") or 1)
    if comm.size == 1 and tasks > 1:
        raise TokenPrepError(
            f"started as {tasks} Slurm tasks but MPI sees one rank: use srun --mpi=pmix")
    if comm.size > 1:
        import h5py

        if not h5py.get_config().mpi:
            raise TokenPrepError("this h5py is built without MPI; ranks cannot share one file")


def check_outputs(out_dir: str, names: Sequence[str], overwrite: bool) -> None:
    """The output folder is usable, and nothing in it is replaced unless `overwrite`."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise TokenPrepError(f"--out {out_dir}: exists and is not a folder")
    existing = [n for n in names if os.path.exists(os.path.join(out_dir, n))]
    if existing and not overwrite:
        raise TokenPrepError(
            f"--out {out_dir}: {', '.join(existing)} already exist; pass --overwrite to "
            "replace them")
    os.makedirs(out_dir, exist_ok=True)
    if not os.access(out_dir, os.W_OK):
        raise TokenPrepError(f"--out {out_dir}: not writable")


def agree(comm: Any, error: str | None) -> str | None:
    """Collective: the first rank's error (in rank order), the same on every rank."""
    errors = [e for e in comm.allgather(error) if e]
    return errors[0] if errors else None


def say(comm: Any, prog: str, message: str) -> None:
    prefix = f"[rank {comm.rank}] " if comm.size > 1 else ""
    print(f"{prefix}{prog}: {message}", file=sys.stderr, flush=True)


def _exscan(comm: Any, value: int) -> int:
    """Exclusive prefix sum over ranks (0 on rank 0)."""
    if comm.size == 1:
        return 0
    got = comm.exscan(value)
    return 0 if got is None or comm.rank == 0 else int(got)


def _allreduce(comm: Any, value: int, op: str = "sum") -> int:
    if comm.size == 1:
        return value
    from mpi4py import MPI

    return int(comm.allreduce(value, op=MPI.MAX if op == "max" else MPI.SUM))


def local_errors(docs: Sequence[np.ndarray], meta: tk.TokenMeta, where: str) -> str | None:
    """A problem with this rank's documents, or None: ids outside the vocabulary."""
    for i, doc in enumerate(docs):
        if len(doc) and (int(doc.max()) >= meta.vocab_size or int(doc.min()) < 0):
            bad = doc[(doc >= meta.vocab_size) | (doc < 0)][0]
            return (f"{where}: document {i} of this rank has token id {int(bad)}, outside the "
                    f"vocabulary of {meta.vocab_size}")
    return None


def write_split(out_dir: str, name: str, docs: Sequence[np.ndarray], meta: tk.TokenMeta,
                comm: Any) -> str:
    """Collective: write ``out_dir/NAME.h5`` from every rank's `docs`; return its path.

    Raises `TokenPrepError` on every rank (before the file is created) when the
    split has no documents or a token id is outside the vocabulary.
    """
    final = os.path.join(out_dir, f"{name}.h5")
    error = agree(comm, local_errors(docs, meta, final))
    if error:
        raise TokenPrepError(error)
    lengths = np.array([len(d) for d in docs], np.int64)
    n_tok, n_doc = int(lengths.sum()), len(docs)
    tok_start, doc_start = _exscan(comm, n_tok), _exscan(comm, n_doc)
    total_tok, total_doc = _allreduce(comm, n_tok), _allreduce(comm, n_doc)
    top = _allreduce(comm, max((int(d.max()) for d in docs if len(d)), default=0), "max")
    if total_doc == 0:
        raise TokenPrepError(f"{final}: the {name} split has no documents")
    from hpcdp.data.prep import replacing

    with replacing(final, comm) as tmp, _open(tmp, comm) as f:
        tokens, offsets = tk.create_datasets(f, meta, total_tok, total_doc, top)
        _write_tokens(tokens, docs, tok_start, meta.dtype)
        local = tk.offsets_from_lengths(lengths, tok_start)
        if comm.rank == comm.size - 1:
            offsets[doc_start : doc_start + n_doc + 1] = local
        elif n_doc:
            offsets[doc_start : doc_start + n_doc] = local[:-1]
    return final


def _open(path: str, comm: Any) -> Any:
    import h5py

    if comm.size == 1:
        return h5py.File(path, "w")
    return h5py.File(path, "w", driver="mpio", comm=comm)


def _write_tokens(dset: Any, docs: Sequence[np.ndarray], start: int, dtype: np.dtype) -> None:
    """This rank's documents into ``dset[start:...]``, a bounded slab at a time."""
    pending: list[np.ndarray] = []
    size = 0
    for doc in [*docs, None]:
        if doc is not None:
            pending.append(doc)
            size += len(doc)
        if pending and (doc is None or size >= WRITE_TOKENS):
            slab = np.concatenate(pending).astype(dtype)
            dset[start : start + len(slab)] = slab
            start += len(slab)
            pending, size = [], 0
