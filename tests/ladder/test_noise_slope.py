"""The paired difference of slopes on label noise (labelrl.ladder.noise_slope), on constructed predictions.

Every predictions table here has n ham then n spam items; ``run(h, s)`` gets the first h ham and
the first s spam items right, so its balanced accuracy is (h/n + s/n)/2. With n = 10, BA 0.90 is
(9, 9), 0.85 is (9, 8), 0.80 (8, 8), 0.70 (7, 7), 0.60 (6, 6), 0.50 (5, 5).

The rates are ε = 0, 0.1, 0.2, 0.3: ε̄ = 0.15, ε − ε̄ = (−0.15, −0.05, 0.05, 0.15),
Σ(ε − ε̄)² = 0.0225 + 0.0025 + 0.0025 + 0.0225 = 0.05.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from labelrl.evaluate.io import Predictions, predictions_table, write_predictions
from labelrl.ladder.noise_slope import (LESS, MORE, NOISE_SLOPE_FILE, SAME, NoiseTask, noise_slope_analysis, ols_slope,
                                        slope_difference, summary_lines)
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
RATES = (0.0, 0.1, 0.2, 0.3)


def run(right_ham: int, right_spam: int, n: int = 10) -> Predictions:
    """n ham then n spam items; the first ``right_ham`` ham and ``right_spam`` spam answered right."""
    truth = ["ham"] * n + ["spam"] * n
    answers = (["ham"] * right_ham + ["spam"] * (n - right_ham) + ["spam"] * right_spam + ["ham"] * (n - right_spam))
    return Predictions(predictions_table([f"i{i}" for i in range(2 * n)], truth, answers, ["ok"] * 2 * n, SPAM), SPAM)


def ba(value: float, n: int = 10) -> Predictions:
    """A run with balanced accuracy ``value`` (a multiple of 1/(2n)): 2n·value items right, the
    odd one a ham item (0.85 at n = 10: 17 right, (9 + 8)/20)."""
    total = round(2 * value * n)
    return run((total + 1) // 2, total // 2, n)


def tasks(sft: list[list[float]], rl: list[list[float]], n: int = 10, paired: bool = False) -> list[NoiseTask]:
    """One task per rate of RATES; sft[j] and rl[j] are the BAs of that task's runs (seeds)."""
    return [NoiseTask(f"e{round(e * 100):02d}", e, [ba(v, n) for v in s], [ba(v, n) for v in r], seeds_paired=paired)
            for e, s, r in zip(RATES, sft, rl)]


def test_the_slopes_are_the_least_squares_slopes_of_the_hand_arithmetic():
    # SFT: BA 0.90, 0.90, 0.85, 0.85 → Σ(ε − ε̄)·BA = −0.15·0.9 − 0.05·0.9 + 0.05·0.85 + 0.15·0.85
    #      = −0.2·0.9 + 0.2·0.85 = −0.01 → slope −0.01 / 0.05 = −0.2
    #      (not the endpoint slope (0.85 − 0.90)/0.3 = −0.167, nor the mean of the steps (0 − 0.5 + 0)/3 = −0.167)
    # RL:  BA 0.90, 0.80, 0.70, 0.60 → −0.135 − 0.04 + 0.035 + 0.09 = −0.05 → slope −1.0
    # D = −1.0 − (−0.2) = −0.8
    made = tasks([[0.9], [0.9], [0.85], [0.85]], [[0.9], [0.8], [0.7], [0.6]])
    shuffled = [made[2], made[0], made[3], made[1]]  # the points follow their task, not the order given
    result = slope_difference(shuffled, n_boot=50, seed=0)
    assert result["slope_sft"] == pytest.approx(-0.2, abs=1e-12)
    assert result["slope_rl"] == pytest.approx(-1.0, abs=1e-12)
    assert result["difference"] == pytest.approx(-0.8, abs=1e-12)
    rows = {r["task"]: (r["label_noise"], r["sft"], r["rl"], r["n"]) for r in result["tasks"]}
    assert rows["e20"] == (0.2, pytest.approx(0.85), pytest.approx(0.7), 20)


