"""Exact click metrics and the bytes each gradient mode sends."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from hpcdp.runtime import sparse_grads as grads
from hpcdp.tasks.auc import auc_logloss


def test_auc_and_logloss_match_scikit_learn() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 1000)
    logits = rng.normal(size=1000) + labels
    got = auc_logloss(logits, labels)
    assert got["auc"] == pytest.approx(roc_auc_score(labels, logits), abs=1e-12)
    assert got["logloss"] == pytest.approx(log_loss(labels, 1 / (1 + np.exp(-logits))), rel=1e-9)
    # Order-free: the metric of the whole split, however the rows were split over ranks.
    perm = rng.permutation(1000)
    assert auc_logloss(logits[perm], labels[perm]) == got


def test_the_whole_split_is_not_the_mean_of_the_parts() -> None:
    labels = np.array([0, 1, 0, 1])
    logits = np.array([0.0, 1.0, 5.0, 6.0])  # each half ranks perfectly, the whole does not
    parts = [auc_logloss(logits[:2], labels[:2])["auc"], auc_logloss(logits[2:], labels[2:])["auc"]]
    assert parts == [1.0, 1.0]
    assert auc_logloss(logits, labels)["auc"] == 0.75


def test_large_logits_do_not_overflow_and_one_class_has_no_auc() -> None:
    got = auc_logloss(np.array([800.0, -800.0]), np.array([1, 1]))
    assert math.isnan(got["auc"]) and got["logloss"] == pytest.approx(400.0)
    with pytest.raises(ValueError, match="as many logits as labels"):
        auc_logloss(np.zeros(3), np.zeros(2))


def test_unique_rows_and_payloads() -> None:
    ids = torch.tensor([[0, 5], [0, 6], [1, 5], [0, 5]])
    assert grads.unique_rows(ids) == [2, 2]
    # sparse: 4 rows of 8 float32 values + an int64 index each; dense: both tables whole.
    assert grads.table_payload("sparse", [2, 2], [10, 100], 8) == 4 * (8 * 4 + 8)
    assert grads.table_payload("dense", [2, 2], [10, 100], 8) == 110 * 8 * 4
    with pytest.raises(ValueError, match="gradient mode 'both'"):
        grads.table_payload("both", [1], [1], 1)


def test_bytes_sent_per_rank_in_a_ring() -> None:
    # Dense: a ring all-reduce sends 2 (W-1)/W of the buffer (tables and MLPs alike).
    assert grads.bytes_sent_per_rank("dense", [1000, 1000], 100) == 1000 + 100
    assert grads.bytes_sent_per_rank("dense", [1000] * 4, 0) == 1500
    # Sparse: an all-gather sends (W-1)/W of everything gathered; grows with the world.
    assert grads.bytes_sent_per_rank("sparse", [100, 300], 0) == 200
    assert grads.bytes_sent_per_rank("sparse", [100] * 4, 40) == 300 + 60
    assert grads.bytes_sent_per_rank("sparse", [100], 40) == 0
