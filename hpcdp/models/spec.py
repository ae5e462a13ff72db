"""A trained network's shape as plain data (a "model spec"), and the network built from it.

A spec is a JSON-able dict: the model's name and every number its constructor
takes. It is derived from a checkpoint's config and weights (`from_checkpoint`:
the vocabulary, the tables and the input channels are read off the weights, so
no data file is needed), stored in an export's config.json, and turned back
into the network by `build`; hpcdp's own networks only (`has_spec`), any other is
rebuilt by its task (hpcdp.tasks.rebuild). `load_weights` puts a state dict into it after
checking that every tensor is there with its shape, naming the source file.

Pure torch: no Horovod, MPI or HDF5, so a model can be rebuilt outside hpcdp's
training stack.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hpcdp.models import gpt, vision
from hpcdp.models.dlrm import ClickModel


class SpecError(ValueError):
    """A spec or a set of weights that cannot make the model: the message says why."""


def _first_conv(state: Mapping[str, torch.Tensor]) -> torch.Tensor:
    for tensor in state.values():
        if tensor.dim() == 4:
            return tensor
    raise SpecError("the weights hold no convolution")


def _digits_image_size(state: Mapping[str, torch.Tensor], width: int) -> int:
    """The digits CNN's input size, from its first linear layer (2w x (s/2)^2 inputs)."""
    flat = int(state["head.1.weight"].shape[1])
    side = math.isqrt(flat // (2 * width))
    return 2 * side


def image_spec(model_name: str, image: Mapping[str, Any],
               state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    width = int(image.get("width") or 0)
    spec = {"name": model_name, "in_channels": int(_first_conv(state).shape[1]),
            "num_classes": int(image["num_classes"]), "width": width,
            "cifar_stem": bool(image.get("cifar_stem", False)), "image_size": None}
    if model_name == "digits_cnn":
        spec["image_size"] = _digits_image_size(state, width or 16)
    return spec


def lm_spec(lm: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    return {"name": "gpt", "vocab_size": int(state["tok_emb.weight"].shape[0]),
            "seq_len": int(lm["seq_len"]), "layers": int(lm["layers"]),
            "heads": int(lm["heads"]), "width": int(lm["width"]),
            "mlp_ratio": int(lm["mlp_ratio"]), "dropout": float(lm["dropout"])}


def recsys_spec(recsys: Mapping[str, Any], state: Mapping[str, torch.Tensor]
                ) -> dict[str, Any]:
    tables = sorted((int(k.split(".")[1]), int(v.shape[0])) for k, v in state.items()
                    if k.startswith("embeddings.") and k.endswith(".weight"))
    return {"name": "dlrm", "dense_features": int(state["bottom.0.weight"].shape[1]),
            "table_sizes": [rows for _, rows in tables],
            "embed_dim": int(recsys["embed_dim"]),
            "bottom": [int(b) for b in recsys["bottom"]], "top": [int(t) for t in recsys["top"]]}


#: hpcdp's own networks, by task: the models a spec describes. Any other model (a user's
#: task, a named network) is rebuilt by its task's builder (hpcdp.tasks.rebuild).
OWN_NETWORKS = {"image": frozenset(vision.MODELS), "lm": frozenset({"gpt"}),
                "recsys": frozenset({"dlrm"})}


def has_spec(task: str, model_name: str) -> bool:
    """Whether the model of a checkpoint of `task` is one of hpcdp's own networks."""
    return model_name in OWN_NETWORKS.get(task, ())


def from_checkpoint(task: str, model_name: str, config: Mapping[str, Any],
                    state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The spec of the model a checkpoint holds: its config's options, its weights' sizes."""
    try:
        if task == "image":
            return image_spec(model_name, config["image"], state)
        if task == "lm":
            return lm_spec(config["lm"], state)
        if task == "recsys":
            return recsys_spec(config["recsys"], state)
    except KeyError as e:
        raise SpecError(f"the checkpoint's config or weights lack {e}") from None
    raise SpecError(f"task {task!r} has no model spec")


def build(spec: Mapping[str, Any]) -> nn.Module:
    """The network a spec describes, on the CPU, with fresh weights (load_weights next)."""
    try:
        name = spec["name"]
        if name == "gpt":
            return gpt.GPT(gpt.GPTConfig(
                spec["vocab_size"], spec["seq_len"], spec["layers"], spec["heads"],
                spec["width"], spec["mlp_ratio"], spec["dropout"]))
        if name == "dlrm":
            return ClickModel(spec["dense_features"], spec["table_sizes"], spec["embed_dim"],
                              spec["bottom"], spec["top"])
        vision.check_name(name)
        size = spec["image_size"] or 32  # ResNets pool globally: any square size fits
        return vision.build_model(name, (spec["in_channels"], size, size),
                                  spec["num_classes"], spec["width"], spec["cifar_stem"])
    except KeyError as e:
        raise SpecError(f"model spec lacks {e}") from None
    except (TypeError, ValueError) as e:
        raise SpecError(f"model spec {dict(spec)} cannot be built: {e}") from None


def aliases(model: nn.Module) -> dict[str, str]:
    """{state key: the earlier key it shares storage with} (the GPT's tied output layer)."""
    seen: dict[tuple[int, int], str] = {}
    out: dict[str, str] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        ident = (tensor.data_ptr(), tensor.numel())
        if ident in seen and tensor.numel():
            out[key] = seen[ident]
        else:
            seen[ident] = key
    return out


def own_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without aliases, each tensor contiguous on the CPU (what is stored)."""
    tied = aliases(model)
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
            if k not in tied}


def load_weights(model: nn.Module, tensors: Mapping[str, torch.Tensor], source: str) -> None:
    """Put `tensors` into `model`: every key present, no extra one, each shape and dtype right."""
    tied = aliases(model)
    own = {k: v for k, v in model.state_dict().items() if k not in tied}
    for key, shared in tied.items():  # a checkpoint's state dict names tied weights twice
        if key in tensors and shared in tensors:
            if not torch.equal(tensors[key], tensors[shared]):
                raise SpecError(f"{source}: {key} must equal {shared} (tied), but differs")
            tensors = {k: v for k, v in tensors.items() if k != key}
    missing = sorted(set(own) - set(tensors))
    extra = sorted(set(tensors) - set(own))
    if missing or extra:
        raise SpecError(f"{source}: the weights do not fit the model: missing {missing[:3]}"
                        f"{' ...' if len(missing) > 3 else ''}, unexpected {extra[:3]}"
                        f"{' ...' if len(extra) > 3 else ''}")
    for key, mine in own.items():
        theirs = tensors[key]
        if tuple(theirs.shape) != tuple(mine.shape) or theirs.dtype != mine.dtype:
            raise SpecError(f"{source}: {key} is {theirs.dtype} {tuple(theirs.shape)} there, "
                            f"but the model needs {mine.dtype} {tuple(mine.shape)}")
    model.load_state_dict({**tensors, **{k: tensors[v] for k, v in tied.items()}})
