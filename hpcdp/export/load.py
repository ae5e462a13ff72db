"""`load(DIR)`: an exported model as an eval-mode torch module, and its config.

Imports torch, safetensors, hpcdp.models and hpcdp.tasks.rebuild only: hpcdp's own
networks can be used where Horovod, MPI and HDF5 are not installed. A model recorded by
its builder (a user's task, a named network) is rebuilt by its task, whose module is
imported (with what it imports): loading such a folder runs that task's code, so load
only folders whose task you trust; a builder that cannot be imported is refused, naming
it. No file is ever unpickled.

The order bounds what a crafted folder can cost: config.json (size-capped) and the
weights file's size and hash first; then the weights' header against the model
config.json describes, built on the ``meta`` device (shapes without memory), so
that a small file cannot make a large model be allocated; only then are the
tensors read and the real model built.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from hpcdp.export import bundle
from hpcdp.models import libraries
from hpcdp.models import spec as specs
from hpcdp.tasks import rebuild

_T = torch.Tensor
#: Value fills a shapes-only build skips: they change no shape, and on the meta device some
#: run through Python decompositions whose first use imports torch._dynamo (~4 s).
_FILLS = frozenset({getattr(torch.nn.init, n) for n in dir(torch.nn.init)
                    if n.endswith("_") and not n.startswith("_")}
                   | {_T.normal_, _T.uniform_, _T.erfinv_, _T.exponential_, _T.random_,
                      _T.bernoulli_, _T.log_normal_, _T.cauchy_, _T.geometric_})
#: Small index helpers computed on the CPU in a shapes-only build, for the same reason
#: (their sizes follow the table counts `_check_counts` bounds).
_ON_CPU = frozenset({torch.tril_indices, torch.triu_indices})


class _ShapesOnly(TorchFunctionMode):
    """Inside ``torch.device("meta")``: the module's tensors get shapes and dtypes only."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FILLS:
            return args[0] if args else kwargs["tensor"]
        if func in _ON_CPU:
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


def model_from(config: dict[str, Any], tensors: dict[str, torch.Tensor], source: str
               ) -> torch.nn.Module:
    """The network config["model"] describes, holding `tensors`, in eval mode on the CPU."""
    try:
        net = rebuild.build(config["model"])
        specs.load_weights(net, tensors, source)
    except specs.SpecError as e:
        raise bundle.ExportError(f"{e} (config.json's model: {shown(config['model'])})"
                                 ) from None
    return net.eval()


def shown(model: Mapping[str, Any]) -> Any:
    """A model entry for a message: a spec whole, a builder entry without its config."""
    if rebuild.is_builder(model):
        return {k: v for k, v in model.items() if k != "config"}
    return dict(model)


def _check_counts(spec: Mapping[str, Any], tensors: int, where: str) -> None:
    """A spec cannot ask for more layers or tables than the weights hold tensors (what
    building even a shapes-only model costs grows with those counts)."""
    for key, value in spec.items():
        count = len(value) if isinstance(value, list) else value if key == "layers" else None
        if isinstance(count, int) and count > tensors:
            raise bundle.ExportError(f"{where}: model {key} {count if key == 'layers' else '[...]'}"
                                     f" asks for more parts than the weights' {tensors} tensors")


def planned(spec: Mapping[str, Any], tensors: int, where: str
            ) -> tuple[dict[str, tuple[str, tuple[int, ...]]], set[str]]:
    """({state key: (safetensors dtype, shape)}, the keys stored once) of the model `spec`
    describes, from a shapes-only build: nothing is allocated."""
    if not rebuild.is_builder(spec):  # a builder is the task's code: its counts are its own
        _check_counts(spec, tensors, where)
    libraries.import_named(str(spec.get("name", "")))
    try:
        with torch.device("meta"), _ShapesOnly():
            net = rebuild.build(spec)
    except (specs.SpecError, RuntimeError, TypeError, ValueError, OverflowError) as e:
        raise bundle.ExportError(f"{where}: its model {shown(spec)} cannot be built: "
                                 f"{e}") from None
    state = net.state_dict(keep_vars=True)
    own, seen = set(), set()
    for key, t in state.items():  # tied tensors are one object: stored under its first key
        if id(t) not in seen:
            seen.add(id(t))
            own.add(key)
    shapes = {k: (bundle.DTYPES.get(t.dtype, str(t.dtype)), tuple(t.shape))
              for k, t in state.items()}
    return shapes, own


def check_header(path: Path, config: Mapping[str, Any]) -> None:
    """The weights file's tensors are the ones config.json's model holds, by name, dtype
    and shape; `ExportError` naming the weights file and config.json otherwise."""
    header = bundle.read_header(path)
    where = str(path.with_name(bundle.CONFIG))
    shapes, own = planned(config["model"], len(header), where)
    missing, extra = sorted(own - set(header)), sorted(set(header) - set(shapes))
    if missing or extra:
        raise bundle.ExportError(f"{path}: the weights do not fit the model {where} describes: "
                                 f"missing {missing[:3]}, unexpected {extra[:3]}")
    for key, (dtype, shape) in header.items():
        if (dtype, shape) != shapes[key]:
            want_dtype, want_shape = shapes[key]
            raise bundle.ExportError(f"{path}: {key} is {dtype} {list(shape)} there, but the "
                                     f"model needs {want_dtype} {list(want_shape)} by {where}")


def load(folder: str | Path, device: str | torch.device = "cpu"
         ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model in eval mode on `device`, config.json as a dict) of an export folder.

    Raises ExportError naming the file and the problem: a weights file that is not
    the one config.json was written with (truncated, replaced), that is no
    safetensors file, or whose tensors do not fit the model config.json describes.
    """
    folder = Path(folder)
    config = bundle.read_config(folder)
    path = bundle.weights_path(folder, config)
    bundle.check_file(path, config["weights"], "weights")
    check_header(path, config)
    tensors = bundle.read_tensors(folder, config)
    net = model_from(config, tensors, str(path))
    return net.to(device), config
