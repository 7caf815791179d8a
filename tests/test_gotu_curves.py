"""gotu's training curves are scored on points that represent their domain (not a fixed stride)."""

from __future__ import annotations

import numpy as np
import pytest

from masklab.lab.studies import gotu
from masklab.lab.tasks.boolean import custom_task, make_task


def right_only_where_x2_x3_low(task) -> np.ndarray:
    """A maj3 predictor that is right on the unseen domain (target -1) only where x2 = x3 = -1."""
    low = (task.x[:, 2] == -1) & (task.x[:, 3] == -1)
    return np.where(low, -1.0, 1.0)


def unseen_acc(task, pred, idx) -> float:
    idx = idx[task.unseen[idx]]
    return float((np.sign(pred[idx]) == np.sign(task.y[idx])).mean())


def test_maj3_curve_points_are_not_the_structured_stride():
    task = make_task("maj3")
    pred = right_only_where_x2_x3_low(task)
    full = unseen_acc(task, pred, np.arange(len(task.x)))
    assert full == 0.25
    old = np.flatnonzero(task.unseen)[:: max(1, task.unseen.sum() // 2048)]  # the rule this replaces
    assert unseen_acc(task, pred, old) == 1.0  # what made steps_to_99 report success at 0.5
    idx = gotu.curve_points(task, seed=0)
    assert unseen_acc(task, pred, idx) == full  # the whole unseen domain (8192 points)
    assert task.unseen[idx].sum() == task.unseen.sum() and task.seen[idx].sum() == gotu.CURVE_SEEN


def test_large_unseen_domain_is_a_seeded_random_subset():
    task = custom_task("x0*x1", "x0==1", [0, 1], dim=18)  # 131072 unseen points
    idx = gotu.curve_points(task, seed=3)
    unseen = idx[task.unseen[idx]]
    assert len(unseen) == gotu.CURVE_UNSEEN and len(np.unique(idx)) == len(idx)
    assert np.array_equal(idx, gotu.curve_points(task, seed=3))  # fixed for a run
    assert not np.array_equal(idx, gotu.curve_points(task, seed=4))
    # each of the 17 free bits is -1 on about half of the subset (a stride fixes some of them)
    half = (task.x[unseen, 1:] == -1).mean(0)
    assert np.abs(half - 0.5).max() < 0.03


def test_probe_covers_both_domains():
    task = make_task("2parity")
    idx = gotu.probe_points(task, seed=0)
    assert len(idx) == gotu.PROBE and 0 < task.unseen[idx].mean() < 0.5
    assert (task.x[idx, :7] == 1).any()  # the old stride of 128 held x0..x6 = -1 only


@pytest.mark.parametrize("task", ["maj3"])
def test_last_curve_value_equals_the_final_unseen_accuracy(task, tmp_path):
    """Built-in tasks score the whole unseen domain during training, so the curve's last value
    is the final metric (the old subsample could say 1.0 at a final 0.5)."""
    cfg = gotu.Config(
        tasks=[task], methods=["vanilla"], seeds=[0], width=16, depth=1, heads=2, steps=5, batch=16, evals=1
    )
    spec = gotu.specs_for(cfg)[0].as_dict()
    out = gotu.run_one(spec, tmp_path / "ckpt")
    assert out["curves"]["unseen_acc"][-1] == out["metrics"]["unseen_acc"]
