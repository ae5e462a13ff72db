"""PowerSGD's keys and its per-rank checkpoint state: what a resume restores on the same
world size and on another (hpcdp.train.checkpoints.load_compression)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hpcdp import config as c
from hpcdp.config import ConfigError
from hpcdp.runtime.powersgd import Codec
from hpcdp.train.checkpoints import compression_states, load_compression

SHAPES = [(12, 10), (5,)]


class Holder:
    """The part of the PowerSGD optimizer a checkpoint talks to (its codec's state)."""

    def __init__(self, seed: int = 0) -> None:
        self.codec = Codec(SHAPES, 2, 1, 2, torch.device("cpu"), torch.float32, seed)

    def compression_state(self) -> dict:
        return self.codec.state_dict()

    def load_compression_state(self, state: dict, residuals: bool) -> str | None:
        return self.codec.load_state_dict(state, residuals)


def saved_by(ranks: int) -> list:
    """What a checkpoint of `ranks` ranks holds: each rank's residual its own."""
    states = []
    for r in range(ranks):
        h = Holder()
        h.codec.residuals[0].fill_(r + 1.0)
        h.codec.q_flat.fill_(0.5)
        h.codec.steps = 9
        states.append(compression_states([h, torch.optim.SGD([torch.nn.Parameter(
            torch.zeros(1))], lr=0.1)]))
    return states


def test_same_world_size_each_rank_its_own_residual() -> None:
    saved = saved_by(2)
    assert saved[0][1] is None  # a plain optimizer has no compression state
    for rank in range(2):
        h = Holder(seed=5)
        notes = load_compression(SimpleNamespace(size=2, rank=rank, optimizers=[h, object()]),
                                 saved)
        assert notes == []
        assert (h.codec.residuals[0] == rank + 1.0).all() and (h.codec.q_flat == 0.5).all()
        assert h.codec.steps == 9


def test_another_world_size_drops_residuals_keeps_q_and_steps() -> None:
    h = Holder(seed=5)
    notes = load_compression(SimpleNamespace(size=3, rank=2, optimizers=[h, object()]),
                             saved_by(2))
    assert notes == ["PowerSGD residuals dropped: the checkpoint was written by 2 rank(s), "
                     "this run has 3 (Q factors kept)"]
    assert not h.codec.residuals[0].any() and (h.codec.q_flat == 0.5).all()
    assert h.codec.steps == 9  # the warm-up is not repeated


def test_checkpoints_without_powersgd_and_runs_without_it() -> None:
    h = Holder(seed=5)
    q0 = h.codec.q_flat.clone()
    plain = [[None], [None]]
    notes = load_compression(SimpleNamespace(size=2, rank=0, optimizers=[h]), plain)
    assert "no PowerSGD state" in notes[0] and torch.equal(h.codec.q_flat, q0)
    one_rank = load_compression(SimpleNamespace(size=1, rank=0, optimizers=[object(), object()]),
                                saved_by(2))
    assert one_rank == ["the checkpoint holds PowerSGD state that this run does not use"]


@pytest.mark.parametrize(("override", "needle"), [
    ("horovod.powersgd_rank=0", "powersgd_rank=0: must be at least 1"),
    ("horovod.powersgd_warmup_steps=-1", "powersgd_warmup_steps=-1: must not be negative"),
    ("horovod.op=adasum", "cannot be combined with horovod.op='adasum'"),
    ("horovod.gradient_predivide_factor=2", "gradient_predivide_factor must be 1.0"),
    ("run.precision=fp16", "run.precision='fp16'"),
])
def test_powersgd_keys_are_checked(override: str, needle: str) -> None:
    base = ["data.path=d", "horovod.compression=powersgd", "run.device=cuda"]
    with pytest.raises(ConfigError, match=None) as info:
        c.build(None, [*base, override])
    assert needle in str(info.value)
    c.build(None, base)  # the defaults pass


@pytest.mark.parametrize("compression", ["none", "fp16", "powersgd"])
def test_the_bytes_per_step_a_summary_reports(compression: str) -> None:
    from hpcdp.runtime.powersgd import bytes_per_step
    from hpcdp.train import traffic

    net = torch.nn.Sequential(torch.nn.Linear(100, 80), torch.nn.Linear(80, 3))
    cfg = c.build(None, ["data.path=d", f"horovod.compression={compression}",
                         "horovod.powersgd_min_elements=1000"])
    run = SimpleNamespace(cfg=cfg, model=net,
                          optimizers=[torch.optim.SGD(net.parameters(), lr=0.1)])
    got = traffic.per_step(run)
    whole = sum(p.numel() for p in net.parameters()) * 4
    want = {"none": whole, "fp16": whole // 2,
            "powersgd": bytes_per_step([tuple(p.shape) for p in net.parameters()], 4, 1000)[0]}
    assert (got["bytes_per_step"], got["uncompressed_bytes_per_step"]) == (want[compression],
                                                                           whole)
    if compression == "powersgd":  # the 100 x 80 weight as factors, the rest whole
        assert want["powersgd"] == (4 * (80 + 100) + 80 + 80 * 3 + 3) * 4
