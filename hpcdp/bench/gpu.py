"""`hpcdp bench gpu`: one device's training throughput for the three workloads, eager
and compiled, at the shapes users run (docs/gpu.md).

Each case builds its run the way `hpcdp train` does (hpcdp.train.setup.build: the
real readers, task, model, optimizers and the run.* speed options) in this one
process, then times `train_step`, the loop's own step, over `--steps` steps after
`--warmup` (compilation happens in the warm-up and is reported apart):

- ResNet-50, 224 x 224 uint8 images, bf16: read from an HDF5 file (the sharded
  reader, pinned memory) and from memory (one batch kept on the host and handed
  over again each step: the copy and conversion stay, the reading goes), which
  together show what the data costs;
- GPT-2 124M at 1,024 tokens, bf16, from a token file of random ids;
- the click model (DLRM) at a large batch, from a generated click log.

Per case: samples/s (tokens/s for the GPT), the step split into data / compute /
communication (one device: communication is the optimizer wrappers' wait, near
zero), the data share, MFU where the device's peak is known (FLOPs counted by
PyTorch's FlopCounterMode on one eager step), and peak device memory.
`--tiny` runs the same code at toy shapes on the CPU in seconds (the tests).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpcdp.bench import common, train_lm
from hpcdp.cliargs import parse_args as parse_cli

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
#: bf16 dense peak of the H200 SXM: 989 TFLOP/s (NVIDIA's H200 datasheet gives 1,979
#: with 2:4 sparsity; dense is half). The table every MFU here uses: hpcdp.models.gpt.
PEAK_SOURCE = "NVIDIA H100/H200 datasheets (dense bf16, half the sparsity figure)"


@dataclass(frozen=True)
class Shapes:
    """Sizes of every case: the full ones for a GPU, the tiny ones for a CPU test."""

    image_size: int
    image_batch: int
    image_samples: int  # in the HDF5 file (the reader loops over it)
    resnet: str  # model.name
    resnet_width: int  # image.width; 0: the model's own
    gpt_layers: int
    gpt_heads: int
    gpt_width: int
    gpt_seq: int
    gpt_batch: int
    clicks_batch: int


FULL = Shapes(224, 256, 2048, "resnet50", 0, 12, 12, 768, 1024, 32, 65536)
TINY = Shapes(32, 8, 64, "resnet18", 8, 1, 2, 32, 32, 4, 256)


@dataclass(frozen=True)
class Case:
    """One timed configuration."""

    label: str  # resnet50_hdf5, gpt2_124m, dlrm, ...
    data: str  # key of its prepared data
    source: str  # "hdf5" (the task's reader) | "memory" (one batch handed over again)
    config: Path | None
    overrides: tuple[str, ...]
    unit: str = "samples"  # what the headline rate counts: samples | tokens
    tokens_per_sample: int = 1


def cases(s: Shapes, compile_modes: list[str]) -> list[tuple[Case, str]]:
    """Every (case, compile mode) in run order; mode "off" is eager."""
    image = ("task.name=image", f"model.name={s.resnet}", "image.num_classes=1000",
             f"image.width={s.resnet_width}",
             "image.cifar_stem=false", f"data.batch_size={s.image_batch}",
             "run.precision=bf16", "optim.name=sgd")
    gpt = ("model.name=gpt", f"lm.layers={s.gpt_layers}", f"lm.heads={s.gpt_heads}",
           f"lm.width={s.gpt_width}", f"lm.seq_len={s.gpt_seq}", "data.global_batch_size=0",
           f"data.batch_size={s.gpt_batch}", "data.val_batch_size=1", "run.precision=bf16")
    clicks = (f"data.batch_size={s.clicks_batch}", "recsys.check_data=false",
              "data.val_batch_size=1024", "run.precision=bf16")
    base = [Case(f"{s.resnet}_hdf5", "images", "hdf5", None, image),
            Case(f"{s.resnet}_memory", "images", "memory", None, image),
            Case("gpt2_124m" if s is FULL else "gpt_tiny", "tokens", "hdf5",
                 CONFIGS / "lm_markov.toml", gpt, "tokens", s.gpt_seq),
            Case("dlrm", "clicks", "hdf5", CONFIGS / "clicks.toml", clicks)]
    return [(c, m) for m in compile_modes for c in base]


def write_images(out: Path, n: int, size: int, classes: int = 1000, seed: int = 0) -> Path:
    """train.h5 / val.h5 of random uint8 images (3 x size x size), chunks of 64 samples."""
    import h5py

    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", n), ("val", 64)):
        with h5py.File(out / f"{split}.h5", "w") as f:
            x = f.create_dataset("x", (count, 3, size, size), np.uint8,
                                 chunks=(min(64, count), 3, size, size))
            for i in range(0, count, 256):  # bounded memory for the full size
                k = min(256, count - i)
                x[i:i + k] = rng.integers(0, 256, (k, 3, size, size), dtype=np.uint8)
            f.create_dataset("y", data=rng.integers(0, classes, count, dtype=np.int64))
    return out


def prepare_data(root: Path, s: Shapes, steps: int, timeout: float) -> dict[str, Path]:
    """Every case's files, written once at the start (part of the run's time)."""
    paths = {"images": write_images(root / "images", s.image_samples, s.image_size)}
    windows = max((steps + 1) * s.gpt_batch, 64)
    paths["tokens"] = root / "tokens"
    write_tokens(paths["tokens"], windows, s.gpt_seq)
    paths["clicks"] = root / "clicks"
    rows = (steps + 2) * s.clicks_batch
    cmd = [sys.executable, "-m", "hpcdp.data.prep.clicks.recipe", "--out", str(paths["clicks"]),
           "--rows", str(rows), "--val-rows", "1024"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=common.pythonpath_env())
    if done.returncode:
        raise common.BenchError(f"writing the click log failed:\n{done.stdout}{done.stderr}")
    return paths


def write_tokens(out: Path, windows: int, seq_len: int) -> None:
    """Uniform random ids of the GPT-2 vocabulary (hpcdp.bench.train_lm's corpus)."""
    if seq_len == train_lm.SEQ_LEN:
        train_lm.write_corpus(out, windows)
        return
    # train_lm's file is laid out for 1,024-token windows; enough tokens for these
    train_lm.write_corpus(out, max(1, windows * seq_len // train_lm.SEQ_LEN + 2))


def batches(run: Any, source: str) -> Iterator[Any]:
    """The training reader's batches epoch after epoch, or its first batch forever."""
    if source == "memory":
        run.train_reader.set_epoch(0)
        it = iter(run.train_reader)
        first = next(it)
        if hasattr(it, "close"):
            it.close()
        while True:
            yield first
    epoch = 0
    while True:
        run.train_reader.set_epoch(epoch)
        yield from run.train_reader
        epoch += 1


def flops_per_sample(run: Any, batch: Any) -> float | None:
    """Forward and backward FLOPs of one sample, counted by PyTorch on one eager step."""
    from torch.utils.flop_counter import FlopCounterMode

    from hpcdp.train.accel import to_layout
    from hpcdp.train.numerics import autocast

    inputs, targets = run.task.prepare(batch, run.cfg, run.device)
    inputs = to_layout(inputs, run.channels_last)
    n = run.task.count(targets)
    counter = FlopCounterMode(display=False)
    try:  # forward() itself: the eager code even where run.compile compiled the module
        with counter, autocast(run.cfg, run.device):
            run.task.loss(run.model.forward(inputs), targets).backward()
    except Exception:  # noqa: BLE001 - an operator the counter cannot follow: no MFU
        return None
    finally:
        for p in run.model.parameters():
            p.grad = None
    total = counter.get_total_flops()
    return float(total) / max(int(n), 1) if total else None


def peak_flops(device: Any) -> float | None:
    import torch

    from hpcdp.models import gpt

    if device.type != "cuda":
        return None
    return gpt.peak_flops(torch.cuda.get_device_name(device))


def measure(case: Case, mode: str, data: Path, args: argparse.Namespace,
            flops: dict[str, float | None]) -> dict[str, Any]:
    """Build the case's run, warm up (compiling), time `args.steps` steps."""
    import torch

    from hpcdp import config as cfgmod
    from hpcdp import tasks
    from hpcdp.train import setup
    from hpcdp.train.evaluate import MetricSums
    from hpcdp.train.step import train_step

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="hpcdp-bench-gpu-") as tmp:
        overrides = [f"data.path={data}", f"run.dir={tmp}", "log.tensorboard=false",
                     "log.progress=false", "run.epochs=100000", f"run.device={device.type}",
                     f"run.compile={'false' if mode == 'off' else 'true'}",
                     f"run.compile_mode={'default' if mode == 'off' else mode}",
                     *case.overrides, *args.set]
        cfg = cfgmod.build(case.config, overrides, tasks.defaults)
        task = tasks.get(cfg.task.name)
        run = setup.build(cfg, task, 0, 1, device)
        run.model.train()
        feed = batches(run, case.source)
        if case.label not in flops:  # eager first: the counter needs the plain model
            flops[case.label] = flops_per_sample(run, next(feed))
        sums = MetricSums(task.metrics, device, training=True)
        t0 = time.perf_counter()
        for step in range(args.warmup):
            train_step(run, feed, run.schedule.lr(0), sums, step)
        warmup_s = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        totals = np.zeros(3)
        t0 = time.perf_counter()
        for step in range(args.steps):
            totals += train_step(run, feed, run.schedule.lr(0), sums,
                                 args.warmup + step).folded()
        wall = time.perf_counter() - t0
        memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        return result(case, mode, run.batch, args.steps, totals, wall, warmup_s,
                      flops[case.label], peak_flops(device), memory)


def result(case: Case, mode: str, batch: int, steps: int, totals: np.ndarray, wall: float,
           warmup_s: float, flops: float | None, peak: float | None,
           memory: int | None) -> dict[str, Any]:
    """One case's row of the JSON; pure."""
    data_s, compute_s, comm_s = (float(t) for t in totals)
    step_s = data_s + compute_s + comm_s
    samples_per_s = batch * steps / wall
    row: dict[str, Any] = {
        "case": case.label, "source": case.source, "compile": mode, "batch": batch,
        "steps": steps, "samples_per_s": samples_per_s,
        "step_ms": 1000 * wall / steps, "data_ms": 1000 * data_s / steps,
        "compute_ms": 1000 * compute_s / steps, "comm_ms": 1000 * comm_s / steps,
        "data_share": data_s / step_s if step_s else 0.0, "warmup_s": warmup_s,
        "flops_per_sample": flops, "mfu": (samples_per_s * flops / peak
                                           if flops and peak else None),
        "peak_memory_gib": memory / 2**30 if memory is not None else None,
    }
    if case.unit == "tokens":
        row["tokens_per_s"] = samples_per_s * case.tokens_per_sample
    return row


def table(rows: list[dict[str, Any]]) -> str:
    def rate(r: dict[str, Any]) -> str:
        if "tokens_per_s" in r:
            return f"{r['tokens_per_s']:,.0f} tok/s"
        return f"{r['samples_per_s']:,.0f} samples/s"

    return common.format_table(
        ["case", "compile", "rate", "step ms", "data/compute/comm ms", "data share", "MFU",
         "peak GiB", "warm-up s"],
        [[r["case"], r["compile"], rate(r), f"{r['step_ms']:.1f}",
          f"{r['data_ms']:.1f}/{r['compute_ms']:.1f}/{r['comm_ms']:.2f}",
          f"{r['data_share']:.1%}", "-" if r["mfu"] is None else f"{r['mfu']:.1%}",
          "-" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f}",
          f"{r['warmup_s']:.0f}"] for r in rows])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hpcdp bench gpu", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench/results", help="folder for gpu.json")
    p.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="toy shapes: a seconds-long CPU check")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps (compilation)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per case")
    p.add_argument("--compile", default="off,default",
                   help="comma list of run.compile_mode values, off = eager")
    p.add_argument("--only", default="", help="comma list of case labels (default: all)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every case (repeatable)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the data prep")
    return parse_cli(p, argv)


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("hpcdp bench gpu: no CUDA device here (use --tiny --device cpu for the "
              "CPU check)", file=sys.stderr)
        return 2
    shapes = TINY if args.tiny else FULL
    modes = [m.strip() for m in args.compile.split(",") if m.strip()]
    only = {c.strip() for c in args.only.split(",") if c.strip()}
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    flops: dict[str, float | None] = {}
    failed: list[dict[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="hpcdp-bench-gpu-data-") as tmp:
        paths = prepare_data(Path(tmp), shapes, args.warmup + args.steps, args.timeout)
        prep_s = time.perf_counter() - started
        print(f"bench gpu: data written in {prep_s:.0f} s", flush=True)
        for case, mode in cases(shapes, modes):
            if only and case.label not in only:
                continue
            try:
                row = measure(case, mode, paths[case.data], args, flops)
            except Exception as e:  # noqa: BLE001 - one case's failure must not cost the rest
                failed.append({"case": case.label, "compile": mode,
                               "error": f"{type(e).__name__}: {e}"})
                print(f"bench gpu: {case.label} compile={mode} FAILED: {failed[-1]['error']}",
                      flush=True)
                continue
            rows.append(row)
            print(json.dumps(row), flush=True)
            with contextlib.suppress(Exception):
                torch.cuda.empty_cache()
    print(table(rows), flush=True)
    device = (torch.cuda.get_device_name(0) if args.device == "cuda" else args.device)
    payload = {"benchmark": "gpu", "params": {**vars(args), "shapes": vars(shapes)},
               "device": device, "peak_source": PEAK_SOURCE, "machine": common.machine_metadata(),
               "rows": rows, "failed": failed, "prep_s": prep_s,
               "total_s": time.perf_counter() - started}
    path = common.write_json(Path(args.out) / "gpu.json", payload)
    print(f"bench gpu: {path} ({payload['total_s']:.0f} s in all)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
