"""optim.fused: torch's one-pass kernels for SGD and AdamW where they apply, and only there."""

from __future__ import annotations

import pytest
import torch

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.tasks import fusable, optimizer_for


def build(*overrides: str, task: str = "image") -> cfgmod.Config:
    return cfgmod.build(None, [f"task.name={task}", "data.path=data/x", *overrides],
                        tasks.defaults)


def test_dense_cpu_floats_take_the_fused_kernel() -> None:
    assert fusable("auto", [torch.zeros(3), torch.zeros(2, 2, dtype=torch.float64)]) is True


@pytest.mark.parametrize("params", [
    [],  # nothing to fuse
    [torch.zeros(3, dtype=torch.int64)],  # not floating point
    [torch.zeros(3).to_sparse()],  # not strided
    [torch.zeros(3, device="meta")],  # no fused kernel for the device
    [torch.zeros(3), torch.zeros(3, device="meta")],  # two devices
])
def test_anything_else_keeps_torchs_default(params: list[torch.Tensor]) -> None:
    assert fusable("auto", params) is None


def test_off_keeps_torchs_default() -> None:
    assert fusable("off", [torch.zeros(3)]) is None


def test_groups_are_looked_into() -> None:
    groups = [{"params": [torch.zeros(2)]}, {"params": [torch.zeros(2, dtype=torch.int32)]}]
    assert fusable("auto", groups) is None
    assert fusable("auto", groups[:1]) is True


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_the_default_optimizers_are_fused_and_off_is_not(name: str) -> None:
    model = torch.nn.Linear(4, 2)
    fused = optimizer_for(build(f"optim.name={name}"), model.parameters())
    assert all(g["fused"] is True for g in fused.param_groups)
    plain = optimizer_for(build(f"optim.name={name}", "optim.fused=off"), model.parameters())
    assert all(not g["fused"] for g in plain.param_groups)


def test_the_lm_groups_keep_their_decay_and_are_fused() -> None:
    from hpcdp.tasks import lm

    cfg = build("optim.name=adamw", "optim.weight_decay=0.1", task="lm")
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = lm.TASK.optimizers(cfg, net)[0]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert all(g["fused"] is True for g in opt.param_groups)


def test_the_fused_step_is_the_loop_step() -> None:
    """Same update as torch's default implementation (to rounding), momentum included."""
    torch.manual_seed(0)
    a = torch.nn.Linear(8, 3)
    b = torch.nn.Linear(8, 3)
    b.load_state_dict(a.state_dict())
    cfg = build("optim.weight_decay=0.01")
    opts = [optimizer_for(cfg, a.parameters()),
            optimizer_for(build("optim.weight_decay=0.01", "optim.fused=off"), b.parameters())]
    x = torch.randn(16, 8)
    for _ in range(3):
        for net, opt in zip((a, b), opts, strict=True):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)


def test_a_bad_choice_is_refused() -> None:
    with pytest.raises(cfgmod.ConfigError, match="optim.fused"):
        build("optim.fused=yes")
