"""A job on a node range (`--nodes MIN-MAX`): the global batch must be fixed and divide.

Slurm starts such a job on any count within the range, and a requeued job may
come back on another one (a node drained or failed in between). hpcdp resumes a
checkpoint on any number of ranks when the global batch is kept
(hpcdp.train.checkpoints), and the peak learning rate follows the global batch
(hpcdp.train.schedule). A per-rank batch (data.batch_size alone) would make the
global batch, the peak rate and so the training itself depend on what Slurm
granted: refused here, before anything is submitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hpcdp import config as cfgmod
from hpcdp.cluster.render import RenderError, node_range


def ranks_per_node(options: Mapping[str, object]) -> int:
    """The ranks each node runs under render()'s options: one per GPU, else per task."""
    gpus = options.get("gpus_per_node") or 0
    tasks = options.get("ntasks_per_node") or 0
    return int(gpus or tasks or 1)


def batch_error(low: int, high: int, per_node: int, global_batch: int) -> str | None:
    """Why `global_batch` cannot train on every node count in [low, high] (pure)."""
    if global_batch < 1:
        return (f"--nodes {low}-{high}: set data.global_batch_size (in the config or as an "
                "override): with a per-rank data.batch_size the global batch, and with it the "
                "peak learning rate and the training's dynamics, would change with the nodes "
                "Slurm grants")
    bad = [n for n in range(low, high + 1) if global_batch % (n * per_node)]
    if bad:
        counts = ", ".join(f"{n} node(s) = {n * per_node} ranks" for n in bad)
        return (f"--nodes {low}-{high}: data.global_batch_size={global_batch} does not divide "
                f"over {counts}; choose a multiple of every rank count in the range")
    return None


def configured_global_batch(config: str | None, overrides: Sequence[str]) -> int:
    """data.global_batch_size from the config file and the overrides (the last one wins),
    read without the training's path checks: the data may live where only the job sees it."""
    value: object = 0
    try:
        mapping = cfgmod.load_file(config) if config is not None else {}
        value = mapping.get("data", {}).get("global_batch_size", 0)
        for text in overrides:
            section, key, parsed = cfgmod.parse_override(text)
            if (section, key) == ("data", "global_batch_size"):
                value = parsed
    except (cfgmod.ConfigError, OSError) as e:
        raise RenderError(f"--nodes range: cannot read the global batch: {e}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RenderError(f"data.global_batch_size must be an integer, got {value!r}")
    return value


def check(options: Mapping[str, object]) -> None:
    """Raise RenderError when render()'s `options` ask for a node range that the
    training's batch cannot follow; nothing to check for a fixed count."""
    low, high = node_range(options.get("nodes", 1))
    if low == high:
        return
    overrides = options.get("overrides") or ()
    config = options.get("config")
    batch = configured_global_batch(config if isinstance(config, str) else None,
                                    [str(o) for o in overrides])  # type: ignore[union-attr]
    why = batch_error(low, high, ranks_per_node(options), batch)
    if why:
        raise RenderError(why)
