"""A stated step: one rank's compute time measured elsewhere (the GPU the job will use,
a paper) and the gradient layout of one of hpcdp's image models, built here.

This is how `hpcdp plan` answers for a model and hardware that this machine cannot
measure: the layout (each gradient's shape, in backward's order) is exact, the compute
time is the user's, the data time is taken as 0 (stated in the inputs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hpcdp.plan.model import Step, fused

Shape = tuple[int, ...]


def model_gradients(name: str, sample_shape: Sequence[int], classes: int) -> list[Shape]:
    """Each trainable parameter's shape in backward's order (the reverse of the model's)."""
    # torch and the models only here: `hpcdp plan` on a run folder never needs them.
    from hpcdp.models.vision import build_model

    model = build_model(name, sample_shape, classes)
    return [tuple(p.shape) for p in model.parameters() if p.requires_grad][::-1]


def stated_step(shapes: Sequence[Shape], compute_ms: float, batch: int, fusion_bytes: int,
                backward_share: float, overlap: bool) -> Step:
    """The Step of `compute_ms` per step at `batch` samples on one rank, its float32
    gradients fused into buffers of `fusion_bytes` as Horovod groups them."""
    if compute_ms <= 0:
        raise ValueError(f"--compute-ms must be positive, got {compute_ms}")
    sizes = [4 * math.prod(s) for s in shapes]
    return Step(compute_ms / 1000, 0.0, batch, fused(sizes, fusion_bytes), backward_share,
                overlap)
