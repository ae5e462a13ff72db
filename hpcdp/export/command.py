"""`hpcdp export (RUN_DIR | CHECKPOINT) --out DIR`: a checkpoint's model as an export folder.

The checkpoint is read as a resume reads it (permissions, checksum, weights-only
load; hpcdp.train.trained), so a file that would not be resumed is not exported
either. Only the model's tensors go out: no optimizer, reader or RNG state.
config.json gets what a user of the model needs to feed it (`input_schema`):
the image size, channels, scaling and normalisation and class names; the
vocabulary and tokenizer; the click model's features and tables. Facts that
only the data files hold (class names, the tokenizer's name) are read from the
run's training file when it is still there, else left null and said.

hpcdp's own networks are recorded by their spec; any other model (a user's task, a
named network) by its builder: the task reference, the model's name, the sample shape
and the run's config, from which `hpcdp.export.load` rebuilds it by calling the task's
`build_model` (hpcdp.tasks.rebuild).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hpcdp import __version__
from hpcdp.config import ConfigError
from hpcdp.export import bundle
from hpcdp.models import spec as specs
from hpcdp.tasks import rebuild
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust
from hpcdp.train.trained import Trained, load


def data_attrs(config: Mapping[str, Any]) -> dict[str, Any]:
    """The root attributes of the run's training file (and its label dataset's), or {}."""
    data = config.get("data") or {}
    path = Path(str(data.get("path", ""))) / str(data.get("train_file", "train.h5"))
    if not path.is_file():
        return {}
    import h5py  # the export command only; the loader never reads HDF5

    def plain(v: Any) -> Any:
        if hasattr(v, "tolist"):
            v = v.tolist()
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    try:
        with h5py.File(path, "r") as f:
            attrs = {k: plain(v) for k, v in f.attrs.items()}
            x, y = ((config.get("image") or {}).get(k, d) for k, d in (("x_name", "x"),
                                                                       ("y_name", "y")))
            if x in f and f[x].ndim == 4:  # (N, C, H, W) images
                attrs["_sample_shape"] = list(f[x].shape[1:])
            if y in f and "class_names" in f[y].attrs:
                attrs.setdefault("class_names", plain(f[y].attrs["class_names"]))
    except OSError:
        return {}
    attrs["_path"] = str(path)
    return attrs


def image_schema(spec: Mapping[str, Any], config: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> dict[str, Any]:
    image = config.get("image") or {}
    size = spec["image_size"]
    if size is None and attrs.get("_sample_shape"):  # a ResNet: the size it was trained at
        size = int(attrs["_sample_shape"][-1])
    names = class_names(attrs)
    if names is not None and len(names) != spec["num_classes"]:
        names = None  # a file that does not describe this model's outputs
    mean, std = normalisation(image, attrs)
    return {"kind": "image", "layout": "NCHW", "dtype": "float32", "channels": spec["in_channels"],
            "image_size": size, "scale": float(image.get("scale", 255.0)),
            "mean": mean, "std": std, "num_classes": spec["num_classes"],
            "class_names": names, "transform": "integer pixels / scale, then (x - mean) / "
            "std (a list: per channel)"}


def class_names(attrs: Mapping[str, Any]) -> list[str] | None:
    """The image recipes' class names: "classes" (a JSON list) or "class_names"."""
    names = attrs.get("classes", attrs.get("class_names"))
    if isinstance(names, str):
        try:
            names = json.loads(names)
        except ValueError:
            return None
    return [str(n) for n in names] if isinstance(names, list) else None


def normalisation(image: Mapping[str, Any], attrs: Mapping[str, Any]
                  ) -> tuple[float | list[float], float | list[float]]:
    """(mean, std) the run normalised by: the config's scalars, or with image.normalize =
    "file" the training file's per-channel statistics (which must then be readable)."""
    if image.get("normalize", "scalar") != "file":
        return float(image.get("mean", 0.0)), float(image.get("std", 1.0))
    if "mean" not in attrs or "std" not in attrs:
        raise bundle.ExportError(
            "the run normalised images by its training file's per-channel mean and std "
            "(image.normalize='file'), but that file is not readable at data.path: export "
            "where the training data is, so that config.json gets the right normalisation")
    mean, std = (np.atleast_1d(np.asarray(attrs[k], np.float64)).tolist() for k in ("mean", "std"))
    return mean, std


def lm_schema(spec: Mapping[str, Any], config: Mapping[str, Any],
              attrs: Mapping[str, Any]) -> dict[str, Any]:
    return {"dtype": "int64", "shape": "(batch, t <= seq_len) token ids",
            "seq_len": spec["seq_len"], "vocab_size": spec["vocab_size"]}


