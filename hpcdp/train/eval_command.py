"""`hpcdp eval`: a checkpoint's validation metrics on any file of its task's format.

    hpcdp eval --config CFG [--checkpoint PATH | --run DIR] [--file PATH] key=value...

Runs alone or under the launchers training runs under (mpirun, horovodrun,
srun): every rank reads the checkpoint as a resume would (permissions,
checksum, weights-only; hpcdp.train.trained), opens its share of the file with
the task's validation reader (hpcdp.train.setup.validation_reader: every sample
once over the ranks), and `hpcdp.train.evaluate.evaluate` scores it, the very
function training validates with. Pointed at a run's validation file with its
batch size, it gives that run's final validation numbers. Rank 0 writes
eval.json (default: the run folder's).

Set-up errors (a missing file, a checkpoint of another task, a file whose
vocabulary or tables do not fit the model) are agreed on by every rank before
the first collective, so all ranks stop with the same message.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.config import Config, ConfigError
from hpcdp.runtime.crash import report_crashes
from hpcdp.tasks import Task, image, rebuild
from hpcdp.train import accel
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust
from hpcdp.train.trained import checkpoint_of, run_config


@dataclass
class EvalRun:
    """What `evaluate` reads from a run: the model, its task and config, a device, batches."""

    cfg: Config
    task: Task
    device: torch.device
    model: torch.nn.Module
    val_reader: Any
    channels_last: bool  # inputs in channels_last, as the model (training's layout rule)


@dataclass
class Request:
    cfg: Config
    checkpoint: Path
    file: Path
    out: Path


def parse(argv: list[str] | None) -> Request:
    p = argparse.ArgumentParser(
        prog="hpcdp eval",
        description="Score a checkpoint on a dataset of its task's format: accuracy, loss "
        "and perplexity, AUC and log loss; every sample once over 1 or N ranks (launch it "
        "like training). Overrides like data.val_batch_size=128 apply to the config.")
    p.add_argument("--config", "-c", help="TOML config (default: the run folder's config.toml)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", type=Path, help="a checkpoint file (step-N.pt)")
    which.add_argument("--run", type=Path, help="a run folder: its newest verified checkpoint")
    p.add_argument("--file", type=Path, help="the file to score (default: data.path/"
                   "data.val_file)")
    p.add_argument("--out", type=Path, help="where to write eval.json (default: the run "
                   "folder's eval.json)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    from hpcdp.cliargs import parse_args

    args = parse_args(p, argv)
    if args.config is None and args.run is None:
        raise ConfigError("give --config, --run, or both")
    cfg = (cfgmod.build(args.config, args.overrides, tasks.defaults) if args.config
           else run_config(args.run, args.overrides))
    trust = cktrust.Trust(cfg.checkpoint.allow_group_write, cfg.checkpoint.strict_permissions)
    source = args.checkpoint or args.run or cfg.checkpoint_dir
    path = checkpoint_of(Path(source), trust)
    file = args.file or Path(cfg.data.path) / cfg.data.val_file
    run_dir = args.run or cfg.run_dir
    return Request(cfg, path, file, args.out or Path(run_dir) / "eval.json")


def eval_batch(cfg: Config, size: int) -> int:
    """The per-rank batch training had; data.val_batch_size, where set, comes first
    (setup.validation_reader), so the batches are those of the run's validation."""
    g = cfg.data.global_batch_size
    return max(1, g // size) if g else cfg.data.batch_size


def fit_error(task: str, spec: dict[str, Any], reader: Any, file: Path) -> str | None:
    """Why the model cannot score `file`'s samples (their vocabulary, tables, channels;
    for a model its task's builder made, the sample shape it was built for)."""
    if rebuild.is_builder(spec):
        shape, built = getattr(reader, "sample_shape", None), spec["sample_shape"]
        if shape is not None and list(shape) != list(built):
            return f"{file}: samples shaped {tuple(shape)}, but the model was built for " \
                   f"{tuple(built)}"
        return None
    if task == "lm":
        vocab = reader.reader.vocab_size
        if vocab > spec["vocab_size"]:
            return (f"{file}: vocabulary {vocab}, but the model has {spec['vocab_size']} "
                    "token ids")
    elif task == "recsys":
        from hpcdp.data.format.clicks import read_schema

        tables = list(read_schema(str(file)).table_sizes)
        if tables != list(spec["table_sizes"]):
            return f"{file}: table_sizes {tables}, but the model's tables are " \
                   f"{spec['table_sizes']}"
    else:
        shape = tuple(reader.sample_shape)
        size = spec.get("image_size")
        if shape[0] != spec["in_channels"] or (size and shape[1:] != (size, size)):
            return (f"{file}: samples shaped {shape}, but the model takes "
                    f"{spec['in_channels']} channels{f' of {size}x{size}' if size else ''}")
    return None


def model_classes(got: Any) -> int | None:
    """The outputs of a trained image classifier (its spec's, or for a model its task's
    builder made, the image.num_classes it was built with); None for other models."""
    if rebuild.is_builder(got.spec):
        count = (got.spec["config"].get("image") or {}).get("num_classes")
        return count if isinstance(count, int) else None
    return int(got.spec["num_classes"]) if "num_classes" in got.spec else None


def build(req: Request, task: Task, rank: int, size: int, device: torch.device) -> EvalRun:
    """The model and this rank's share of the file; raises on anything that does not fit."""
    from hpcdp.train import setup, trained

    cfg = req.cfg
    got = trained.load(req.checkpoint, cktrust.Trust(cfg.checkpoint.allow_group_write,
                                                     cfg.checkpoint.strict_permissions))
    if got.task != cfg.task.name:
        raise ConfigError(f"{req.checkpoint} holds a {got.task!r} model, but the config's "
                          f"task is {cfg.task.name!r}")
    # The file stands for the training data too, where a task's checks compare with it
    # (the click tables): the model's own sizes are checked by fit_error instead.
    data = dataclasses.replace(cfg.data, path=str(req.file.parent),
                               train_file=req.file.name, val_file=req.file.name)
    cfg = dataclasses.replace(cfg, data=data)
    classes = model_classes(got)
    if classes is not None and cfg.own_section()[0] == "image":
        cfg = image.with_num_classes(cfg, classes)  # the labels are checked against these
    if not req.file.is_file():
        raise ConfigError(f"{req.file}: no such file")
    reader = setup.validation_reader(cfg, task, req.file, rank, size, eval_batch(cfg, size))
    why = fit_error(got.task, got.spec, reader, req.file)
    if why:
        raise ConfigError(why)
    model = got.model.to(device)
    # Training's layout and TF32 rules; no compilation: one pass is not worth tracing.
    channels_last = accel.wants_channels_last(cfg.run.channels_last, accel.is_convnet(model),
                                              device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    accel.set_tf32(cfg.run.tf32, device)
    return EvalRun(cfg, task, device, model, reader, channels_last)


def evaluate_on_ranks(req: Request) -> int:
    """Every rank: set up, agree, score (one reduction), rank 0 writes eval.json."""
    from hpcdp.runtime import dist
    from hpcdp.train.evaluate import evaluate
    from hpcdp.train.reporting import setup_logging

    cfg, task = req.cfg, tasks.get(req.cfg.task.name)
    dist.init(cfg.horovod, cfg.run_dir,
              on_gpu=dist.wants_gpu(cfg.run.device, torch.cuda.is_available()),
              cpu_bind=cfg.run.cpu_bind)
    rank, size = dist.rank(), dist.size()
    setup_logging(None, rank == 0)
    with dist.abort_on_error():
        error, run = None, None
        try:
            device = dist.pin_device(cfg.run.device)
            run = build(req, task, rank, size, device)
        except Exception as e:  # noqa: BLE001 - any setup failure is reported on all ranks
            error = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        dist.agree(error, "eval")                                  # collective: hpcdp.agree.eval
        assert run is not None
        values = evaluate(run)                                     # collective: val metrics
        if rank == 0:
            write_result(req, values, size)
    return 0


def write_result(req: Request, values: dict[str, Any], size: int) -> None:
    result = {"checkpoint": str(req.checkpoint), "file": str(req.file),
              "task": req.cfg.task.name, "world_size": size, **values}
    req.out.parent.mkdir(parents=True, exist_ok=True)
    req.out.write_text(json.dumps(result, indent=2) + "\n")
    shown = " ".join(f"{k} {v:.6g}" for k, v in values.items()
                     if isinstance(v, float) and k != "samples")
    print(f"eval: {shown} on {values['samples']} samples of {req.file} "
          f"({size} rank(s)); written to {req.out}", flush=True)


def main(argv: list[str] | None = None) -> int:
    report_crashes()
    try:
        req = parse(argv)
    except (ConfigError, ckformat.CheckpointError) as e:
        print(f"hpcdp eval: error: {e}", file=sys.stderr, flush=True)
        return 2
    from hpcdp.runtime import dist

    try:
        code = evaluate_on_ranks(req)
    except dist.AgreedError as e:
        print(f"hpcdp eval: error: {e}", file=sys.stderr, flush=True)
        code = 2
    dist.shutdown_and_exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
