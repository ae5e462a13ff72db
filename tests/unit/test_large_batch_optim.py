"""LARS and LAMB against their papers' update rules, written out here, and their groups.

The references below are the papers' equations (You et al. 2017, Algorithm 1; You et
al. 2019, Algorithm 2) in float64, one tensor at a time, independent of hpcdp.optim.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.optim import build
from hpcdp.optim.groups import param_groups, roles
from hpcdp.optim.lamb import LAMB
from hpcdp.optim.lars import LARS


def config(*overrides: str) -> cfgmod.Config:
    return cfgmod.build(None, ["task.name=image", "data.path=data/x", *overrides], tasks.defaults)


class Small(nn.Module):
    """A conv, a norm, an embedding, a linear layer: every role once."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 2)
        self.norm = nn.BatchNorm2d(2)
        self.emb = nn.Embedding(5, 3)
        self.fc = nn.Linear(3, 2)


def test_hand_computed_lars_step() -> None:
    # |w| = 5, |g| = 1: trust = 0.1 * 5 / (1 + 0.1 * 5) = 1/3; v = (g + 0.1 w) / 3.
    w, b = torch.tensor([3.0, 4.0], requires_grad=True), torch.tensor([1.0], requires_grad=True)
    opt = LARS([{"params": [w], "weight_decay": 0.1},
                {"params": [b], "weight_decay": 0.0, "adapt": False}],
               lr=1.0, momentum=0.9, trust_coefficient=0.1)
    w.grad, b.grad = torch.tensor([0.6, 0.8]), torch.tensor([0.5])
    opt.step()
    torch.testing.assert_close(w.detach(), torch.tensor([2.7, 3.6]))
    torch.testing.assert_close(b.detach(), torch.tensor([0.5]))  # plain SGD: 1 - 0.5
    # Step 2, same gradients: |w| = 4.5, trust = 0.45 / 1.45; v = 0.9 v + trust (g + 0.1 w).
    opt.step()
    trust = 0.45 / 1.45
    want = [2.7 - (0.9 * 0.3 + trust * (0.6 + 0.27)), 3.6 - (0.9 * 0.4 + trust * (0.8 + 0.36))]
    torch.testing.assert_close(w.detach(), torch.tensor(want))
    torch.testing.assert_close(b.detach(), torch.tensor([0.5 - (0.9 * 0.5 + 0.5)]))


def test_hand_computed_lamb_step() -> None:
    # Step 1: m_hat = g, v_hat = g^2, so r = g / (|g| + eps) = (1, 1) to eps; u = r + 0.1 w.
    w, b = torch.tensor([3.0, 4.0], requires_grad=True), torch.tensor([1.0], requires_grad=True)
    opt = LAMB([{"params": [w], "weight_decay": 0.1},
                {"params": [b], "weight_decay": 0.0, "adapt": False}], lr=0.1, eps=1e-6)
    w.grad, b.grad = torch.tensor([0.6, 0.8]), torch.tensor([-0.5])
    opt.step()
    u = [1.3, 1.4]
    trust = 5.0 / math.hypot(*u)
    want = [x0 - 0.1 * trust * x for x0, x in zip((3.0, 4.0), u, strict=True)]
    torch.testing.assert_close(w.detach(), torch.tensor(want))
    torch.testing.assert_close(b.detach(), torch.tensor([1.1]))  # Adam, no trust: 1 + 0.1


def lars_reference(ws, grads_per_step, adapt, lr, m, wd, eta):
    ws = [w.double().clone() for w in ws]
    vs = [torch.zeros_like(w) for w in ws]
    for grads in grads_per_step:
        for i, (w, g) in enumerate(zip(ws, grads, strict=True)):
            g = g.double()
            if adapt[i]:
                wn, gn = w.norm().item(), g.norm().item()
                local = eta * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0
                vs[i] = m * vs[i] + lr * local * (g + wd * w)
            else:
                vs[i] = m * vs[i] + lr * g
            ws[i] = w - vs[i]
    return ws


def lamb_reference(ws, grads_per_step, adapt, lr, betas, eps, wd):
    ws = [w.double().clone() for w in ws]
    ms = [torch.zeros_like(w) for w in ws]
    vs = [torch.zeros_like(w) for w in ws]
    b1, b2 = betas
    for t, grads in enumerate(grads_per_step, start=1):
        for i, (x, g) in enumerate(zip(ws, grads, strict=True)):
            g = g.double()
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            r = (ms[i] / (1 - b1**t)) / ((vs[i] / (1 - b2**t)).sqrt() + eps)
            if adapt[i]:
                u = r + wd * x
                xn, un = x.norm().item(), u.norm().item()
                ws[i] = x - lr * (xn / un if xn > 0 and un > 0 else 1.0) * u
            else:
                ws[i] = x - lr * r
    return ws


