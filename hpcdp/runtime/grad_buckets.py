"""Gradients averaged over ranks in a few flat buckets, each reduced in place when full.

Horovod's DistributedOptimizer hands every gradient to Horovod as its own
all-reduce; Horovod then fuses those ready in one cycle by copying them into its
fusion buffer and back. On CPUs the copies and the reductions run on the cores
backward is using, so this module keeps the gradients in flat buckets, each
all-reduced in place (no fusion copies) as soon as backward has filled it; the
bucket size (hpcdp.runtime.hvd_settings.CPU_BUCKET_BYTES) decides how many reductions a
step makes and how early the first one starts (docs/benchmarks.md).

`bucketed(optimizer, ...)` returns an optimizer with the DistributedOptimizer's
interface as hpcdp's training loop uses it (`synchronize()`, `skip_synchronize()`,
`step()`, backward passes per step, the predivide factor), built the way Horovod
builds its own: a subclass of the optimizer's class over the same parameter
groups. When backward has a parameter's gradient (after its last backward pass
of the step), a hook copies it into its place in one flat buffer and makes that
view the parameter's `.grad`; the last gradient of a bucket starts the bucket's
all-reduce. A bucket that backward never completes (a parameter unused this
step, reduced as zeros as Horovod does) is reduced by `synchronize()`, so every
rank always reduces every bucket and none waits on another for ever.

With `bf16` (horovod.compression = "bf16"), a bucket travels as bfloat16 through
hpcdp.runtime.bf16_reduce's alltoall and allgather instead of a float32 all-reduce.

Pure planning (`plan`) is separate from the hooks and collectives.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from hpcdp.runtime import bf16_reduce


def plan(sizes: Sequence[int], bucket_elems: int) -> list[range]:
    """Consecutive runs of item indices, each holding at least `bucket_elems` in all
    (the last one may hold less); every item in exactly one run, in order."""
    if bucket_elems < 1:
        raise ValueError(f"bucket size must be at least one element, got {bucket_elems}")
    runs, start, held = [], 0, 0
    for i, size in enumerate(sizes):
        held += size
        if held >= bucket_elems:
            runs.append(range(start, i + 1))
            start, held = i + 1, 0
    if start < len(sizes):
        runs.append(range(start, len(sizes)))
    return runs


class SyncOnStep:
    """The step of every averaging wrapper here (buckets, PowerSGD): `synchronize()`
    first, unless the caller already did inside `skip_synchronize()`. Mixed in by
    `subclass_of`; the mixing class sets `_skip_sync = False` in its __init__."""

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """`step()` inside this block does not synchronize (the caller already did)."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def step(self, closure: Any = None) -> Any:
        if not self._skip_sync:
            self.synchronize()
        return super(self.__class__, self).step(closure)  # type: ignore[misc]


def subclass_of(optimizer: torch.optim.Optimizer, *mixins: type) -> type:
    """A subclass of `optimizer`'s class, under its name, with the mixins' methods copied
    in (a later mixin's win): the wrapped optimizer's own step stays its base's."""
    methods: dict[str, Any] = {}
    for mixin in mixins:
        methods.update({k: v for k, v in vars(mixin).items()
                        if k not in ("__dict__", "__weakref__")})
    return type(optimizer.__class__.__name__, (optimizer.__class__,), methods)


