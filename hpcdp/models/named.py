"""Networks named in `model.name`: a library's, or one a builder of the user's makes.

    torchvision:<name>         a torchvision classification network, weights=None
    timm:<name>                a timm network, pretrained=False, in_chans from the data
    transformers:<Config>      a Hugging Face causal LM from a config class
                               (transformers:LlamaConfig), built from the config, never
                               downloaded
    transformers:<file>.json   the same from a config file (config.json of a model)
    package.module:callable    a builder of the user's: callable(cfg, sample_shape,
    path/to/file.py:callable   **model.kwargs) -> torch.nn.Module

`model.kwargs` are the builder's keyword arguments. The task sizes the output: the image
task passes image.num_classes (torchvision, timm) and the LM task the token file's
vocabulary (transformers); a user's builder reads them from the config it is given.
Every failure (no such library, network, module, file or callable; a builder that
raises or returns something other than a torch.nn.Module; a keyword that would fetch
weights) is a `ModelError` naming model.name, raised on every rank alike, before any
collective (the network is built in each rank's set-up).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpcdp import references
from hpcdp.config import LIBRARIES, ConfigError
from hpcdp.models import libraries

#: Keywords that would load weights from a hub, a URL or a file: refused, whatever
#: their value (a network is built from its config alone; a checkpoint resumes it).
WEIGHT_KEYS = frozenset({"weights", "weights_backbone", "pretrained", "pretrained_cfg",
                         "pretrained_cfg_overlay", "pretrained_strict", "checkpoint_path",
                         "pretrained_model_name_or_path"})
#: A config JSON above this size is refused unread (a model's config.json is a few KB).
MAX_CONFIG_JSON = 1 << 20


class ModelError(ConfigError):
    """A model.name (or model.kwargs) that cannot make a network: the message says why."""


@dataclass(frozen=True)
class Named:
    """model.name split: the library (or "builder" for a user's) and what it names."""

    kind: str  # torchvision | timm | transformers | builder
    target: str  # the network or config class, the JSON file, or the module or file
    attr: str = ""  # a builder's callable


def parse(name: str) -> Named | None:
    """`name` as a named network, or None for a task's own model name (no colon)."""
    prefix, colon, rest = name.partition(":")
    if not colon:
        return None
    if prefix in LIBRARIES:
        if not rest:
            raise ModelError(f"model.name={name!r}: name the {prefix} network after the colon")
        return Named(prefix, rest)
    target, _, attr = name.rpartition(":")
    dotted = all(part.isidentifier() for part in target.split("."))
    if not attr.isidentifier() or not (references.is_file(target) or dotted):
        raise ModelError(f"model.name={name!r}: not a network name; write torchvision:<name>, "
                         "timm:<name>, transformers:<ConfigClass>, package.module:callable or "
                         "path/to/file.py:callable")
    return Named("builder", target, attr)


def kinds(name: str) -> str | None:
    """The kind of network `name` names (see `parse`), None for a task's own model."""
    named = parse(name)
    return named.kind if named else None


def check_kwargs(name: str, kwargs: Mapping[str, Any], owned: Sequence[str]) -> None:
    """No keyword that fetches weights, none the task sets itself (`owned`)."""
    fetch = sorted(WEIGHT_KEYS & set(kwargs))
    if fetch:
        raise ModelError(f"model.kwargs.{fetch[0]} (model.name={name!r}): hpcdp builds "
                         "networks from their config and never loads pretrained weights")
    for key in owned:
        if key in kwargs:
            raise ModelError(f"model.kwargs.{key} (model.name={name!r}): set by hpcdp from the "
                             "data (image.num_classes, the channels, the token file's "
                             "vocabulary); leave it out")


def checked(name: str, built: Any) -> nn.Module:
    """`built` when it is a torch.nn.Module; a ModelError naming model.name otherwise."""
    if not isinstance(built, nn.Module):
        raise ModelError(f"model.name={name!r}: the builder returned a {type(built).__name__}, "
                         "not a torch.nn.Module")
    return built


def _did_you_mean(word: str, known: Sequence[str]) -> str:
    near = difflib.get_close_matches(word, list(known), n=3)
    return f" (did you mean {', '.join(repr(n) for n in near)}?)" if near else ""


def _library(name: str, loader: Callable[[], Any]) -> Any:
    try:
        return loader()
    except libraries.LibraryError as e:
        raise ModelError(f"model.name={name!r}: {e}") from None


def _call(name: str, builder: Callable[..., Any], *args: Any, **kwargs: Any) -> nn.Module:
    """builder(*args, **kwargs), its failure a ModelError naming model.name."""
    try:
        built = builder(*args, **kwargs)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - a builder's own error, named with the reference
        raise ModelError(f"model.name={name!r}: the builder raised {type(e).__name__}: "
                         f"{e}") from None
    return checked(name, built)


def image_network(name: str, kwargs: Mapping[str, Any], cfg: Any,
                  sample_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The image classifier `name` names, with a head of `num_classes` outputs."""
    named = parse(name)
    if named is None or named.kind == "transformers":
        raise ModelError(f"model.name={name!r}: the image task builds torchvision:, timm: or a "
                         "builder of yours (package.module:callable, path/file.py:callable)")
    if named.kind == "builder":
        return user_network(name, named, kwargs, cfg, sample_shape)
    if len(sample_shape) != 3:
        raise ModelError(f"model.name={name!r} needs samples shaped (C, H, W), got "
                         f"{tuple(sample_shape)}")
    check_kwargs(name, kwargs, ("num_classes", "in_chans"))
    if named.kind == "torchvision":
        return _torchvision(name, named.target, kwargs, sample_shape, num_classes)
    return _timm(name, named.target, kwargs, sample_shape, num_classes)


def _torchvision(name: str, target: str, kwargs: Mapping[str, Any],
                 sample_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    tv = _library(name, libraries.torchvision)
    known = tv.models.list_models(module=tv.models)  # the classification networks
    if target not in known:
        raise ModelError(f"model.name={name!r}: torchvision {tv.__version__} has no "
                         f"classification network {target!r}{_did_you_mean(target, known)}")
    if sample_shape[0] != 3:
        raise ModelError(f"model.name={name!r}: torchvision's networks take 3 channels; the "
                         f"samples have {sample_shape[0]}")
    return _call(name, tv.models.get_model, target, weights=None, num_classes=num_classes,
                 **kwargs)


def _timm(name: str, target: str, kwargs: Mapping[str, Any], sample_shape: tuple[int, ...],
          num_classes: int) -> nn.Module:
    timm = _library(name, libraries.timm)
    if not timm.is_model(target):
        raise ModelError(f"model.name={name!r}: timm {timm.__version__} has no network "
                         f"{target!r}{_did_you_mean(target, timm.list_models())}")
    return _call(name, timm.create_model, target, pretrained=False, num_classes=num_classes,
                 in_chans=sample_shape[0], **kwargs)


def builder_of(name: str, named: Named) -> Callable[..., Any]:
    """The callable a builder reference names, its module or file imported."""
    libraries.prepare_for_user_code()
    module, where = references.import_target(name, named.target, "model.name", ModelError)
    found = getattr(module, named.attr, None)
    if found is None:
        public = [n for n in vars(module) if not n.startswith("_")]
        raise ModelError(f"model.name={name!r}: {where} has no attribute "
                         f"{named.attr!r}{_did_you_mean(named.attr, public)}")
    if not callable(found):
        raise ModelError(f"model.name={name!r}: {named.attr} in {where} is a "
                         f"{type(found).__name__}, not a callable builder")
    return found


def user_network(name: str, named: Named, kwargs: Mapping[str, Any], cfg: Any,
                 sample_shape: tuple[int, ...]) -> nn.Module:
    """builder(cfg, sample_shape, **kwargs) of a user's builder reference."""
    check_kwargs(name, kwargs, ())
    return _call(name, builder_of(name, named), cfg, tuple(sample_shape), **kwargs)


def config_json(name: str, path: str) -> dict[str, Any]:
    """A transformers config file's values (a JSON object, at most MAX_CONFIG_JSON bytes)."""
    try:
        if os.path.getsize(path) > MAX_CONFIG_JSON:
            raise ModelError(f"model.name={name!r}: {path} is over {MAX_CONFIG_JSON} bytes; "
                             "not a model's config.json")
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except OSError as e:
        raise ModelError(f"model.name={name!r}: {path} cannot be read: {e.strerror or e}"
                         ) from None
    except ValueError as e:
        raise ModelError(f"model.name={name!r}: {path} is not valid JSON: {e}") from None
    if not isinstance(values, dict) or not isinstance(values.get("model_type"), str):
        raise ModelError(f"model.name={name!r}: {path} is no transformers config (a JSON "
                         "object with a \"model_type\")")
    return values


def config_class(name: str, target: str) -> type:
    """The transformers config class `target` names (LlamaConfig, GPT2Config...)."""
    tf = _library(name, libraries.transformers)
    found = getattr(tf, target, None) if target.isidentifier() else None
    if not (isinstance(found, type) and issubclass(found, tf.PretrainedConfig)):
        known = [n for n in dir(tf) if n.endswith("Config")]
        raise ModelError(f"model.name={name!r}: transformers {tf.__version__} has no config "
                         f"class {target!r}{_did_you_mean(target, known)}")
    return found


def class_for_type(name: str, model_type: str) -> str:
    """The config class name of a config file's model_type ("llama" -> LlamaConfig)."""
    tf = _library(name, libraries.transformers)
    try:
        return type(tf.AutoConfig.for_model(model_type)).__name__
    except (ValueError, KeyError) as e:
        raise ModelError(f"model.name={name!r}: transformers {tf.__version__} knows no "
                         f"model_type {model_type!r}: {e}") from None


def causal_lm(name: str, kwargs: Mapping[str, Any], vocab_size: int, seq_len: int
              ) -> nn.Module:
    """The transformers causal LM of config class `name` names, for `vocab_size` tokens and
    windows of `seq_len`; built from the config (random weights), never downloaded."""
    named = parse(name)
    if named is None or named.kind != "transformers" or named.target.endswith(".json"):
        raise ModelError(f"model.name={name!r}: not transformers:<ConfigClass>")
    check_kwargs(name, kwargs, ("vocab_size",))
    tf = _library(name, libraries.transformers)
    cls = config_class(name, named.target)
    try:
        config = cls(**{"use_cache": False, **kwargs})
    except Exception as e:  # noqa: BLE001 - the config class's own check, named
        raise ModelError(f"model.name={name!r}: {cls.__name__}(**model.kwargs) raised "
                         f"{type(e).__name__}: {e}") from None
    check_sizes(name, config, vocab_size, seq_len)
    try:
        net = tf.AutoModelForCausalLM.from_config(config)
    except ValueError as e:
        raise ModelError(f"model.name={name!r}: transformers has no causal LM for "
                         f"{cls.__name__}: {e}") from None
    return checked(name, net)


def check_sizes(name: str, config: Any, vocab_size: int, seq_len: int) -> None:
    """The config gets the data's vocabulary, and its positions must hold a window."""
    config.vocab_size = vocab_size
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions < seq_len:
        raise ModelError(f"model.name={name!r}: max_position_embeddings={positions} is below "
                         f"lm.seq_len={seq_len}")


def logits(out: Any) -> torch.Tensor:
    """The logits of a model's output: the tensor itself, or its `.logits` (transformers)."""
    return out if isinstance(out, torch.Tensor) else out.logits
