"""PowerSGD: gradients averaged over ranks as low-rank factors, with error feedback.

After Vogels, Karimireddy and Jaggi (2019). Each matrix-shaped gradient G (a
tensor of two or more dimensions, seen as n = shape[0] rows by m = the product of
the rest) is sent as two thin factors instead of n * m numbers:

    M = G + E             E: this rank's residual, what earlier steps failed to send
    P = M Q               Q (m x r): last step's, the warm start of one power iteration
    P <- mean of P over ranks, then orthonormal columns (Gram-Schmidt)
    Q = M^T P
    Q <- mean of Q over ranks
    G <- P Q^T            the same on every rank: computed from reduced factors only
    E <- M - P Q^T        kept on this rank for the next step

r (n + m) numbers go over the network instead of n m. Vectors (biases, norm
weights) and matrices too small to gain (r (n + m) >= n m, or fewer elements than
a threshold) are sent whole, in the same all-reduce as the P factors.

This module is the arithmetic and the state, with no collective: `Codec.compose`
gives the buffer of the first all-reduce, `Codec.project` takes its sum and gives
the second's, `Codec.expand` takes that sum and writes the averaged gradients. The
caller (hpcdp.runtime.powersgd_optimizer) all-reduces in between; a test can sum
the buffers of several codecs instead. `bytes_per_step` counts what is handed to
the two all-reduces from the shapes alone (the planner uses it for models it has
not built).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: Added to a column's norm before dividing by it: a zero column stays zero.
EPS = 1e-8


def matrix_shape(shape: Sequence[int]) -> tuple[int, int] | None:
    """(rows, columns) a gradient of `shape` is compressed as: the first dimension by
    the rest (a conv kernel: output channels by input channels x kernel); None for
    vectors and scalars."""
    if len(shape) < 2:
        return None
    return int(shape[0]), math.prod(int(s) for s in shape[1:])


def gains(shape: Sequence[int], rank: int, min_elements: int) -> bool:
    """Whether factors of `rank` are fewer numbers than the tensor (and it is big enough
    to be worth a matrix product and an orthogonalisation)."""
    nm = matrix_shape(shape)
    if nm is None:
        return False
    n, m = nm
    return n * m >= min_elements and rank * (n + m) < n * m


@dataclass(frozen=True)
class Layout:
    """Which tensors go as factors, and where each part sits in the two flat buffers.

    `p_slices[i]`: tensor i's [start, stop) in the first buffer (its P factor if
    compressed, else the whole tensor); `q_slices[i]`: its Q factor in the second
    buffer (compressed tensors only).
    """

    shapes: tuple[tuple[int, ...], ...]
    rank: int
    compressed: tuple[int, ...]
    plain: tuple[int, ...]
    p_slices: dict[int, tuple[int, int]]
    q_slices: dict[int, tuple[int, int]]

    @property
    def p_elements(self) -> int:
        return max((b for _, b in self.p_slices.values()), default=0)

    @property
    def q_elements(self) -> int:
        return max((b for _, b in self.q_slices.values()), default=0)

    @property
    def elements(self) -> int:
        """The uncompressed gradient's elements."""
        return sum(math.prod(s) for s in self.shapes)


def layout(shapes: Sequence[Sequence[int]], rank: int, min_elements: int) -> Layout:
    """The layout of gradients of `shapes` (in the order they are given)."""
    if rank < 1:
        raise ValueError(f"PowerSGD rank must be at least 1, got {rank}")
    shapes = tuple(tuple(int(d) for d in s) for s in shapes)
    compressed = tuple(i for i, s in enumerate(shapes) if gains(s, rank, min_elements))
    plain = tuple(i for i in range(len(shapes)) if i not in set(compressed))
    p_slices, q_slices, p_at, q_at = {}, {}, 0, 0
    for i in compressed:  # P factors first, then the whole tensors
        n, m = matrix_shape(shapes[i])  # type: ignore[misc]
        p_slices[i], p_at = (p_at, p_at + n * rank), p_at + n * rank
        q_slices[i], q_at = (q_at, q_at + m * rank), q_at + m * rank
    for i in plain:
        size = math.prod(shapes[i])
        p_slices[i], p_at = (p_at, p_at + size), p_at + size
    return Layout(shapes, rank, compressed, plain, p_slices, q_slices)


