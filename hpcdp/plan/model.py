"""Step time against node count: a pure model of data-parallel training (no torch, no MPI).

A step on every rank is: wait for data, forward, backward (gradients become
ready bucket by bucket, last layer first), the optimizer. Each bucket's
all-reduce starts when the bucket is ready and the previous one is done (one
collective at a time, as Horovod and hpcdp's buckets run them); what is still
running when backward ends is the exposed communication the step waits for.

The global batch is fixed across node counts (the dynamics, peak learning rate
included, do not change with the allocation), so each rank's share, and with it
its data and compute time, shrinks as ranks are added. Assumptions a user can
change are fields of `Step` and `Network`; `ASSUMPTIONS` says them in words.

Collective costs (alpha: seconds per message step; beta: seconds per byte on the
wire; gamma: seconds per byte reduced):
  ring over p ranks:   2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
  hierarchical, g ranks on each of N nodes: a reduce-scatter within the node
  ((g-1) alpha_in + (g-1)/g n (beta_in + gamma)), then each rank's n/g bytes
  all-reduced across the nodes, g rings at once sharing the node's network
  (2(N-1) alpha_out + 2(N-1)/N n beta_out + (N-1)/N n/g gamma), then an
  all-gather within the node ((g-1) alpha_in + (g-1)/g n beta_in).
  flat ring over all ranks: every step waits for the slowest link, the one
  between nodes, which carries one stream per node.
The inter-node beta is the node's: one over its network bandwidth, whatever the
number of ranks on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

ASSUMPTIONS = (
    "global batch fixed: each of the p ranks takes global/p samples a step",
    "data time proportional to the rank's samples; compute a fixed part plus a part "
    "proportional to them (fixed part from a second measurement at half the batch, else 0: "
    "then optimistic at many nodes, where small per-rank batches underuse a GPU)",
    "backward is backward_share of the compute; buckets are ready in proportion to their "
    "bytes through backward, the last at its end",
    "one all-reduce at a time, each bucket as soon as it is ready and the previous is done "
    "(fusion: one collective per bucket)",
    "communication overlaps backward only; what is left when backward ends is waited for",
    "no stragglers, no contention between communication and compute for cores or memory",
)


@dataclass(frozen=True)
class Link:
    """One level of the network: latency per message step, time per byte, reduction per byte."""

    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float = 0.0

    def __post_init__(self) -> None:
        for name in ("alpha_s", "beta_s_per_byte", "gamma_s_per_byte"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and not negative, got {value}")

    @property
    def gbytes_per_s(self) -> float:
        """Bandwidth in GB/s (1e9 B/s), for the tables."""
        return math.inf if self.beta_s_per_byte == 0 else 1e-9 / self.beta_s_per_byte


@dataclass(frozen=True)
class Network:
    """Within a node and across nodes; hierarchical or one flat ring over all ranks."""

    intra: Link
    inter: Link
    hierarchical: bool = True


@dataclass(frozen=True)
class Step:
    """One rank's training step as measured at `measured_batch` samples per rank."""

    compute_s: float  # forward + backward + optimizer
    data_s: float  # waiting for the next batch
    measured_batch: int  # samples per rank in the measurement
    bucket_bytes: tuple[int, ...]  # each all-reduce's size, in the order backward fills them
    backward_share: float = 2 / 3  # of compute_s: the part communication can hide behind
    overlap: bool = True  # False: every all-reduce waits for the end of backward
    fixed_s: float = 0.0  # of compute_s: per step whatever the batch (launches, optimizer)

    def __post_init__(self) -> None:
        if self.compute_s < 0 or self.data_s < 0:
            raise ValueError("compute and data time must not be negative")
        if self.measured_batch < 1:
            raise ValueError(f"measured batch must be positive, got {self.measured_batch}")
        if not 0 <= self.backward_share <= 1:
            raise ValueError(f"backward share must be within [0, 1], got {self.backward_share}")
        if not 0 <= self.fixed_s <= self.compute_s:
            raise ValueError(f"fixed time {self.fixed_s} must be within [0, compute time]")
        if any(b <= 0 for b in self.bucket_bytes):
            raise ValueError(f"bucket sizes must be positive, got {self.bucket_bytes}")

    @property
    def gradient_bytes(self) -> int:
        return sum(self.bucket_bytes)


@dataclass(frozen=True)
class Prediction:
    """One node count's predicted step."""

    nodes: int
    ranks: int
    step_s: float
    data_s: float
    compute_s: float
    comm_s: float  # all-reduce time of every bucket, end to end
    exposed_s: float  # the part of comm_s the step waits for
    samples_per_s: float
    efficiency: float  # samples/s over nodes x the 1-node samples/s
    fits_batch: bool = True  # whether the global batch divides over the ranks
    notes: tuple[str, ...] = field(default=())


def ring_allreduce_s(nbytes: float, ranks: int, link: Link) -> float:
    """A ring all-reduce of `nbytes` over `ranks` ranks on one kind of link."""
    if ranks < 1:
        raise ValueError(f"ranks must be positive, got {ranks}")
    if ranks == 1 or nbytes <= 0:
        return 0.0
    steps = ranks - 1
    return (2 * steps * link.alpha_s + 2 * steps / ranks * nbytes * link.beta_s_per_byte
            + steps / ranks * nbytes * link.gamma_s_per_byte)


