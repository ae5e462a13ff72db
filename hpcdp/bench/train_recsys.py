"""The click model in `hpcdp bench train` (`--models dlrm`): sparse against dense gradients.

The DLRM of hpcdp/configs/clicks.toml trains on two click logs that differ only
in their table sizes, each under both ways of averaging the embedding gradients
(`horovod.sparse_grads`): Horovod's all-gather of the looked-up rows (`sparse`)
and `sparse_as_dense` (`dense`). Where the tables are large and a batch touches
few of their rows, the sparse path should send far less; where the tables are
small and a batch touches most rows, the dense all-reduce sends about as much
in one fused collective instead of two all-gathers per table. The benchmark
measures which wins where.

Bytes per step: each run logs `table_mb`, the table gradients one rank hands to
Horovod per batch (hpcdp.tasks.recsys; its mean is the run's `table_mib`); the
bytes a rank sends follow from it, the MLPs' gradient bytes and the ring cost
model (`grads.bytes_sent_per_rank`).
One rank sends nothing, and there both modes run the same code (one rank's
optimizers are not wrapped), so their 1-rank figures differ only by noise.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdp import config as hc
from hpcdp.bench import common
from hpcdp.tasks import defaults

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "clicks.toml"
MODES = ("sparse", "dense")
#: Click-log options of each table size (datasets/clicks.py): `small` has 1,105 table
#: rows, most of them touched by a batch of 256; `large` is the generator's default
#: (304,527 rows), of which a batch touches a few thousand.
TABLES: dict[str, tuple[str, ...]] = {
    "small": ("--users", "100", "--items", "50", "--min-table", "10", "--max-table", "100"),
    "large": (),
}
VAL_ROWS = 1024  # the final validation scores every row: kept short


@dataclass(frozen=True)
class Variant:
    """One configuration of the click model: a table size and a gradient mode."""

    tables: str
    mode: str

    @property
    def label(self) -> str:
        return f"dlrm_{self.tables}_{self.mode}"


def variants(tables: Sequence[str] = tuple(TABLES)) -> list[Variant]:
    return [Variant(t, m) for t in tables for m in MODES]


def rows_needed(steps: int, batch: int, ranks: int) -> int:
    """Training rows for `steps` steps of `batch` rows on each of `ranks` ranks in one epoch
    (an epoch's end would add a validation pass to the timed windows' neighbours)."""
    return steps * batch * ranks + batch * ranks


def prep_command(out: Path, tables: str, rows: int) -> list[str]:
    """The click log of `tables` size with `rows` training rows, written by one process."""
    if tables not in TABLES:
        raise ValueError(f"table size {tables!r}: choose one of {', '.join(TABLES)}")
    return [sys.executable, "-m", "hpcdp.data.prep.clicks.recipe", "--out", str(out),
            "--rows", str(rows), "--val-rows", str(VAL_ROWS), *TABLES[tables]]


def overrides(v: Variant) -> list[str]:
    """`hpcdp train` overrides beside the config file: the gradient mode; no scan of every
    id (the generator's fresh files); validation in large batches (it is not timed)."""
    return [f"horovod.sparse_grads={v.mode}", "recsys.check_data=false",
            "data.val_batch_size=1024"]


# --------------------------------------------------------------------------- pure


def sent_mib(mode: str, payload_mib: float, mlp_bytes: int, ranks: int) -> float:
    """MiB one rank sends per step on `ranks` ranks, each handing `payload_mib` of table
    gradients to Horovod (the ring model of hpcdp.runtime.sparse_grads)."""
    # torch only when called: `hpcdp bench train`, the parent, imports this module.
    from hpcdp.runtime import sparse_grads as grads

    payload = payload_mib * 2**20
    return grads.bytes_sent_per_rank(mode, [payload] * ranks, mlp_bytes) / 2**20


def compare(summary: Mapping[str, Mapping[str, Any]], payloads: Mapping[str, float],
            mlp_bytes: int, ranks: int = 2,
            per_round: Mapping[str, Mapping[int, float]] | None = None,
            ) -> dict[str, dict[str, Any]]:
    """Per table size: each mode's rates, efficiency and bytes, and which mode wins
    (the higher median `ranks`-rank samples/s) by how much; with `per_round` (each
    label's `ranks`-rank samples/s by round), in how many rounds it won too."""
    out: dict[str, dict[str, Any]] = {}
    for tables in TABLES:
        modes = {}
        for v in (Variant(tables, m) for m in MODES):
            s = summary.get(v.label)
            if s is None:
                continue
            modes[v.mode] = {
                "samples_per_s_1": s["samples_per_s_1"],
                f"samples_per_s_{ranks}": s[f"samples_per_s_{ranks}"],
                "efficiency": s["efficiency"], "step_ms": s["step_ms"],
                "comm_ms": s["comm_ms"], "table_mib": payloads[v.label],
                "sent_mib": sent_mib(v.mode, payloads[v.label], mlp_bytes, ranks)}
        if not modes:
            continue
        entry: dict[str, Any] = {"modes": modes}
        if len(modes) == len(MODES):
            rate = {m: modes[m][f"samples_per_s_{ranks}"] for m in MODES}
            winner = max(rate, key=rate.__getitem__)
            loser = min(rate, key=rate.__getitem__)
            entry.update(winner=winner, speedup=rate[winner] / rate[loser])
            if per_round is not None:
                entry.update(rounds_won(per_round[Variant(tables, winner).label],
                                        per_round[Variant(tables, loser).label]))
        out[tables] = entry
    return out


def rounds_won(winner: Mapping[int, float], loser: Mapping[int, float]) -> dict[str, int]:
    """In how many of the rounds that measured both the winner of the medians was faster."""
    both = [r for r in winner if r in loser]
    return {"rounds_won": sum(winner[r] > loser[r] for r in both), "rounds": len(both)}


def table(comparison: Mapping[str, Mapping[str, Any]], ranks: int = 2) -> str:
    rows = []
    for tables, entry in comparison.items():
        for mode, m in entry["modes"].items():
            won = ""
            if entry.get("winner") == mode:
                won = f"{entry['speedup']:.2f}x"
                if entry.get("rounds"):
                    won += f" ({entry['rounds_won']}/{entry['rounds']} rounds)"
            rows.append([f"{tables} {mode}", m["samples_per_s_1"], m[f"samples_per_s_{ranks}"],
                         f"{m['efficiency']:.0%}", m["step_ms"], m["comm_ms"],
                         f"{m['table_mib']:.3f}", f"{m['sent_mib']:.3f}", won])
    headers = ["tables mode", "1 rank/s", f"{ranks} ranks/s", "efficiency", "step ms",
               "comm ms", "table MiB/rank", "sent MiB/step", "wins by"]
    return common.format_table(headers, rows)


# --------------------------------------------------------------------------- model size


def mlp_bytes(overrides_: Sequence[str], data: Path) -> int:
    """Bytes of the MLPs' gradients (float32) of the model the runs train: the config
    file with the same overrides, its shape read from the data's schema."""
    # torch only when called: `hpcdp bench train`, the parent, imports this module.
    from hpcdp.tasks.recsys import schema

    cfg = hc.build(CONFIG, [f"data.path={data}", *overrides_], task_defaults=defaults)
    s, r = schema(str(data / cfg.data.train_file)), cfg.recsys
    return mlp_bytes_of(s.dense_features, len(s.table_sizes), r.embed_dim, r.bottom, r.top)


def mlp_bytes_of(dense_features: int, fields: int, embed_dim: int, bottom: Sequence[int],
                 top: Sequence[int]) -> int:
    """Bytes of a DLRM's float32 parameters outside its tables (one-row tables built)."""
    # torch only when called: `hpcdp bench train`, the parent, imports this module.
    from hpcdp.models.dlrm import DLRM, split_params

    _, rest = split_params(DLRM(dense_features, [1] * fields, embed_dim, bottom, top))
    return 4 * sum(p.numel() for _, p in rest)