def bytes_per_step(shapes: Sequence[Sequence[int]], rank: int, min_elements: int,
                   elem_bytes: int = 4) -> tuple[int, int]:
    """(bytes handed to the two all-reduces of a compressed step, bytes of the whole
    gradient): what one rank sends per step with PowerSGD at `rank`, and without."""
    lay = layout(shapes, rank, min_elements)
    return (lay.p_elements + lay.q_elements) * elem_bytes, lay.elements * elem_bytes


def orthogonalise_(pt: torch.Tensor) -> None:
    """Give the rows of `pt` (P transposed: r x n) unit length and make each orthogonal to
    those before it, in place (Gram-Schmidt, each projection applied twice for accuracy).

    A fixed sequence of operations on its input: ranks that hold the same reduced P
    get the same bits.
    """
    for i in range(pt.shape[0]):
        row = pt[i:i + 1]
        if i:
            done = pt[:i]
            for _ in range(2):
                row.sub_((row @ done.T) @ done)
        row.div_(torch.linalg.vector_norm(row) + EPS)


def fresh_q(m: int, rank: int, seed: int, index: int, device: torch.device,
            dtype: torch.dtype) -> torch.Tensor:
    """A starting Q, transposed (r x m), standard normal, the same on every rank (drawn on
    the CPU from a generator of its own: neither the device nor the global random state
    matters)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return torch.randn(rank, m, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


class Codec:
    """One rank's PowerSGD state for gradients of fixed shapes: the Q factors (the same on
    every rank), the residuals (this rank's own), the buffers the all-reduces work on.

    The buffers hold the factors transposed (P^T: r x n, Q^T: r x m, each contiguous):
    the same numbers, in the layout whose matrix products are fast for a small r
    (P^T = Q^T M^T, Q^T = P^T M, P Q^T = (P^T)^T Q^T).
    """

    def __init__(self, shapes: Sequence[Sequence[int]], rank: int, min_elements: int,
                 world: int, device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
        self.layout = layout(shapes, rank, min_elements)
        self.world, self.seed, self.min_elements = world, seed, min_elements
        self.device, self.dtype = device, dtype
        self.p_flat = torch.zeros(self.layout.p_elements, device=device, dtype=dtype)
        self.q_flat = torch.zeros(self.layout.q_elements, device=device, dtype=dtype)
        self.residuals = {i: torch.zeros(self.layout.shapes[i], device=device, dtype=dtype)
                          for i in self.layout.compressed}
        self.steps = 0  # steps synchronized, warm-up ones included (the caller counts)
        self.reset()

    # -- views ---------------------------------------------------------------------------

    def _pt(self, i: int) -> torch.Tensor:
        a, b = self.layout.p_slices[i]
        return self.p_flat[a:b].view(self.layout.rank, -1)

    def _qt(self, i: int) -> torch.Tensor:
        a, b = self.layout.q_slices[i]
        return self.q_flat[a:b].view(self.layout.rank, -1)

    def _m(self, i: int) -> torch.Tensor:
        """The residual buffer seen as a matrix; between compose and expand it holds M."""
        return self.residuals[i].view(matrix_shape(self.layout.shapes[i]))  # type: ignore[arg-type]

    def reset(self) -> None:
        """Fresh Q factors and zero residuals (the start, or after non-finite factors)."""
        for i in self.layout.compressed:
            n, m = matrix_shape(self.layout.shapes[i])  # type: ignore[misc]
            self._qt(i).copy_(fresh_q(m, self.layout.rank, self.seed, i, self.device, self.dtype))
            self.residuals[i].zero_()

    @property
    def handed_bytes(self) -> int:
        """Bytes of the two buffers a compressed step all-reduces."""
        return (self.p_flat.numel() + self.q_flat.numel()) * self.p_flat.element_size()

    # -- the three phases around the two all-reduces ---------------------------------------

    def compose(self, grads: Sequence[torch.Tensor]) -> torch.Tensor:
        """M = G + E and P = M Q per compressed gradient, the others whole: the buffer to
        all-reduce (sum) in place."""
        for i in self.layout.compressed:
            m = self._m(i)
            m.add_(grads[i].reshape(m.shape))
            torch.matmul(self._qt(i), m.T, out=self._pt(i))
        for i in self.layout.plain:
            a, b = self.layout.p_slices[i]
            self.p_flat[a:b].copy_(grads[i].reshape(-1))
        return self.p_flat

    def project(self) -> torch.Tensor:
        """After the sum of P: the mean, P orthonormalised, Q = M^T P: the second buffer to
        all-reduce (sum) in place."""
        self.p_flat.div_(self.world)
        for i in self.layout.compressed:
            pt = self._pt(i)
            orthogonalise_(pt)
            torch.matmul(pt, self._m(i), out=self._qt(i))
        return self.q_flat

    def expand(self, grads: Sequence[torch.Tensor]) -> bool:
        """After the sum of Q: write the averaged gradients (P Q^T, or the mean of the whole
        tensor) into `grads`, keep the residuals; False where a factor was not finite.

        Non-finite factors (some rank's gradient overflowed) are the same on every rank,
        so every rank then resets alike: fresh Q, zero residuals. The gradients written
        are non-finite too, for the step's NaN policy to see.
        """
        self.q_flat.div_(self.world)
        for i in self.layout.compressed:
            m = self._m(i)
            if grads[i].is_contiguous():  # the product written where it goes: no copy
                approx = grads[i].view(m.shape)
                torch.matmul(self._pt(i).T, self._qt(i), out=approx)
            else:
                approx = self._pt(i).T @ self._qt(i)
                grads[i].copy_(approx.view(grads[i].shape))
            m.sub_(approx)
        for i in self.layout.plain:
            a, b = self.layout.p_slices[i]
            grads[i].copy_(self.p_flat[a:b].view(grads[i].shape))
        finite = bool(torch.isfinite(self.q_flat).all()) and bool(torch.isfinite(self.p_flat).all())
        if not finite:
            self.reset()
        return finite

    # -- checkpoints ---------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What the state fits: a checkpoint's state is loaded only where this matches."""
        return {"shapes": [list(s) for s in self.layout.shapes], "rank": self.layout.rank,
                "min_elements": self.min_elements}

    def state_dict(self) -> dict[str, Any]:
        """This rank's state on the CPU: Q and the step count (alike on every rank) and the
        residuals (this rank's own)."""
        return {**self.describe(), "steps": self.steps, "q": self.q_flat.cpu().clone(),
                "residuals": [self.residuals[i].cpu().clone() for i in self.layout.compressed]}

    def load_state_dict(self, state: dict[str, Any], residuals: bool) -> str | None:
        """Restore a state saved by `state_dict` (the residuals only if `residuals`); returns
        why part of it was not used, or None. A state of other shapes or rank starts
        Q and the residuals afresh and keeps only the step count."""
        self.steps = int(state["steps"])
        if {k: state.get(k) for k in self.describe()} != self.describe():
            self.reset()
            return ("the checkpoint's PowerSGD state is for other gradients, rank or "
                    "threshold: Q factors and residuals start afresh")
        self.q_flat.copy_(state["q"])
        for i, saved in zip(self.layout.compressed, state["residuals"], strict=True):
            if residuals:
                self.residuals[i].copy_(saved)
            else:
                self.residuals[i].zero_()
        return None