def test_ols_slope_equals_numpy_least_squares_on_every_row():
    rng = np.random.default_rng(1)
    x, y = np.array([0.0, 0.1, 0.2, 0.3, 0.05]), rng.random((7, 5))
    assert ols_slope(x, y) == pytest.approx([np.polyfit(x, row, 1)[0] for row in y], abs=1e-12)


def test_identical_arms_differ_by_exactly_zero_and_say_no_detectable_difference():
    # the same predictions for SFT and RL at every rate: each replicate draws the same items for
    # both (the pairing), so every bootstrap D is 0 too; an unpaired item draw would spread it
    bas = [[0.9], [0.8], [0.8], [0.6]]
    result = slope_difference(tasks(bas, bas), n_boot=200, seed=0)
    assert result["difference"] == 0.0 and result["ci"] == [0.0, 0.0]
    assert result["slope_sft"] == result["slope_rl"] == pytest.approx(-0.9)  # (−0.135 −0.04 +0.04 +0.09)/0.05
    assert result["words"].startswith(f"{SAME} (slope difference +0.000 BA per unit ε [+0.000, +0.000]")
    assert "one run per arm and rate: the interval is over holdout items" in result["words"]
    # no spread at all: the words say so instead of "could detect a difference of 0.000"
    assert result["se"] == 0 and "no smallest detectable difference follows" in result["words"]


def test_no_detectable_difference_names_the_smallest_difference_it_could_detect():
    # SFT (9, 9) at every rate; RL right on other items at ε 0.1 and 0.3 with the same BA 0.9:
    # (10, 8) is the 10th ham right and the 9th spam wrong. D = 0, but resamples move it both ways
    sft = [run(9, 9) for _ in RATES]
    rl = [run(9, 9), run(10, 8), run(9, 9), run(8, 10)]
    made = [NoiseTask(f"e{j}", e, [a], [b]) for j, (e, a, b) in enumerate(zip(RATES, sft, rl))]
    result = slope_difference(made, n_boot=400, seed=0)
    assert result["difference"] == pytest.approx(0.0, abs=1e-12) and result["ci"][0] < 0 < result["ci"][1]
    assert result["se"] > 0 and result["detectable"] == pytest.approx((1.959964 + 0.841621) * result["se"])
    assert result["words"].startswith(SAME)
    assert f"smallest difference it could detect: {result['detectable']:.3f} per unit ε" in result["words"]


def test_an_rl_arm_that_loses_clearly_more_reads_rl_loses_more_and_the_mirror_reads_less():
    # 100 ham + 100 spam items per rate. SFT flat at 0.95; RL 0.95, 0.85, 0.75, 0.65: slope
    # (−0.1425 − 0.0425 + 0.0375 + 0.0975)/0.05 = −1.0, so D = −1.0 − 0 = −1.0 BA per unit ε,
    # −0.3 BA over ε 0 → 0.3. Per rate BA's standard error is about √(0.2·0.8/200) ≈ 0.03, so D's
    # is about 0.03·√(Σ(ε − ε̄)²)/0.05 ≈ 0.03·4.5 ≈ 0.13: the interval sits well below 0.
    flat, falling = [[0.95]] * 4, [[0.95], [0.85], [0.75], [0.65]]
    more = slope_difference(tasks(flat, falling, n=100), n_boot=400, seed=0)
    assert more["difference"] == pytest.approx(-1.0, abs=1e-12)
    lo, hi = more["ci"]
    assert lo < -1.0 < hi < 0
    assert more["words"].startswith(f"{MORE} (slope difference -1.000 BA per unit ε [")
    assert "over ε 0 → 0.3: -0.300 BA" in more["words"]
    assert "smallest difference" not in more["words"]  # said beside "no detectable difference" only
    less = slope_difference(tasks(falling, flat, n=100), n_boot=400, seed=0)  # the arms swapped
    assert less["difference"] == pytest.approx(1.0, abs=1e-12) and less["ci"][0] > 0
    assert less["words"].startswith(LESS)


