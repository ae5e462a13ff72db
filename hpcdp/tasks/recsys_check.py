"""Does the click model learn? Train it in one process on a click folder and score it.

No trainer and no Horovod: the training file is read with `FieldReader`, the
model and optimizers come from `hpcdp.models.dlrm`, and the validation AUC is
set beside the file's `oracle_auc` (the best any model can reach) and
`baseline_auc` (item popularity alone).

    python -m hpcdp.tasks.recsys_check --data data/clicks --seconds 60
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from hpcdp.data.format.clicks import read_schema
from hpcdp.data.read.multi_field import FieldReader
from hpcdp.models.dlrm import DLRM, loss_fn, make_optimizers
from hpcdp.tasks.auc import auc_logloss


@dataclass(frozen=True)
class CheckOptions:
    seconds: float = 60.0
    max_epochs: int = 20
    batch: int = 512
    embed_dim: int = 16
    sparse_lr: float = 0.05
    dense_lr: float = 1e-3
    seed: int = 0


def validation_arrays(path: Path) -> tuple[list[torch.Tensor], dict[str, float]]:
    """The whole validation split as tensors, and its reference AUCs."""
    with h5py.File(path, "r") as f:
        tensors = [torch.from_numpy(f[k][:]) for k in ("dense", "sparse", "label")]
        refs = {k: float(f.attrs[k]) for k in ("oracle_auc", "baseline_auc")}
    return tensors, refs


@torch.no_grad()
def score(model: DLRM, tensors: list[torch.Tensor], batch: int = 8192) -> dict[str, float]:
    dense, sparse, label = tensors
    model.eval()
    logits = torch.cat([model(dense[i : i + batch], sparse[i : i + batch])
                        for i in range(0, len(label), batch)])
    model.train()
    return auc_logloss(logits.numpy(), label.numpy())


def run(data: Path, opts: CheckOptions) -> dict[str, float]:
    """Train until the time or epoch budget ends; the best epoch's validation scores."""
    schema = read_schema(data / "train.h5")
    val, refs = validation_arrays(data / "val.h5")
    torch.manual_seed(opts.seed)
    model = DLRM(schema.dense_features, schema.table_sizes, opts.embed_dim)
    sparse_opt, dense_opt = make_optimizers(model, "adagrad", opts.sparse_lr, opts.dense_lr)
    reader = FieldReader(data / "train.h5", ("dense", "sparse", "label"), batch_size=opts.batch,
                         seed=opts.seed)
    start, samples, best = time.perf_counter(), 0, {"auc": 0.0, "logloss": float("inf")}
    epoch = 0
    while epoch < opts.max_epochs and time.perf_counter() - start < opts.seconds:
        reader.set_epoch(epoch)
        for dense, sparse, label in reader:
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss_fn(model(dense, sparse), label).backward()
            sparse_opt.step()
            dense_opt.step()
            samples += len(label)
            if time.perf_counter() - start > opts.seconds:
                break
        epoch += 1
        got = score(model, val)
        best = got if got["auc"] > best["auc"] else best
    reader.close()
    seconds = time.perf_counter() - start
    return {"val_auc": best["auc"], "val_logloss": best["logloss"], **refs,
            "epochs": epoch, "samples": samples, "seconds": round(seconds, 1),
            "samples_per_s": round(samples / seconds)}


def main(argv: Sequence[str] | None = None) -> int:
    d = CheckOptions()
    p = argparse.ArgumentParser(prog="python -m hpcdp.tasks.recsys_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, type=Path, help="folder with train.h5 and val.h5")
    for field, value in asdict(d).items():
        p.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    args = vars(p.parse_args(argv))
    data = args.pop("data")
    torch.set_num_threads(1)
    result = run(data, CheckOptions(**args))
    print(json.dumps(result))
    gap = result["oracle_auc"] - result["val_auc"]
    lift = result["val_auc"] - result["baseline_auc"]
    print(f"val AUC {result['val_auc']:.4f}: {gap:.4f} below the oracle "
          f"({result['oracle_auc']:.4f}), {lift:.4f} above item popularity "
          f"({result['baseline_auc']:.4f})")
    return 0 if np.isfinite(result["val_auc"]) else 1


if __name__ == "__main__":
    sys.exit(main())
