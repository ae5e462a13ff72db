"""Speed options applied to the model once it is on its device: memory format, TF32,
torch.compile. Local: no collectives; the same decisions on every rank (they depend
on the config and the device kind only).

The model is compiled in place (`nn.Module.compile`), not wrapped by `torch.compile`:
its parameters, hooks and state dict stay those of the plain model, so the gradient
hooks (flat buckets, Horovod's DistributedOptimizer), the broadcast and the
checkpoints see the same names compiled or not, and a checkpoint written by one
resumes in the other. A state dict that does carry the wrapper's `_orig_mod.`
prefixes (saved from a `torch.compile` wrapper elsewhere) is read without them
(`without_compile_prefix`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from hpcdp.config import Config

log = logging.getLogger("hpcdp.train")


def is_convnet(model: torch.nn.Module) -> bool:
    """Whether the model convolves images (what channels_last speeds up)."""
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def wants_channels_last(setting: str, convnet: bool, device: torch.device) -> bool:
    """run.channels_last: auto = convnets on CUDA (cuDNN's fast NHWC kernels, most of all
    with tensor cores); on = every convnet, CPUs included; off = never."""
    if setting == "off" or not convnet:
        return False
    return setting == "on" or device.type == "cuda"


def to_layout(inputs: Any, channels_last: bool) -> Any:
    """A batch of images in the model's memory format (other inputs pass through)."""
    if channels_last and isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
        return inputs.contiguous(memory_format=torch.channels_last)
    return inputs


def set_tf32(enabled: bool, device: torch.device) -> bool:
    """run.tf32 on a GPU that has TF32 (compute capability 8.0 on): fp32 matmuls and
    convolutions use it; returns whether it is on. Process-wide, as PyTorch's flags are."""
    if device.type != "cuda":
        return False
    has = torch.cuda.get_device_capability(device) >= (8, 0)
    on = enabled and has
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    return on


def prepare_model(cfg: Config, model: torch.nn.Module, device: torch.device) -> bool:
    """Memory format, TF32 and compilation for `model` (already on `device`), in place;
    returns whether inputs should be channels_last too."""
    channels_last = wants_channels_last(cfg.run.channels_last, is_convnet(model), device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    set_tf32(cfg.run.tf32, device)
    if cfg.run.compile:
        compile_model(model, cfg.run.compile_mode)
    return channels_last


#: Exported, it wins: how many processes inductor compiles kernels with.
COMPILE_THREADS_VAR = "TORCHINDUCTOR_COMPILE_THREADS"


def compile_model(model: torch.nn.Module, mode: str) -> None:
    """torch.compile the model's forward in place (the first steps are slow: tracing
    and code generation). `mode` "default" is torch's own default.

    Inductor compiles with this rank's compute threads (hpcdp's plan, set by
    hpcdp.runtime.dist.init), unless TORCHINDUCTOR_COMPILE_THREADS is exported. Its own
    default is a pool of worker processes, each importing torch, for every CPU the
    process may use, and every rank of a node starts one: on ranks sharing their
    cores, the pools only oversubscribe them (one thread: no pool, compiled in process).
    """
    if COMPILE_THREADS_VAR not in os.environ:
        import torch._inductor.config as inductor_config  # start-up cost: compiled runs only

        inductor_config.compile_threads = torch.get_num_threads()
    model.compile(mode=None if mode == "default" else mode)
    log.debug(f"model compiled (torch.compile, mode {mode})")


#: What a torch.compile wrapper puts before every key of its model's state dict.
COMPILE_PREFIX = "_orig_mod."


def without_compile_prefix(model_state: dict[str, Any]) -> dict[str, Any]:
    """A model state dict with torch.compile's `_orig_mod.` prefixes taken off (at any
    depth: a compiled submodule puts it mid-key), so that weights saved from a compiled
    wrapper load into the plain model hpcdp trains (compiled in place, above); other keys and
    the order unchanged."""
    return {key.replace(COMPILE_PREFIX, ""): value for key, value in model_state.items()}