def test_seeds_are_pooled_by_their_mean_and_a_paired_seed_draw_keeps_identical_pairs_at_zero():
    # SFT seeds per rate: (0.9, 0.9), (0.9, 0.7), (0.8, 0.8), (0.9, 0.5) → means 0.9, 0.8, 0.8, 0.7
    # slope of the means: (−0.135 − 0.04 + 0.04 + 0.105)/0.05 = −0.6
    # (the first seed alone: 0.9, 0.9, 0.8, 0.9 → −0.1; the last alone: 0.9, 0.7, 0.8, 0.5 → −1.1)
    seeds = [[0.9, 0.9], [0.9, 0.7], [0.8, 0.8], [0.9, 0.5]]
    single = [[0.8]] * 4  # RL: one run per rate, flat: slope 0
    result = slope_difference(tasks(seeds, single), n_boot=200, seed=0)
    assert result["slope_sft"] == pytest.approx(-0.6, abs=1e-12)
    assert result["difference"] == pytest.approx(0.6, abs=1e-12)
    assert [r["sft"] for r in result["tasks"]] == pytest.approx([0.9, 0.8, 0.8, 0.7])
    assert "1/2 run(s) per arm and rate" in result["words"]  # RL 1 run, SFT 2
    assert "the interval is over holdout items, not over training runs" not in result["words"]
    # RL run k from SFT run k, each the same model as its parent: a resampled seed is the pair, so
    # every replicate's D is 0; drawn independently, the seeds' spread (0.9 vs 0.5) enters D
    paired = slope_difference(tasks(seeds, seeds, paired=True), n_boot=200, seed=0)
    assert paired["difference"] == 0.0 and paired["ci"] == [0.0, 0.0]
    unpaired = slope_difference(tasks(seeds, seeds, paired=False), n_boot=200, seed=0)
    assert unpaired["difference"] == 0.0 and unpaired["ci"][0] < -0.5 and unpaired["ci"][1] > 0.5


def test_the_same_seed_gives_the_same_interval_and_another_seed_another():
    made = tasks([[0.9], [0.9], [0.8], [0.8]], [[0.9], [0.8], [0.7], [0.6]])
    first, again = slope_difference(made, n_boot=100, seed=3), slope_difference(made, n_boot=100, seed=3)
    other = slope_difference(made, n_boot=100, seed=4)
    assert first["ci"] == again["ci"] and first["se"] == again["se"]
    assert other["ci"] != first["ci"] and other["difference"] == first["difference"]


def test_one_rate_no_resamples_or_an_empty_arm_is_refused_with_the_fix():
    one_rate = [NoiseTask("a", 0.2, [ba(0.9)], [ba(0.8)]), NoiseTask("b", 0.2, [ba(0.9)], [ba(0.7)])]
    with pytest.raises(ValueError, match=r"rates \[0.2\].*at least 2 different rates"):
        slope_difference(one_rate, n_boot=10)
    made = tasks([[0.9]] * 4, [[0.8]] * 4)
    with pytest.raises(ValueError, match="n_boot=0.*n_boot to e.g. 500"):
        slope_difference(made, n_boot=0)
    with pytest.raises(ValueError, match="task e00: 1 SFT and 0 RL runs"):
        slope_difference([NoiseTask("e00", 0.0, [ba(0.9)], []), *made[1:]], n_boot=10)


# ---------------------------------------------------------------- from a ladder run's state and files


def _arm(type_: str, status: str = "done", **extra) -> dict:
    return {"type": type_, "status": status, **extra}


def _write(run_dir, task: str, name: str, value: float) -> None:
    write_predictions(ba(value), run_dir / task / "eval" / f"{name}-holdout.parquet")


