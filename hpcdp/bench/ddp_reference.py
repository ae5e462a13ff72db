"""The yardstick for `hpcdp bench train`: plain torch DistributedDataParallel over gloo.

Same model, same HDF5 data through the same ShardedReader, same per-rank batch,
same optimizer and one compute thread per rank as hpcdp's training, so that the
only difference left is the communication layer (DDP's bucketed gloo all-reduce
against Horovod's). Started as plain processes (no MPI launcher) with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set by the parent (`launch`).

Rank 0 writes JSON: samples/s over all ranks after the warm-up steps, and the
mean step time.

`--bare` is the other yardstick: the same model and optimizer in a plain loop
(zero_grad, forward, cross entropy, backward, step) on one batch held in memory,
already converted to float, in `np` independent processes (no process group).
What hpcdp's 1-rank step costs beyond it is hpcdp's per-step overhead; `np`
bare processes at once are the machine's ceiling for `np` ranks. Each process
writes its own JSON (`<json>.<rank>`); `launch_bare` sums them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcdp.bench.common import pythonpath
from hpcdp.bench.processes import run_together
from hpcdp.runtime import hvd_settings


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hpcdp.bench.ddp_reference")
    p.add_argument("--data", required=True, help="folder holding train.h5")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--cifar-stem", action="store_true")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--steps", type=int, default=40, help="timed steps after the warm-up")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seq-len", type=int, default=64, help="gpt: tokens per window")
    p.add_argument("--layers", type=int, default=2, help="gpt: transformer blocks")
    p.add_argument("--heads", type=int, default=2, help="gpt: attention heads")
    p.add_argument("--width", type=int, default=0,
                   help="ResNet-18: first stage width (0: the model's default); gpt: the "
                   "residual width (0: 64, lm_markov.toml's)")
    p.add_argument("--json", required=True, help="rank 0 writes its result here")
    p.add_argument("--bare", action="store_true",
                   help="no process group: a plain loop on one in-memory batch")
    return p.parse_args(argv)


def worker(args: argparse.Namespace) -> None:
    """One rank: DDP training for warmup + steps optimizer steps, timed after the warm-up."""
    # torch in the rank only: `hpcdp bench train` imports this module to launch ranks.
    import torch
    import torch.distributed as torch_dist
    import torch.nn.functional as F

    from hpcdp.data.read.samples import ShardedReader
    from hpcdp.models.vision import build_model

    # The threads hpcdp's rule gives this many processes on these CPUs (`launch` sets
    # them), as hpcdp's ranks take: 1 each for 2 processes on 2 cores, both cores for
    # one, so that hpcdp's 1-rank step is compared with a bare step on as many threads.
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    if args.bare:
        bare(args)
        return
    torch_dist.init_process_group("gloo")
    rank, size = torch_dist.get_rank(), torch_dist.get_world_size()
    if args.model == "gpt":
        reader, ddp, opt, step_loss = gpt_parts(args, rank, size)
    else:
        reader = ShardedReader(Path(args.data) / "train.h5", batch_size=args.batch, rank=rank,
                               world_size=size, seed=0)
        torch.manual_seed(0)
        model = build_model(args.model, reader.sample_shape, args.classes, args.width,
                            args.cifar_stem)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        # The same peak learning rate hpcdp uses: scaled by the number of ranks.
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr * size, momentum=0.9)

        def step_loss(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            x = xb.float() / 255.0 if not torch.is_floating_point(xb) else xb
            return F.cross_entropy(ddp(x), yb)
    total = args.warmup + args.steps
    done, epoch, start = 0, 0, 0.0
    while done < total:
        reader.set_epoch(epoch)
        for xb, yb in reader:
            if done == args.warmup:
                torch_dist.barrier()
                start = time.perf_counter()
            opt.zero_grad()
            loss = step_loss(xb, yb)
            loss.backward()  # DDP all-reduces the gradient buckets here
            if args.model == "gpt":  # as hpcdp's lm task: clip the averaged gradients
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            opt.step()
            done += 1
            if done == total:
                break
        epoch += 1
    torch_dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        result = {"world_size": size, "steps": args.steps, "batch": args.batch,
                  "seconds": seconds, "samples_per_s": args.steps * args.batch * size / seconds,
                  "step_ms": 1000 * seconds / args.steps}
        Path(args.json).write_text(json.dumps(result) + "\n")
    torch_dist.destroy_process_group()


def gpt_parts(args: argparse.Namespace, rank: int, size: int) -> tuple[Any, Any, Any, Any]:
    """The lm task's pieces: token windows, the GPT of the given shape (lm_markov.toml's by
    default), AdamW groups."""
    # torch in the rank only: `hpcdp bench train` imports this module to launch ranks.
    import torch

    from hpcdp.data.read.tokens import TokenReader
    from hpcdp.models import gpt
    from hpcdp.optim.groups import param_groups

    reader = TokenReader(Path(args.data) / "train.h5", seq_len=args.seq_len,
                         batch_size=args.batch, rank=rank, world_size=size, seed=0)
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(reader.vocab_size, args.seq_len, layers=args.layers,
                                  heads=args.heads, width=args.width or 64))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(param_groups(ddp.module, 0.1, adaptive=False), lr=3e-3,
                            betas=(0.9, 0.95))
    return reader, ddp, opt, lambda x, y: gpt.lm_loss(ddp(x), y)


def bare(args: argparse.Namespace) -> None:
    """One independent process: the bare loop on one in-memory batch; its own JSON."""
    # torch in the rank only: `hpcdp bench train` imports this module to launch ranks.
    import torch
    import torch.nn.functional as F

    from hpcdp.data.read.samples import ShardedReader
    from hpcdp.models.vision import build_model

    rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    reader = ShardedReader(Path(args.data) / "train.h5", batch_size=args.batch, rank=rank,
                           world_size=size, seed=0, prefetch=0)
    reader.set_epoch(0)
    xb, yb = next(iter(reader))
    x = xb.float() / 255.0 if not torch.is_floating_point(xb) else xb.float()
    torch.manual_seed(0)
    model = build_model(args.model, reader.sample_shape, args.classes, args.width,
                        args.cifar_stem)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0.0
    for done in range(args.warmup + args.steps):
        if done == args.warmup:
            start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), yb).backward()
        opt.step()
    seconds = time.perf_counter() - start
    result = {"world_size": size, "steps": args.steps, "batch": args.batch, "seconds": seconds,
              "samples_per_s": args.steps * args.batch / seconds,
              "step_ms": 1000 * seconds / args.steps}
    Path(f"{args.json}.{rank}").write_text(json.dumps(result) + "\n")


def launch_bare(worker_args: Sequence[str], json_path: Path, np: int,
                timeout: float) -> tuple[bool, str, dict[str, float]]:
    """`np` independent bare loops at once; (ok, output, totals: samples/s summed, mean
    step_ms)."""
    ok, output = launch([*worker_args, "--bare", "--json", str(json_path)], np, timeout)
    if not ok:
        return ok, output, {}
    parts = [json.loads(Path(f"{json_path}.{r}").read_text()) for r in range(np)]
    return ok, output, {"world_size": np, "processes": np,
                        "samples_per_s": sum(p["samples_per_s"] for p in parts),
                        "step_ms": sum(p["step_ms"] for p in parts) / np}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(worker_args: Sequence[str], np: int, timeout: float) -> tuple[bool, str]:
    """Start `np` ranks as plain processes; kill them all at `timeout`. Returns (ok, output)."""
    threads = hvd_settings.recommended_env(ranks=np)["OMP_NUM_THREADS"]  # hpcdp's rule, as hpcdp
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                WORLD_SIZE=str(np), OMP_NUM_THREADS=threads, HDF5_USE_FILE_LOCKING="FALSE",
                PYTHONPATH=pythonpath())
    argv = [sys.executable, "-m", "hpcdp.bench.ddp_reference", *worker_args]
    done = run_together([argv] * np, [dict(base, RANK=str(r)) for r in range(np)], timeout,
                        label="rank")
    return done.ok, done.output


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    worker(args)
    sys.stdout.flush()
    sys.stderr.flush()
    # h5py's teardown after parallel HDF5 can crash at exit; outputs are written already.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
