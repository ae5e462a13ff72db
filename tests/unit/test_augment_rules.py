"""Augmentation keyed by (seed, epoch, sample): exact per-sample rules, batch-invariant."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcdp.data.read import augment as aug


def keys(indices, epoch: int = 0) -> torch.Tensor:
    idx = torch.as_tensor(indices, dtype=torch.int64)
    return torch.stack([torch.full_like(idx, epoch), idx], 1)


def test_uniforms_depend_on_seed_epoch_and_index_only() -> None:
    idx = np.arange(5000)
    u = aug.uniforms(3, np.zeros_like(idx), idx, 4)
    assert u.shape == (5000, 4) and u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.std() - (1 / 12) ** 0.5) < 0.01
    sub = aug.uniforms(3, np.zeros(3, np.int64), idx[[7, 4000, 2]], 4)
    np.testing.assert_array_equal(sub, u[[7, 4000, 2]])
    for other in (aug.uniforms(4, np.zeros_like(idx), idx, 4),
                  aug.uniforms(3, np.ones_like(idx), idx, 4)):
        assert (other != u).mean() > 0.99


def reference_crop_flip(x: np.ndarray, u: np.ndarray, p: int) -> np.ndarray:
    """One sample at a time, the rule as stated: pad, crop at (dy, dx), maybe flip."""
    out = np.empty_like(x)
    h, w = x.shape[2:]
    for i in range(len(x)):
        padded = np.pad(x[i], ((0, 0), (p, p), (p, p)))
        dy, dx = int(u[i, 0] * (2 * p + 1)), int(u[i, 1] * (2 * p + 1))
        crop = padded[:, dy : dy + h, dx : dx + w]
        out[i] = crop[:, :, ::-1] if u[i, 2] < 0.5 else crop
    return out


def test_crop_flip_is_the_stated_rule_sample_by_sample() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((64, 3, 9, 7)).astype(np.float32)
    k = keys(rng.permutation(10_000)[:64], epoch=2)
    got = aug.augment(torch.from_numpy(x), k, "crop_flip", seed=1, padding=3)
    u = aug.uniforms(1, k[:, 0].numpy(), k[:, 1].numpy(), 3)
    np.testing.assert_array_equal(got.numpy(), reference_crop_flip(x, u, 3))
    assert (u[:, 2] < 0.5).any() and (u[:, 2] >= 0.5).any()  # both branches were checked


def test_resized_crop_of_the_whole_image_is_the_image_or_its_mirror() -> None:
    x = torch.rand(4, 3, 6, 6)
    u = np.array([[1.0 - 1e-12, 0.5, 0.3, 0.9, 0.9], [1.0 - 1e-12, 0.5, 0.0, 0.0, 0.1]] * 2)
    out = aug.resized_crop_flip(x, u, (1.0, 1.0))
    torch.testing.assert_close(out[0], x[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(out[1], x[1].flip(-1), atol=1e-5, rtol=0)


def test_resized_crop_boxes_stay_inside_with_the_asked_area() -> None:
    u = aug.uniforms(0, np.zeros(2000, np.int64), np.arange(2000), 5)
    cx, cy, fw, fh = aug.box_params(u[:, :4], (0.25, 0.5))
    for c, f in ((cx, fw), (cy, fh)):
        assert (c - f >= -1 - 1e-12).all() and (c + f <= 1 + 1e-12).all()
    assert (fw * fh <= 0.5 + 1e-12).all() and (fw * fh >= 0.25 * 3 / 4 - 1e-12).all()


@pytest.mark.parametrize("kind", ["crop_flip", "resized_crop_flip"])
def test_a_sample_is_augmented_alike_in_any_batch(kind: str) -> None:
    x = torch.rand(16, 3, 12, 12)
    k = keys(torch.arange(100, 116), epoch=1)
    whole = aug.augment(x, k, kind, seed=9)
    part = aug.augment(x[[3, 11, 5]], k[[3, 11, 5]], kind, seed=9)
    assert torch.equal(part, whole[[3, 11, 5]])
    assert not torch.equal(whole, x)
    again = aug.augment(x, keys(torch.arange(100, 116), epoch=2), kind, seed=9)
    assert not torch.equal(again, whole)


def test_none_returns_the_batch() -> None:
    x = torch.rand(2, 3, 4, 4)
    assert aug.augment(x, keys([0, 1]), "none", seed=0) is x