def run_steps(model: nn.Module, opt: torch.optim.Optimizer, steps: int):
    """Three steps on fixed random gradients; returns (initial weights, gradients, final)."""
    gen = torch.Generator().manual_seed(1)
    params = list(model.parameters())
    start = [p.detach().clone() for p in params]
    grads = [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(steps)]
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    return start, grads, [p.detach() for p in params]


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_steps_follow_the_paper_with_bias_and_norm_excluded(name: str) -> None:
    torch.manual_seed(0)
    model = Small()
    cfg = config(f"optim.name={name}", "optim.weight_decay=0.01", "optim.lr=0.5",
                 "optim.trust_coefficient=0.02", "optim.betas=[0.8, 0.9]")
    opt = build.optimizer(cfg, model)
    start, grads, got = run_steps(model, opt, 3)
    # Written out from the module types, not read back from the optimizer's groups:
    # the conv and linear weights are decayed and adapted, the embedding adapted only,
    # the biases and the norm's scale and shift neither.
    kinds = {"conv.weight": "w", "conv.bias": "-", "norm.weight": "-", "norm.bias": "-",
             "emb.weight": "e", "fc.weight": "w", "fc.bias": "-"}
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(kinds)
    adapt = [kinds[n] != "-" for n in names]
    wd = [0.01 if kinds[n] == "w" else 0.0 for n in names]
    want = []
    for i in range(len(names)):  # one tensor at a time: its own decay
        one = [[g[i]] for g in grads]
        if name == "lars":
            want += lars_reference([start[i]], one, [adapt[i]], 0.5, 0.9, wd[i], 0.02)
        else:
            want += lamb_reference([start[i]], one, [adapt[i]], 0.5, (0.8, 0.9), 1e-6, wd[i])
    for n, a, b in zip(names, got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6, msg=n)


def test_a_zero_tensor_takes_the_plain_rate() -> None:
    w = torch.zeros(3, requires_grad=True)
    opt = LARS([w], lr=0.5, momentum=0.0, trust_coefficient=0.001)
    w.grad = torch.ones(3)
    opt.step()  # |w| = 0: trust 1 (MLPerf's rule), not 0
    torch.testing.assert_close(w.detach(), torch.full((3,), -0.5))


class RMSScale(nn.Module):
    """A norm of a model's own (as transformers' RMSNorm): no torch norm class, 1-D scale."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))


class Tokens(nn.Module):
    """timm's convention: the model names parameters it exempts from decay."""

    def __init__(self) -> None:
        super().__init__()
        self.pos_embed = nn.Parameter(torch.zeros(1, 3, 4))
        self.tok = nn.Embedding(7, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.tok.weight  # tied: it multiplies, so it is a weight
        self.ln = nn.LayerNorm(4)
        self.rms = RMSScale()
        self.proj = nn.Conv1d(4, 4, 1)

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed"}


def test_roles_come_from_module_types_and_shapes() -> None:
    model = Tokens()
    got = {n: roles(model)[id(p)] for n, p in model.named_parameters()}
    assert got == {"pos_embed": "embedding", "tok.weight": "weight", "ln.weight": "fixed",
                   "ln.bias": "fixed", "rms.scale": "fixed", "proj.weight": "weight",
                   "proj.bias": "fixed"}
    alone = nn.Sequential(nn.Embedding(5, 2), nn.Linear(2, 2))
    assert [roles(alone)[id(p)] for p in alone.parameters()] == ["embedding", "weight", "fixed"]


def test_groups_for_each_optimizer() -> None:
    model = Small()
    adaptive = param_groups(model, 0.1, adaptive=True)
    assert [(g["weight_decay"], g["adapt"], len(g["params"])) for g in adaptive] == [
        (0.1, True, 2), (0.0, False, 4), (0.0, True, 1)]
    plain = param_groups(model, 0.1, adaptive=False)
    assert [(g["weight_decay"], len(g["params"])) for g in plain] == [(0.1, 2), (0.0, 5)]
    (one,) = param_groups(model, 0.0, adaptive=False)  # nothing differs: one group, in order
    assert one["params"] == list(model.parameters())
    subset = param_groups(model, 0.1, adaptive=False, params=model.fc.parameters())
    assert [len(g["params"]) for g in subset] == [1, 1]
    with pytest.raises(ValueError, match="not in the model"):
        param_groups(model, 0.1, adaptive=False, params=[nn.Parameter(torch.zeros(2))])


@pytest.mark.parametrize("name", ["sgd", "adamw", "lars", "lamb"])
def test_every_optimizer_leaves_biases_and_norms_undecayed(name: str) -> None:
    model = Small()
    opt = tasks.default_optimizers(config(f"optim.name={name}", "optim.weight_decay=0.1"),
                                   model)[0]
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(model.conv.weight), id(model.fc.weight)}


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_rebuilt_from_groups_and_resumed_from_a_checkpoint_bitwise(name: str) -> None:
    """Horovod's and hpcdp's wrappers call the class with the groups alone; a resume loads
    the state with weights_only: both continue with the same bits."""
    torch.manual_seed(0)
    cfg = config(f"optim.name={name}", "optim.weight_decay=0.01", "optim.lr=0.3",
                 "optim.trust_coefficient=0.05")
    a = Small()
    b = Small()
    b.load_state_dict(a.state_dict())
    opt_a = build.optimizer(cfg, a)
    opt_b = type(opt_a)(build.optimizer(cfg, b).param_groups)
    run_steps(a, opt_a, 2)
    run_steps(b, opt_b, 2)
    buf = io.BytesIO()
    torch.save(opt_b.state_dict(), buf)
    buf.seek(0)
    opt_c = build.optimizer(cfg, b)
    opt_c.load_state_dict(torch.load(buf, weights_only=True))
    run_steps(a, opt_a, 2)
    run_steps(b, opt_c, 2)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(cfgmod.ConfigError, match="optim.trust_coefficient"):
        config("optim.name=lars", "optim.trust_coefficient=0")
    with pytest.raises(cfgmod.ConfigError, match="optim.name"):
        config("optim.name=lion")
    with pytest.raises(RuntimeError, match="dense gradients"):
        w = torch.zeros(3, requires_grad=True)
        w.grad = torch.zeros(3).to_sparse()
        LAMB([w]).step()
