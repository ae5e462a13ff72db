"""The bytes one rank hands to the gradient all-reduces per step, beside the uncompressed
figure: for summary.json (`per_step`) and the training log lines (`window`, `text`).

Counted from what is handed over, not from what the network carried: PowerSGD's
optimizers count the bytes of the buffers they all-reduce
(hpcdp.runtime.powersgd_optimizer), and the planner's figure for a model not built is
hpcdp.runtime.powersgd.bytes_per_step, which counts the same buffers from the shapes.
"""

from __future__ import annotations

from typing import Any

from hpcdp.runtime import powersgd
from hpcdp.train.setup import Run, sparse_tables

#: Compressions that send each floating-point gradient element as 2 bytes.
HALF = ("fp16", "bf16")


def _dense_params(run: Run) -> list[Any]:
    seen: set[int] = set()
    params = []
    for opt in run.optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
    return params


def per_step(run: Run) -> dict[str, Any]:
    """What a step of this run hands to the gradient all-reduces, in bytes, and what it
    would hand uncompressed (a PowerSGD step after the warm-up; its warm-up steps hand
    the uncompressed figure)."""
    hc = run.cfg.horovod
    params = _dense_params(run)
    whole = sum(p.numel() * p.element_size() for p in params)
    if hc.compression in HALF:
        sent = sum(p.numel() * (2 if p.is_floating_point() else p.element_size()) for p in params)
    elif hc.compression == "powersgd":
        sent = sum(_powersgd_bytes(run, opt) for opt in run.optimizers)
    else:
        sent = whole
    out: dict[str, Any] = {"compression": hc.compression, "bytes_per_step": sent,
                           "uncompressed_bytes_per_step": whole}
    if hc.compression == "powersgd":
        out.update(powersgd_rank=hc.powersgd_rank, warmup_steps=hc.powersgd_warmup_steps,
                   min_elements=hc.powersgd_min_elements)
    return out


def _powersgd_bytes(run: Run, opt: Any) -> int:
    """What `opt` hands per compressed step: its PowerSGD buffers; on one rank (no PowerSGD
    optimizer, nothing sent) what it would hand on several; whole where Horovod averages
    (an optimizer of sparse embedding tables)."""
    if hasattr(opt, "codec"):
        return int(opt.codec.handed_bytes)
    params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    if {id(p) for p in params} & sparse_tables(run.model):
        return sum(p.numel() * p.element_size() for p in params)
    hc = run.cfg.horovod
    elem = params[0].element_size() if params else 4
    return powersgd.bytes_per_step([tuple(p.shape) for p in params], hc.powersgd_rank,
                                   hc.powersgd_min_elements, elem)[0]


def window(run: Run) -> dict[str, float]:
    """The bytes handed per step since the last call, by the optimizers that count them
    (PowerSGD's), beside the uncompressed figure; {} where none does. Local: no collective."""
    counted = [opt.take_window() for opt in run.optimizers if hasattr(opt, "take_window")]
    steps = max((s for _, s in counted), default=0)
    if not steps:
        return {}
    whole = sum(p.numel() * p.element_size() for p in _dense_params(run))
    return {"grad_bytes_per_step": sum(b for b, _ in counted) / steps,
            "grad_bytes_uncompressed": float(whole)}


def text(record: dict[str, float]) -> str:
    """', grads 0.61 MB/step sent (uncompressed 44.7 MB)', or '' without the figures."""
    if "grad_bytes_per_step" not in record:
        return ""
    return (f", grads {record['grad_bytes_per_step'] / 1e6:.3g} MB/step sent (uncompressed "
            f"{record['grad_bytes_uncompressed'] / 1e6:.3g} MB)")


def powersgd_text(figures: dict[str, Any], ranks: int) -> str:
    """The start line of a PowerSGD run: what a step sends after the warm-up, and instead of
    what."""
    if ranks == 1:
        return "horovod.compression=powersgd: one rank sends nothing; gradients stay as they are"
    sent, whole = figures["bytes_per_step"], figures["uncompressed_bytes_per_step"]
    return (f"PowerSGD rank {figures['powersgd_rank']}: {sent / 1e6:.3g} MB per step handed to "
            f"the all-reduces instead of {whole / 1e6:.3g} MB (1/{whole / max(sent, 1):.0f}), "
            f"after {figures['warmup_steps']} uncompressed step(s)")