class _Bucketed:
    """Methods mixed into a subclass of the wrapped optimizer's class (see `bucketed`)."""

    def __init__(self, params: Any, bucket_bytes: int, backward_passes_per_step: int,
                 gradient_predivide_factor: float, bf16: bool) -> None:
        super(self.__class__, self).__init__(params)  # type: ignore[call-arg]
        import horovod.torch as hvd

        self._hvd = hvd
        self._bf16 = bf16
        self._passes = backward_passes_per_step
        # mean = sum over ranks of g / ranks. With a predivide factor f (Horovod's, for
        # fp16 range): sum of g / f, then times f / ranks after the reduction.
        f, n = gradient_predivide_factor, hvd.size()
        self._prescale = 1.0 / n if f == 1.0 else 1.0 / f
        self._postscale = 1.0 if f == 1.0 else f / n
        seen: set[int] = set()
        ordered = []
        for group in self.param_groups:  # type: ignore[attr-defined]
            for p in group["params"]:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    ordered.append(p)
        # Backward produces gradients roughly from the last layer to the first.
        ordered.reverse()
        if not ordered:
            raise ValueError("the optimizer has no parameters that require gradients")
        dtypes = {(p.dtype, p.device) for p in ordered}
        if len(dtypes) != 1:
            raise ValueError(f"parameters of several dtypes or devices: {sorted(map(str, dtypes))}")
        starts = [0]  # each parameter's offset in the flat buffer, then the total
        for p in ordered:
            starts.append(starts[-1] + p.numel())
        # One element past the gradients: a small integer every rank sends with the last
        # bucket (`carry_max`), so a flag needs no all-reduce of its own.
        self._flat = torch.zeros(starts[-1] + 1, dtype=ordered[0].dtype,
                                 device=ordered[0].device)
        self._params = ordered
        self._view_of = {id(p): self._flat[a:b].view_as(p)
                         for p, a, b in zip(ordered, starts, starts[1:], strict=False)}
        elem = ordered[0].element_size()
        runs = plan([p.numel() for p in ordered], max(1, bucket_bytes // elem))
        self._buckets = [(starts[run.start], starts[run.stop]) for run in runs]  # flat [a, b)
        self._buckets[-1] = (self._buckets[-1][0], starts[-1] + 1)  # the carried slot
        self._members = [[ordered[i] for i in run] for run in runs]
        self._bucket_of = {id(p): b for b, members in enumerate(self._members) for p in members}
        self._handles: dict[int, Any] = {}
        self._skip_sync = False
        self._carry: list[Any] = [None, None]  # [value to send, the reduced value]
        self._reset()
        for p in ordered:
            p.register_post_accumulate_grad_hook(self.grad_ready)

    # -- bookkeeping ---------------------------------------------------------------

    def _reset(self) -> None:
        self._taken: set[int] = set()
        self._delay = {id(p): self._passes for p in self._params}
        self._pending = [len(members) for members in self._members]
        self._handles.clear()

    def _launch(self, b: int) -> None:
        """Scale the bucket (by 1/ranks, so that the all-reduce is a plain sum: Horovod's
        Average would scale the reduced buffer in a second pass) and start its all-reduce.

        One multiply over the whole bucket, not one per gradient: a multiply's cost on
        a small tensor is nearly all per call, and the bucket was just written, so it
        is still in cache (docs/measured-choices.md).
        """
        start, stop = self._buckets[b]
        bucket = self._flat[start:stop]
        if b == len(self._buckets) - 1:
            self._flat[-1] = self._carry[0] or 0
        if self._prescale != 1.0:
            bucket.mul_(self._prescale)
        if self._bf16:
            self._handles[b] = bf16_reduce.Exchange(self._hvd, bucket, f"hpcdp.grad_bucket.{b}")
            return
        self._handles[b] = self._hvd.allreduce_async_(
            bucket, name=f"hpcdp.grad_bucket.{b}", op=self._hvd.Sum,
            postscale_factor=self._postscale)

    def grad_ready(self, p: torch.Tensor) -> None:
        """Backward's hook: count the gradient in; reduce its bucket once all are in.

        Public for callers that hand over gradients made outside autograd (the
        fusion benchmark): set `p.grad`, then call this, in backward's order.
        """
        key = id(p)
        self._delay[key] -= 1
        if self._delay[key] != 0:
            return  # an earlier backward pass of an accumulated step
        self._take(p)
        b = self._bucket_of[key]
        self._pending[b] -= 1
        if self._pending[b] == 0 and b not in self._handles:
            self._launch(b)

    def _take(self, p: torch.Tensor) -> None:
        """Move p's gradient into its place in the flat buffer; the view becomes p.grad.

        One copy per step, made while backward goes on (scaled with its bucket at
        launch); the gradient autograd made is freed.
        (Keeping gradients as views across steps instead costs zeroing the buffer
        and accumulating into it: slower, docs/measured-choices.md.)
        """
        view = self._view_of[id(p)]
        if p.grad is None:
            view.zero_()  # no gradient this step: reduced as zeros, as Horovod does
        elif p.grad.is_sparse:
            raise RuntimeError(
                f"a parameter of shape {tuple(p.shape)} has a sparse gradient, which flat "
                "gradient buckets cannot hold: set horovod.bucket_mb=0 to average through "
                "Horovod's DistributedOptimizer")
        elif p.grad is not view:
            view.copy_(p.grad)
        p.grad = view
        self._taken.add(id(p))

    # -- the DistributedOptimizer interface ------------------------------------------

    def synchronize(self) -> None:
        """Reduce any bucket backward left unfilled, then wait for every bucket."""
        for b in range(len(self._buckets)):
            if b not in self._handles:
                for p in self._members[b]:
                    if id(p) not in self._taken:
                        self._take(p)
                self._launch(b)
        if self._bf16:
            for exchange in self._handles.values():
                exchange.gather()
            for exchange in self._handles.values():
                exchange.finish(self._postscale)
        else:
            for handle in self._handles.values():
                self._hvd.synchronize(handle)
        if self._carry[0] is not None:
            # The sum of each rank's value / ranks (the bucket's scaling): > 0 iff any sent one.
            self._carry = [None, float(self._flat[-1])]
        self._reset()

    def carry_max(self, value: int) -> Any:
        """Send `value` (>= 0) with the next step's last bucket; returns a function that
        gives whether any rank sent more than 0 (1 or 0), once that step has synchronized.

        The lagged preemption check (hpcdp.runtime.preempt) without an all-reduce of its own:
        every rank starts the next step anyway, and its gradients carry the flag.
        Read before that step, the function says 0.
        """
        self._carry = [value, None]

        def result() -> int:
            reduced, self._carry[1] = self._carry[1], None
            return 1 if reduced is not None and reduced > 0 else 0

        return result

    @property
    def buckets(self) -> list[tuple[int, int]]:
        """Each bucket's [start, stop) in elements of the flat buffer (for tests and logs)."""
        return list(self._buckets)


def bucketed(optimizer: torch.optim.Optimizer, bucket_bytes: int,
             backward_passes_per_step: int = 1,
             gradient_predivide_factor: float = 1.0, bf16: bool = False) -> torch.optim.Optimizer:
    """`optimizer`'s class and parameter groups, with gradients averaged in flat buckets
    (as bfloat16 on the wire with `bf16`).

    Raises ValueError where the parameters cannot share one flat buffer (several
    dtypes or devices); the caller then uses Horovod's DistributedOptimizer.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    cls = subclass_of(optimizer, SyncOnStep, _Bucketed)
    return cls(optimizer.param_groups, bucket_bytes, backward_passes_per_step,  # type: ignore[call-arg]
               gradient_predivide_factor, bf16)

