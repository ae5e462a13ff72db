"""The recsys task's pure parts: its optimizers on one schedule, metrics, config checks."""

from __future__ import annotations

import math

import pytest
import torch

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.config import ConfigError
from hpcdp.models.dlrm import DLRM
from hpcdp.tasks import recsys
from hpcdp.tasks.auc import auc_logloss
from hpcdp.train import schedule as sched


def config(*overrides: str) -> cfgmod.Config:
    return cfgmod.build(None, ["task.name=recsys", "data.path=d", *overrides], tasks.defaults)


def test_the_task_defaults_and_its_section() -> None:
    cfg = config()
    assert (cfg.model.name, cfg.optim.name, cfg.optim.lr_scaling) == ("dlrm", "adamw", "none")
    assert cfg.horovod.sparse_grads == "sparse" and cfg.recsys.table_optim == "adagrad"
    with pytest.raises(ConfigError, match="horovod.sparse_grads='both': choose one of sparse"):
        config("horovod.sparse_grads=both")
    with pytest.raises(ConfigError, match="recsys.bottom and recsys.top"):
        config("recsys.top=[0]")
    with pytest.raises(ConfigError, match="recsys.table_lr must be positive"):
        config("recsys.table_lr=0")


def test_the_tables_follow_the_schedule_at_their_own_rate() -> None:
    cfg = config("optim.lr=0.002", "recsys.table_lr=0.05")
    model = recsys.ClickModel(4, (10, 7), embed_dim=4, bottom=(8,), top=(8,))
    tables, mlps = recsys.optimizers(cfg, model)
    assert isinstance(tables, torch.optim.Adagrad) and isinstance(mlps, torch.optim.AdamW)
    assert {id(p) for p in tables.param_groups[0]["params"]} == {
        id(e.weight) for e in model.embeddings}
    for opt in (tables, mlps):
        sched.set_lr(opt, 0.001)  # half the peak: both optimizers at half their rates
    assert tables.param_groups[0]["lr"] == pytest.approx(0.025)
    assert mlps.param_groups[0]["lr"] == pytest.approx(0.001)


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_a_large_batch_optimizer_takes_the_mlps_beside_the_tables(name: str) -> None:
    cfg = config(f"optim.name={name}", "optim.weight_decay=0.01")
    model = recsys.ClickModel(4, (10, 7), embed_dim=4, bottom=(8,), top=(8,))
    tables, mlps = recsys.optimizers(cfg, model)
    assert isinstance(tables, torch.optim.Adagrad) and type(mlps).__name__ == name.upper()
    mine = {id(p) for g in mlps.param_groups for p in g["params"]}
    assert not mine & {id(e.weight) for e in model.embeddings}
    assert len(mine) == len(list(model.parameters())) - len(model.embeddings)
    decayed = [p for g in mlps.param_groups if g["weight_decay"] > 0 for p in g["params"]]
    assert decayed and all(p.dim() == 2 for p in decayed)  # the MLPs' matrices, no biases


def test_metrics_of_a_batch_and_the_gathered_auc() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0])
    label = torch.tensor([1.0, 0.0, 0.0, 1.0])
    mean_loss = recsys.loss(logits, (label, 0.0))
    got = recsys.measure(logits, (label, 3 * 2**20), mean_loss)
    want = auc_logloss(logits.numpy(), label.numpy())
    assert float(got["logloss"]) / 4 == pytest.approx(want["logloss"])
    assert float(got["table_mb"]) == pytest.approx(3 * 4)  # 3 MB per batch, times its rows
    assert recsys.auc_of_rows(got["auc"]) == pytest.approx(want["auc"]) == 0.5
    assert math.isnan(recsys.auc_of_rows(torch.tensor([[0.3, 1.0], [0.1, 1.0]])))


def test_the_model_takes_the_inputs_as_one_value() -> None:
    torch.manual_seed(0)
    model = recsys.ClickModel(4, (10, 7), embed_dim=4)
    dense, ids = torch.randn(5, 4), torch.tensor([[1, 2], [9, 6], [0, 0], [3, 4], [1, 2]])
    assert torch.equal(model((dense, ids)), DLRM.forward(model, dense, ids))