def lm_tokenizer(config: Mapping[str, Any], attrs: Mapping[str, Any]
                 ) -> tuple[dict[str, Any], str | None]:
    """config.json's tokenizer entry and the tokenizer.json text to ship, if any."""
    name = attrs.get("tokenizer")
    sha = attrs.get("tokenizer_sha256") or (config.get("lm") or {}).get("tokenizer_sha256")
    entry = {"name": name, "sha256": sha or None, "eod_id": attrs.get("eod_id")}
    if name in (None, "bytes") or str(name).startswith("markov-"):
        return entry, None
    path = Path(str(attrs["_path"])).parent / bundle.TOKENIZER
    if not path.is_file():
        return entry, None
    # Beside data that may be linked in, so a link is followed; read within the limit an
    # export's own tokenizer.json has, and the bytes hashed are the bytes shipped.
    try:
        raw = bundle.read_small(path, bundle.MAX_TOKENIZER_BYTES, follow=True)
        text = raw.decode("utf-8")
    except bundle.ExportError as exc:
        raise ckformat.CheckpointError(f"{exc}; not exported") from None
    except UnicodeDecodeError as exc:
        raise ckformat.CheckpointError(f"{path}: not UTF-8 text ({exc}); not exported") from None
    if hashlib.sha256(raw).hexdigest() != sha:
        raise ckformat.CheckpointError(f"{path}: its sha256 is not the {str(sha)[:16]}... the "
                                       "training data was made with; not exported")
    return entry, text


def recsys_schema(spec: Mapping[str, Any], config: Mapping[str, Any],
                  attrs: Mapping[str, Any]) -> dict[str, Any]:
    return {"inputs": "(dense, sparse)", "dense": f"float32 (batch, {spec['dense_features']})",
            "sparse": f"int64 (batch, {len(spec['table_sizes'])}), id < table_sizes[field]",
            "table_sizes": spec["table_sizes"], "output": "click logit per row"}


SCHEMAS = {"image": image_schema, "lm": lm_schema, "recsys": recsys_schema}


def built_schema(entry: Mapping[str, Any], config: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs of a model its task's builder made (hpcdp.tasks.rebuild), told by the
    task's config section: a task with an [image] section reads images as the image task
    does (so `hpcdp predict` feeds them), one with [lm] token ids; any other, its samples'
    shape."""
    shape = list(entry["sample_shape"])
    if "image" in config and len(shape) == 3:
        facts = {"in_channels": shape[0], "image_size": shape[1] if shape[1] == shape[2] else
                 None, "num_classes": int(config["image"]["num_classes"])}
        return image_schema(facts, config, attrs)
    if "lm" in config:
        lm = config["lm"]
        return {"kind": "tokens", "dtype": "int64", "shape": "(batch, t <= seq_len) token ids",
                "seq_len": lm.get("seq_len"), "vocab_size": lm.get("vocab_size")}
    return {"kind": "samples", "sample_shape": shape}


def input_schema(trained: Trained, attrs: Mapping[str, Any]) -> dict[str, Any]:
    if rebuild.is_builder(trained.spec):
        return built_schema(trained.spec, trained.config, attrs)
    return SCHEMAS[trained.task](trained.spec, trained.config, attrs)


def export_config(trained: Trained, attrs: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """config.json's content (less the weights entry) and the tokenizer text to ship."""
    config, task = trained.config, trained.task
    out: dict[str, Any] = {
        "task": task, "model": trained.spec,
        "input": input_schema(trained, attrs),
        "source": {"checkpoint": str(trained.path), "step": trained.state.get("step"),
                   "epoch": trained.state.get("epoch"),
                   "data_file": attrs.get("_path"), "hpcdp_version": __version__,
                   "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    }
    text = None
    if "lm" in config:
        out["tokenizer"], text = lm_tokenizer(config, attrs)
    return out, text


def export(source: Path, out: Path, trust: cktrust.Trust | None = None) -> dict[str, Any]:
    """Write the export folder of `source` (run folder or checkpoint); returns config.json."""
    trained = load(source, trust or cktrust.Trust())
    attrs = data_attrs(trained.config)
    config, text = export_config(trained, attrs)
    bundle.write(out, specs.own_tensors(trained.model), config, text)
    return bundle.read_config(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="hpcdp export",
        description="Write a trained model as model.safetensors + config.json (+ tokenizer.json) "
        "for use outside training (hpcdp.export.load, hpcdp generate, hpcdp predict). The "
        "checkpoint is verified like a resume; optimizer, reader and RNG state are left out.")
    p.add_argument("source", type=Path, help="a run folder (its newest checkpoint) or a "
                   "checkpoint file (step-N.pt)")
    p.add_argument("--out", type=Path, required=True, help="the export folder to write")
    p.add_argument("--allow-group-write", action="store_true",
                   help="accept a checkpoint or folder that your group can write")
    from hpcdp.cliargs import parse_args

    args = parse_args(p, argv)
    try:
        config = export(args.source, args.out, cktrust.Trust(args.allow_group_write))
    except (ckformat.CheckpointError, specs.SpecError, bundle.ExportError, ConfigError,
            OSError) as e:
        print(f"hpcdp export: error: {e}", file=sys.stderr)
        return 2
    src = config["source"]
    print(f"exported {config['task']} model {config['model']['name']} from {src['checkpoint']} "
          f"(step {src['step']}) -> {args.out}")
    if config["input"].get("kind") == "image" and not config["input"].get("class_names"):
        print("  no class names found in the training data: predictions will show class numbers")
    return 0
