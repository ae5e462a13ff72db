"""Collective: stage the data on each node before the readers open (docs/staging.md).

1. Every rank, alone: expand data.stage_dir in its own environment, check that the
   folder can be used (hpcdp.data.staging.copy.check_dir) and that the sources exist.
2. Collective `hpcdp.stage.check`: every rank's node, folder and error. Any error
   stops every rank, each naming the node and path; so does a node whose ranks
   expanded different folders.
3. The lowest rank of each node copies (or keeps identical copies, or finds too
   little room and reads in place); the node's other ranks wait in
4. collective `hpcdp.stage.done`: every node's result (a failed copy stops every rank).
Each rank then reads from its own node's result.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path

from hpcdp.config import Config
from hpcdp.data.staging import copy as stage_copy
from hpcdp.data.staging.plan import (
    NodeResult,
    StageError,
    copier_ranks,
    copy_errors,
    expand,
    node_errors,
)
from hpcdp.runtime import dist, watchdog
from hpcdp.runtime.placement import node_name

log = logging.getLogger("hpcdp.train")
#: Test aid: the node name staging groups this rank by, in place of Slurm's or the host's
#: (so ranks on one machine can play separate nodes without upsetting placement checks).
NODE_ENV = "HPCDP_STAGE_NODE"


def staging_node(environ: Mapping[str, str]) -> str:
    return environ.get(NODE_ENV) or node_name(environ, socket.gethostname())


def read_paths(cfg: Config) -> dict[str, str]:
    """The files the readers of `cfg` open: {"train": path, "val": path}."""
    root = cfg.data.path
    return {"train": os.path.join(root, cfg.data.train_file),
            "val": os.path.join(root, cfg.data.val_file)}


def local_check(cfg: Config) -> tuple[str | None, str | None]:
    """(this node's stage dir, None) or (None, why it cannot be used): no collective."""
    try:
        folder = expand(cfg.data.stage_dir, os.environ)
        stage_copy.check_not_source(folder, cfg.data.path)
        stage_copy.check_dir(folder)
        stage_copy.check_sources(sources(cfg))
    except StageError as e:
        return None, str(e)
    return folder, None


def sources(cfg: Config) -> dict[str, Path]:
    return {"train": Path(cfg.data.path) / cfg.data.train_file,
            "val": Path(cfg.data.path) / cfg.data.val_file}


def copy_on_node(cfg: Config, node: str, folder: str) -> NodeResult | str:
    """The copier's result, or its error as text naming the node (sent to every rank)."""
    names = {"train": cfg.data.train_file, "val": cfg.data.val_file}
    try:
        return stage_copy.stage_node(node, folder, cfg.data.path, names)
    except (OSError, StageError) as e:
        return f"{node}: copying to {folder}: {e}"


def stage(cfg: Config, failed_before: bool = False) -> Config:
    """Collective when data.stage_dir is set: the config the readers use.

    The config returned differs from `cfg` only in data.path: this node's stage dir,
    or data.path itself where the node reads in place. `failed_before`: this rank
    already failed (its error is agreed on next); then no node copies anything.
    """
    if not cfg.data.stage_dir:
        return cfg
    rank = dist.rank()
    node = staging_node(os.environ)
    watchdog.phase("data staging")
    folder, error = local_check(cfg)
    with watchdog.waiting("allgather hpcdp.stage.check"):
        checks = dist.allgather_object((node, folder, error, failed_before),
                                       "hpcdp.stage.check")
    if any(c[3] for c in checks):
        return cfg
    nodes = [c[0] for c in checks]
    problem = node_errors(nodes, [c[1] for c in checks], [c[2] for c in checks])
    if problem:
        raise dist.AgreedError(problem)
    copiers = copier_ranks(nodes)
    assert folder is not None
    mine = copy_on_node(cfg, node, folder) if copiers[node] == rank else None
    with watchdog.waiting("allgather hpcdp.stage.done"):
        results = dist.allgather_object(mine, "hpcdp.stage.done")
    failed = copy_errors(results)
    if failed:
        raise dist.AgreedError(failed)
    done: list[NodeResult] = [r for r in results if isinstance(r, NodeResult)]
    for result in done if rank == 0 else []:
        (log.warning if result.warning else log.info)(result.warning or result.describe())
    here = results[copiers[node]]
    assert isinstance(here, NodeResult)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=here.read_root))