def allreduce_s(nbytes: float, nodes: int, ranks_per_node: int, net: Network) -> float:
    """One all-reduce of `nbytes` per rank over `nodes` x `ranks_per_node` ranks."""
    if nodes < 1 or ranks_per_node < 1:
        raise ValueError(f"need at least one node and one rank per node, got {nodes}, "
                         f"{ranks_per_node}")
    g = ranks_per_node
    if nodes == 1:
        return ring_allreduce_s(nbytes, g, net.intra)
    if g == 1:
        return ring_allreduce_s(nbytes, nodes, net.inter)
    if not net.hierarchical:
        return ring_allreduce_s(nbytes, nodes * g, net.inter)
    share = (g - 1) / g * nbytes
    scatter = (g - 1) * net.intra.alpha_s + share * (net.intra.beta_s_per_byte
                                                     + net.intra.gamma_s_per_byte)
    gather = (g - 1) * net.intra.alpha_s + share * net.intra.beta_s_per_byte
    # g rings of n/g bytes at once, one per rank, through the node's network: each at 1/g
    # of the node's bandwidth; each rank reduces its own n/g.
    steps, part = nodes - 1, nbytes / g
    across = (2 * steps * net.inter.alpha_s
              + 2 * steps / nodes * part * g * net.inter.beta_s_per_byte
              + steps / nodes * part * net.inter.gamma_s_per_byte)
    return scatter + across + gather


def exposed_comm_s(ready_s: Sequence[float], durations_s: Sequence[float],
                   backward_end_s: float) -> float:
    """How long after `backward_end_s` the last all-reduce ends.

    Bucket i starts at max(its ready time, the end of bucket i-1) and takes
    durations_s[i]; times on one clock from the start of backward.
    """
    if len(ready_s) != len(durations_s):
        raise ValueError(f"{len(ready_s)} ready times for {len(durations_s)} buckets")
    end = 0.0
    for ready, took in zip(ready_s, durations_s):
        end = max(end, ready) + took
    return max(0.0, end - backward_end_s)


def ready_times_s(bucket_bytes: Sequence[int], backward_s: float) -> list[float]:
    """When each bucket is ready: backward fills them in order, in proportion to their bytes."""
    total = sum(bucket_bytes)
    done, out = 0, []
    for b in bucket_bytes:
        done += b
        out.append(backward_s * done / total if total else backward_s)
    return out


def fused(tensor_bytes: Sequence[int], threshold: int) -> tuple[int, ...]:
    """Tensors (in backward's order) packed into consecutive buffers of at least `threshold`
    bytes, the last one smaller: how fusion or flat buckets group them."""
    if threshold < 1:
        raise ValueError(f"fusion threshold must be positive, got {threshold}")
    out, held = [], 0
    for b in tensor_bytes:
        held += b
        if held >= threshold:
            out.append(held)
            held = 0
    if held:
        out.append(held)
    return tuple(out)


def step_at(step: Step, net: Network, nodes: int, ranks_per_node: int,
            global_batch: int) -> tuple[float, float, float, float, float]:
    """(step, data, compute, comm, exposed) seconds on `nodes` nodes for `global_batch`."""
    ranks = nodes * ranks_per_node
    scale = global_batch / ranks / step.measured_batch
    data = step.data_s * scale
    compute = step.fixed_s + (step.compute_s - step.fixed_s) * scale
    backward = compute * step.backward_share
    durations = [allreduce_s(b, nodes, ranks_per_node, net) for b in step.bucket_bytes]
    comm = sum(durations)
    if ranks == 1:
        exposed = 0.0
    elif step.overlap:
        exposed = exposed_comm_s(ready_times_s(step.bucket_bytes, backward), durations, backward)
    else:
        exposed = comm
    return data + compute + exposed, data, compute, comm, exposed


def predict(step: Step, net: Network, max_nodes: int, ranks_per_node: int,
            global_batch: int) -> list[Prediction]:
    """Predictions for 1..max_nodes nodes at a fixed global batch."""
    if max_nodes < 1 or global_batch < 1:
        raise ValueError("max_nodes and global_batch must be positive")
    out: list[Prediction] = []
    base_rate = None
    for nodes in range(1, max_nodes + 1):
        ranks = nodes * ranks_per_node
        total, data, compute, comm, exposed = step_at(step, net, nodes, ranks_per_node,
                                                      global_batch)
        rate = global_batch / total if total > 0 else math.inf
        base_rate = rate if base_rate is None else base_rate
        out.append(Prediction(nodes, ranks, total, data, compute, comm, exposed, rate,
                              rate / (nodes * base_rate), global_batch % ranks == 0))
    return out


def nodes_for(predictions: Sequence[Prediction], target: float) -> int | None:
    """The most nodes whose efficiency is at least `target` (and the batch divides), if any."""
    ok = [p.nodes for p in predictions if p.efficiency >= target and p.fits_batch]
    return max(ok) if ok else None


def suggested_range(predictions: Sequence[Prediction], target: float) -> tuple[int, int] | None:
    """(min, max) nodes for `sbatch --nodes=MIN-MAX`: max meets the target efficiency; min is
    the fewest nodes (batch dividing) that still give at least half of max's samples/s, so
    that a job started on fewer nodes, or requeued onto them, runs at most twice as long."""
    top = nodes_for(predictions, target)
    if top is None:
        return None
    best = next(p for p in predictions if p.nodes == top).samples_per_s
    low = min(p.nodes for p in predictions
              if p.fits_batch and p.nodes <= top and p.samples_per_s >= best / 2)
    return low, top


def fixed_part_s(full_s: float, half_s: float) -> float:
    """The per-step time that does not shrink with the batch, from the compute time at a
    batch and at half of it (t = fixed + per_sample x b), kept within [0, full_s]."""
    return min(max(2 * half_s - full_s, 0.0), full_s)