def test_the_ladder_step_pairs_each_rl_seed_with_its_parent_and_names_what_it_left_out(tmp_path):
    # e00, e10, e30 hold sft@s0/@s1 and grpo@s0/@s1 (listed s1 first: pairing goes by `from`,
    # not by order); e20's grpo failed, so e20 is left out; "other" is another dataset at ε 0
    # (a slope needs two rates of the same data: no comparison for it)
    state = {"task_order": ["e00", "e10", "e20", "e30", "other"], "tasks": {}}
    sft_ba = {"e00": (0.9, 0.9), "e10": (0.9, 0.8), "e20": (0.8, 0.8), "e30": (0.8, 0.7)}
    rl_ba = {"e00": (0.9, 0.8), "e10": (0.8, 0.7), "e20": (0.7, 0.7), "e30": (0.6, 0.5)}
    for name, eps in zip(("e00", "e10", "e20", "e30"), RATES):
        arms = {f"sft@s{k}": _arm("sft", replicate_of="sft", seed=k) for k in (0, 1)}
        arms |= {f"grpo@s{k}": _arm("rl", replicate_of="grpo", seed=k, **{"from": f"sft@s{k}"},
                                   status="failed" if name == "e20" else "done",
                                   train={"collapse": {"label": "ham"} if (name, k) == ("e30", 1) else None})
                 for k in (1, 0)}
        arms["threshold"] = _arm("threshold", **{"from": "sft@s0"})
        for k in (0, 1):
            _write(tmp_path, name, f"sft@s{k}", sft_ba[name][k])
            _write(tmp_path, name, f"grpo@s{k}", rl_ba[name][k])
        state["tasks"][name] = {"data": "sms-spam", "label_noise": eps, "arm_order": list(arms), "arms": arms}
    state["tasks"]["other"] = {"data": "vader-movies", "label_noise": 0.0,
                               "arms": {"sft": _arm("sft"), "grpo": _arm("rl", **{"from": "sft"})}}
    out = noise_slope_analysis(tmp_path, state, n_boot=100, seed=0)
    assert json.loads((tmp_path / "analysis" / NOISE_SLOPE_FILE).read_text()) == json.loads(json.dumps(out))
    (c,) = out["comparisons"]
    assert (c["data"], c["sft"], c["rl"]) == ("sms-spam", "sft", "grpo")
    assert list(c["left_out"]) == ["e20"] and "0 finished grpo run(s)" in c["left_out"]["e20"]
    rows = {r["task"]: r for r in c["tasks"]}
    assert set(rows) == {"e00", "e10", "e30"}
    assert rows["e10"]["rl_runs"] == ["grpo@s0", "grpo@s1"] and rows["e10"]["seeds_paired"]
    assert rows["e10"]["rl_by_run"] == pytest.approx([0.8, 0.7])  # grpo@s0's 0.8 set against sft@s0
    # ε 0, 0.1, 0.3 (ε̄ = 0.1333…, Σ(ε − ε̄)² = 0.0467): SFT means 0.9, 0.85, 0.75; RL 0.85, 0.75, 0.55
    x = np.array([0.0, 0.1, 0.3])
    assert c["slope_sft"] == pytest.approx(np.polyfit(x, [0.9, 0.85, 0.75], 1)[0])
    assert c["difference"] == pytest.approx(np.polyfit(x, [0.85, 0.75, 0.55], 1)[0] - np.polyfit(x, [0.9, 0.85, 0.75], 1)[0])
    assert c["collapsed"] == ["e30/grpo@s1"]
    assert "left out: e20 (" in c["words"] and "collapsed to one answer: e30/grpo@s1" in c["words"]
    assert "grpo − sft, 3 rates" in c["words"]
    (line,) = summary_lines(out)
    assert line.startswith("sms-spam: grpo vs sft: ") and c["words"] in line


def test_a_run_without_two_noise_rates_writes_nothing(tmp_path):
    state = {"task_order": ["spam", "movies"], "tasks": {
        "spam": {"data": "sms-spam", "label_noise": 0.0, "arms": {"sft": _arm("sft"), "grpo": _arm("rl", **{"from": "sft"})}},
        "movies": {"data": "vader-movies", "label_noise": 0.0, "arms": {"sft": _arm("sft"), "grpo": _arm("rl", **{"from": "sft"})}}}}
    assert noise_slope_analysis(tmp_path, state, n_boot=10) is None
    assert not (tmp_path / "analysis").exists()
