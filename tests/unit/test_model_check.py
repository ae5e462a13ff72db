"""A user's builder runs once before Horovod (hpcdp.train.model_check.check_user_builder):
shapes-only where it can, for real where it cannot, and never for hpcdp's own networks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcdp.config import Config, ConfigError
from hpcdp.tasks import image
from hpcdp.train import model_check
from hpcdp.train.model_check import check_user_builder, runs_user_code


def config(tmp_path: Path, task: str = "image", model: str = "digits_cnn") -> Config:
    with h5py.File(tmp_path / "train.h5", "w") as f:
        f.create_dataset("x", data=np.zeros((8, 1, 8, 8), np.uint8))
        f.create_dataset("y", data=np.zeros(8, np.int64))
    cfg = Config()
    cfg.task.name, cfg.model.name, cfg.data.path = task, model, str(tmp_path)
    cfg.image.num_classes = 4
    return cfg


def test_user_code_is_a_builder_of_the_users_or_a_prefixed_model() -> None:
    cfg = Config()
    cfg.task.name, cfg.model.name = "image", "digits_cnn"
    assert not runs_user_code(cfg, image.TASK)
    cfg.model.name = "torchvision:resnet18"
    assert runs_user_code(cfg, image.TASK)
    cfg.task.name, cfg.model.name = "mine.py:TASK", "digits_cnn"
    assert runs_user_code(cfg, replace(image.TASK, build_model=lambda cfg, shape: None))


def test_a_builder_that_computes_on_its_tensors_is_run_for_real(tmp_path: Path) -> None:
    calls: list[str] = []

    def build(cfg, shape):
        net = torch.nn.Linear(int(np.prod(shape)), 4)
        calls.append(str(net.weight.device))
        float(net.weight.detach().sum())  # a value: the meta device has none
        return net

    task = replace(image.TASK, build_model=build)
    check_user_builder(config(tmp_path, model="mine:build"), task)
    assert calls == ["meta", "cpu"]


def test_a_builder_that_fails_for_real_is_named(tmp_path: Path) -> None:
    def build(cfg, shape):
        raise RuntimeError(f"no network for {shape}")

    task = replace(image.TASK, build_model=build)
    with pytest.raises(ConfigError, match=r"task.name='image': its build_model failed "
                       r"for model 'mine:build': RuntimeError: no network for \(1, 8, 8\)"):
        check_user_builder(config(tmp_path, model="mine:build"), task)


def test_a_builder_with_a_value_error_of_its_own_says_it(tmp_path: Path) -> None:
    def build(cfg, shape):
        raise ValueError("mine.width must be even")

    task = replace(image.TASK, build_model=build)
    with pytest.raises(ConfigError, match="^mine.width must be even$"):
        check_user_builder(config(tmp_path, model="mine:build"), task)


def test_hpcdp_networks_and_unreadable_data_are_left_to_set_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def build(cfg, shape):
        raise AssertionError("not to be called")

    monkeypatch.setattr(model_check, "built_model", build)
    check_user_builder(config(tmp_path), image.TASK)  # built-in task, built-in model
    cfg = config(tmp_path, model="mine:build")
    cfg.data.train_file = "missing.h5"
    check_user_builder(cfg, replace(image.TASK, build_model=build))  # set-up names it
