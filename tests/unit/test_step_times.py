"""What a training step counts as data time: the reader's hand-over and the task's prepare
(the batch onto the device), not the forward and backward passes."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from hpcdp.train import step


def test_data_time_ends_with_the_batch_on_the_device(monkeypatch) -> None:
    def slow_prepare(batch, cfg, device):
        time.sleep(0.2)  # a copy onto the device that the step has to wait for
        return batch, batch

    def slow_compute(run, inputs, targets, sums, nan):
        assert inputs == "batch"  # the prepared batch
        time.sleep(0.1)

    monkeypatch.setattr(step, "forward_backward", slow_compute)
    monkeypatch.setattr(step, "update", lambda run, n: None)
    run = SimpleNamespace(optimizers=[], accum=1, size=1, device=torch.device("cpu"),
                          channels_last=False, norm_stats=None,
                          task=SimpleNamespace(prepare=slow_prepare),
                          cfg=SimpleNamespace(horovod=SimpleNamespace(op="average")))
    split = step.train_step(run, iter(["batch"]), 0.1, sums=None, step=0)
    assert split.data >= 0.2 and 0.1 <= split.compute < 0.2 + 0.1, split
    assert split.comm >= 0.0 and split.optimizer >= 0.0
