"""ECE, MCE and reliability bins against hand counts; per-class scores and confusion matrix by hand."""

from __future__ import annotations

import numpy as np
import pytest

from finetune_cli.metrics.calibration import (
    bin_index,
    calibration_metrics,
    expected_calibration_error,
    maximum_calibration_error,
    reliability_bins,
    softmax,
)
from finetune_cli.metrics.classification import confusion, per_class_metrics

CONF = np.array([0.95, 0.85, 0.82, 0.65, 0.45, 0.30])
CORRECT = np.array([1, 1, 0, 1, 0, 1])


def test_ece_mce_by_hand():
    """M = 5 bins (0,.2] (.2,.4] (.4,.6] (.6,.8] (.8,1]:

    (.2,.4]: {0.30}, acc 1, conf 0.30, gap 0.70
    (.4,.6]: {0.45}, acc 0, conf 0.45, gap 0.45
    (.6,.8]: {0.65}, acc 1, conf 0.65, gap 0.35
    (.8,1]:  {0.95, 0.85, 0.82}, acc 2/3, conf 2.62/3, gap 0.62/3
    ECE = (1·0.70 + 1·0.45 + 1·0.35 + 3·0.62/3) / 6 = 2.12 / 6;  MCE = 0.70
    """
    assert expected_calibration_error(CONF, CORRECT, 5) == pytest.approx(2.12 / 6)
    assert maximum_calibration_error(CONF, CORRECT, 5) == pytest.approx(0.70)
    # one bin: ECE = |mean accuracy − mean confidence| = |4/6 − 4.02/6|
    assert expected_calibration_error(CONF, CORRECT, 1) == pytest.approx(abs(4 / 6 - 4.02 / 6))


def test_reliability_bins_match_a_hand_count():
    bins = reliability_bins(CONF, CORRECT, 5)
    assert [b.count for b in bins] == [0, 1, 1, 1, 3]
    assert [b.lower for b in bins] == pytest.approx([0, 0.2, 0.4, 0.6, 0.8])
    assert bins[0].accuracy is None and bins[0].mean_confidence is None and bins[0].gap is None
    assert bins[4].accuracy == pytest.approx(2 / 3)
    assert bins[4].mean_confidence == pytest.approx((0.95 + 0.85 + 0.82) / 3)
    assert bins[1].accuracy == 1.0 and bins[2].accuracy == 0.0


def test_bin_edges_belong_to_the_bin_they_close():
    # (0, .2] (.2, .4] (.4, .6] (.6, .8] (.8, 1]; 0 goes to the first bin. 0.6 * 5 rounds to 3.0000000000000004.
    assert bin_index(np.array([0.0, 0.2, 0.6, 0.8, 1.0, 0.61, 0.2000001]), 5).tolist() == [0, 0, 2, 3, 4, 3, 1]
    counts = [b.count for b in reliability_bins(np.array([0.2, 0.6, 0.8, 1.0, 0.0, 0.61]), np.ones(6), 5)]
    assert counts == [2, 0, 1, 2, 1]


def _ece_loop(conf, correct, m):
    """Guo et al.'s definition written as a plain loop over bins and examples."""
    total, worst = 0.0, 0.0
    n = len(conf)
    for b in range(m):
        lo, hi = b / m, (b + 1) / m
        members = [i for i in range(n) if (lo < conf[i] <= hi) or (b == 0 and conf[i] == 0)]
        if not members:
            continue
        acc = sum(correct[i] for i in members) / len(members)
        cf = sum(conf[i] for i in members) / len(members)
        total += len(members) / n * abs(acc - cf)
        worst = max(worst, abs(acc - cf))
    return total, worst


@pytest.mark.parametrize("m", [1, 10, 15])
def test_ece_matches_loop_reference_on_random_logits(m):
    rng = np.random.default_rng(m)
    logits = rng.normal(size=(300, 3)) * 3
    labels = rng.integers(0, 3, size=300)
    p = softmax(logits)
    conf, correct = p.max(1), (p.argmax(1) == labels).astype(int)
    ece, mce = _ece_loop(conf.tolist(), correct.tolist(), m)
    cal = calibration_metrics(logits, labels, m)
    assert cal["ece"] == pytest.approx(ece) and cal["mce"] == pytest.approx(mce)
    assert sum(b["count"] for b in cal["bins"]) == 300 and len(cal["bins"]) == m
    assert cal["nll"] == pytest.approx(-np.mean(np.log(p[np.arange(300), labels])))


def test_default_is_15_bins_and_softmax_is_stable():
    cal = calibration_metrics(np.array([[1000.0, 0.0], [0.0, 2.0]]), np.array([0, 0]))
    assert cal["n_bins"] == 15 and len(cal["bins"]) == 15
    # confidences 1.0 (right) and σ(2) = 0.8808 (wrong): bins 15 and 14
    assert cal["bins"][14]["count"] == 1 and cal["bins"][13]["count"] == 1
    assert cal["ece"] == pytest.approx((0.0 + 1 / (1 + np.exp(-2))) / 2)
    assert np.isfinite(softmax(np.array([[1e4, -1e4]]))).all()


def test_bad_calibration_input():
    with pytest.raises(ValueError, match="differ in length"):
        reliability_bins(np.array([0.5]), np.array([1, 0]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        reliability_bins(np.array([1.5]), np.array([1]))
    with pytest.raises(ValueError, match="at least one"):
        reliability_bins(np.array([]), np.array([]))


def test_per_class_and_confusion_by_hand():
    """gold 0,0,1,1,2; predicted 0,1,1,1,0.
    class 0: tp 1, fp 1, fn 1 -> P = R = F1 = 1/2; class 1: tp 2, fp 1 -> P 2/3, R 1, F1 0.8;
    class 2: never predicted -> 0, 0, 0."""
    y, yhat = np.array([0, 0, 1, 1, 2]), np.array([0, 1, 1, 1, 0])
    rows = per_class_metrics(y, yhat, ["a", "b", "c"])
    assert [r["label"] for r in rows] == ["a", "b", "c"] and [r["support"] for r in rows] == [2, 2, 1]
    assert [r["precision"] for r in rows] == pytest.approx([0.5, 2 / 3, 0.0])
    assert [r["recall"] for r in rows] == pytest.approx([0.5, 1.0, 0.0])
    assert [r["f1"] for r in rows] == pytest.approx([0.5, 0.8, 0.0])
    assert confusion(y, yhat, 3) == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    # a class absent from gold and predictions still gets its row and column
    assert confusion(np.array([0, 1]), np.array([0, 1]), 3) == [[1, 0, 0], [0, 1, 0], [0, 0, 0]]
