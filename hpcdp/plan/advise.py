"""What to change when the network sets the pace: compression or accumulation (pure).

For each node count, the step of each setting is predicted with the same model
(hpcdp.plan.model) and the bytes that setting hands to the all-reduce:

- none: the gradients as they are (float32);
- bf16: half of every bucket (`horovod.compression = "bf16"`; fp16 sends the same);
- PowerSGD at rank r (`horovod.compression = "powersgd"`): every matrix-shaped
  gradient that gains sent as its two rank-r factors, r (n + m) floats, the
  others whole, as the runtime lays them out (`powersgd_rounds`); in two rounds,
  P with the whole ones, then Q, after backward (each needs the whole gradient,
  and Q needs the reduced P), so none of it hides behind backward;
- accumulate k (`horovod.backward_passes_per_step = k`): k micro-batches per
  optimizer step and one all-reduce, so all-reduces per sample fall k-fold; the
  global batch per update grows k-fold with it, which is the accuracy cost.

`settings()` lists them by what they cost in accuracy, least first (measured in
docs/large-batch.md): the advice is the first that meets the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hpcdp.config import HorovodConfig
from hpcdp.plan.model import Network, Step, step_at

Shape = tuple[int, ...]

#: bf16 and fp16 send 2 bytes for every 4 of float32.
HALF = 0.5
#: Gradients with fewer elements go whole (horovod.powersgd_min_elements' default).
MIN_ELEMENTS = HorovodConfig().powersgd_min_elements


ASSUMPTIONS = (
    "bf16 halves every all-reduce; casting costs nothing",
    "PowerSGD: matrix-shaped gradients as rank-r factors in two rounds after backward "
    "(no overlap); its matrix products and orthogonalization cost nothing",
    "accumulate k: k micro-batches of the global batch per all-reduce, the last one's "
    "backward overlapping it; the global batch per update grows k-fold",
)


@dataclass(frozen=True)
class Setting:
    """One way to send fewer bytes: its label in the table and the config that selects it."""

    label: str
    overrides: tuple[str, ...]
    compression: str = "none"  # none | bf16 | powersgd
    rank: int = 0  # PowerSGD's
    accumulate: int = 1  # micro-batches per all-reduce


@dataclass(frozen=True)
class Outcome:
    """One setting at one node count."""

    setting: Setting
    nodes: int
    step_s: float  # per optimizer step (k micro-batches when accumulating)
    sent_bytes: int  # handed to the all-reduce per optimizer step
    samples_per_s: float
    efficiency: float  # over nodes x the 1-node samples/s with no compression


def settings(powersgd_rank: int, accumulate: int) -> list[Setting]:
    """The settings compared, cheapest in accuracy first: bf16 rounds each gradient once
    (no lasting error); PowerSGD carries its error to the next step (error feedback);
    accumulation changes the global batch, and with it the learning dynamics."""
    if powersgd_rank < 1 or accumulate < 2:
        raise ValueError(f"PowerSGD rank must be positive and accumulation at least 2, got "
                         f"{powersgd_rank} and {accumulate}")
    return [
        Setting("none", ()),
        Setting("bf16", ("horovod.compression=bf16",), "bf16"),
        Setting(f"powersgd rank {powersgd_rank}",
                ("horovod.compression=powersgd", f"horovod.powersgd_rank={powersgd_rank}"),
                "powersgd", rank=powersgd_rank),
        Setting(f"accumulate {accumulate}",
                (f"horovod.backward_passes_per_step={accumulate}",), accumulate=accumulate),
    ]


def powersgd_rounds(shapes: Sequence[Shape], rank: int, min_elements: int,
                    elem_bytes: int = 4) -> tuple[int, int]:
    """(first, second) all-reduce's bytes of a PowerSGD step: the P factors with the
    gradients sent whole, then the Q factors; counted as the runtime's PowerSGD lays out
    its buffers (hpcdp.runtime.powersgd.layout: what training hands over)."""
    # torch comes with the runtime's PowerSGD: imported only when PowerSGD is predicted.
    from hpcdp.runtime import powersgd

    lay = powersgd.layout(shapes, rank, min_elements)
    return lay.p_elements * elem_bytes, lay.q_elements * elem_bytes


def setting_step(step: Step, setting: Setting, shapes: Sequence[Shape] | None,
                 min_elements: int = MIN_ELEMENTS) -> Step:
    """The Step with the all-reduces `setting` makes (accumulation: the same per micro-batch
    group; its k-fold compute is `outcome`'s)."""
    if setting.compression == "bf16":
        return replace(step, bucket_bytes=tuple(max(1, int(b * HALF))
                                                for b in step.bucket_bytes))
    if setting.compression == "powersgd":
        if not shapes:
            raise ValueError("PowerSGD needs the gradients' shapes (a run from before "
                             "summary.json recorded tensor_shapes)")
        rounds = tuple(b for b in powersgd_rounds(shapes, setting.rank, min_elements) if b)
        return replace(step, bucket_bytes=rounds, overlap=False)
    return step


def outcome(step: Step, net: Network, setting: Setting, shapes: Sequence[Shape] | None,
            nodes: int, ranks_per_node: int, global_batch: int, base_rate: float) -> Outcome:
    """`setting` on `nodes` nodes: one optimizer step of `accumulate` micro-batches of
    `global_batch` samples, the last one's backward overlapping the all-reduce."""
    chosen = setting_step(step, setting, shapes)
    _, data, compute, _, exposed = step_at(chosen, net, nodes, ranks_per_node, global_batch)
    k = setting.accumulate
    total = k * (data + compute) + exposed
    rate = k * global_batch / total if total > 0 else math.inf
    return Outcome(setting, nodes, total, chosen.gradient_bytes, rate,
                   rate / (nodes * base_rate))


def compare(step: Step, net: Network, chosen: Sequence[Setting], shapes: Sequence[Shape] | None,
            max_nodes: int, ranks_per_node: int, global_batch: int) -> list[list[Outcome]]:
    """For 1..max_nodes nodes, each setting's Outcome (one list per node count); a setting
    that cannot be predicted (PowerSGD without shapes) is left out."""
    usable = [s for s in chosen if s.compression != "powersgd" or shapes]
    base_total = step_at(step, net, 1, ranks_per_node, global_batch)[0]
    base_rate = global_batch / base_total if base_total > 0 else math.inf
    return [[outcome(step, net, s, shapes, n, ranks_per_node, global_batch, base_rate)
             for s in usable] for n in range(1, max_nodes + 1)]


def cheapest(outcomes: Sequence[Outcome], target: float) -> Outcome | None:
    """The first setting (in the order given: cheapest in accuracy first) that meets
    `target` efficiency at this node count; None when none does."""
    return next((o for o in outcomes if o.efficiency >= target), None)


def advice(outcomes: Sequence[Outcome], target: float) -> str:
    """One line for a node count: what to use and the efficiency with and without it."""
    nodes, plain = outcomes[0].nodes, outcomes[0]
    best = cheapest(outcomes, target)
    if best is plain:
        return (f"at {nodes} node(s): no change needed, {plain.efficiency:.0%} predicted "
                f"with no compression (target {target:.0%})")
    if best is None:
        top = max(outcomes, key=lambda o: o.efficiency)
        return (f"at {nodes} node(s): no setting reaches {target:.0%}; the best is "
                f"{top.setting.label} ({' '.join(top.setting.overrides)}), "
                f"{top.efficiency:.0%} predicted against {plain.efficiency:.0%} without it")
    return (f"at {nodes} node(s): use {best.setting.label} ({' '.join(best.setting.overrides)})"
            f": {best.efficiency:.0%} predicted with it, {plain.efficiency:.0%} without "
            f"(target {target:.0%})")


def table_rows(per_nodes: Sequence[Sequence[Outcome]], target: float) -> list[list[str]]:
    """Rows for the table: nodes, each setting's efficiency, the cheapest that meets target."""
    rows = []
    for outcomes in per_nodes:
        best = cheapest(outcomes, target)
        rows.append([str(outcomes[0].nodes), *(f"{o.efficiency:.0%}" for o in outcomes),
                     best.setting.label if best else "(none reaches it)"])
    return rows
