"""labelrl.report.figures: every figure titled, with unit-bearing axis labels, drawn from the data."""

from __future__ import annotations

import math

import matplotlib
import matplotlib.pyplot as plt
import pytest

from labelrl import metrics_keys as K
from labelrl.report import figures as F
from labelrl.report.collect import collect_run

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def arms(ladder_run):
    run = collect_run(ladder_run)
    spam = next(t for t in run.tasks if t.name == "spam")
    return {a.name: a for a in spam.arms}, spam


def all_figures(arms_task):
    arms, task = arms_task
    grpo, corpo, sft = arms["grpo"], arms["corpo"], arms["sft"]
    return {
        "reward": F.reward_accuracy_figure("grpo", grpo.steps, grpo.rollout_steps, 0.96),
        "entropy": F.entropy_mismatch_figure("grpo", grpo.steps),
        "sft": F.sft_eval_figure("sft", sft.sft_records, 0.96),
        "length": F.length_figure("grpo", grpo.steps),
        "tax": F.truncation_tax_figure("grpo", grpo.length_buckets),
        "drift": F.skip_drift_figure("grpo", grpo.steps),
        "failed": F.failed_positive_figure("spam", [("grpo", grpo.steps), ("corpo", corpo.steps)]),
        "corpo": F.corpo_regime_figure("spam", [("corpo", corpo.steps)]),
        "decomposition": F.decomposition_figure("spam", task.compare, 0.96),
    }


def test_every_axes_has_a_title_and_axis_labels_with_units(arms):
    figures = all_figures(arms)
    try:
        for name, fig in figures.items():
            for ax in fig.axes:
                assert ax.get_title(), name
                for label in (ax.get_xlabel(), ax.get_ylabel()):
                    assert "(" in label and label.endswith(")"), f"{name}: {label!r} names no unit"
    finally:
        for fig in figures.values():
            plt.close(fig)


def _lines(ax) -> dict[str, object]:
    return {line.get_label(): line for line in ax.get_lines()}


def test_reward_figure_plots_the_logged_and_computed_series_with_the_ceiling(arms):
    grpo = arms[0]["grpo"]
    fig = F.reward_accuracy_figure("grpo", grpo.steps, grpo.rollout_steps, 0.96)
    left, right = fig.axes
    assert list(_lines(left)["mean reward"].get_ydata()) == [s[K.REWARD_MEAN] for s in grpo.steps]
    lines = _lines(right)
    assert list(lines["balanced accuracy"].get_ydata()) == [r["balanced_accuracy"] for r in grpo.rollout_steps]
    assert list(lines["accuracy"].get_ydata()) == [s[K.ACCURACY] for s in grpo.steps]
    ceiling = lines["label ceiling 1 − ε = 0.960"]
    assert list(ceiling.get_ydata()) == [0.96, 0.96]
    plt.close(fig)
    fig = F.reward_accuracy_figure("grpo", grpo.steps, grpo.rollout_steps, None)
    assert not any(label.startswith("label ceiling") for label in _lines(fig.axes[1]))
    plt.close(fig)


def test_entropy_figure_plots_the_logged_entropy_and_mismatch_per_step(arms):
    grpo = arms[0]["grpo"]
    fig = F.entropy_mismatch_figure("grpo", grpo.steps)
    left, right = fig.axes
    assert list(_lines(left)["mean"].get_ydata()) == [s[K.ENTROPY_MEAN] for s in grpo.steps]
    assert list(_lines(left)["10th percentile"].get_ydata()) == [s[K.ENTROPY_P10] for s in grpo.steps]
    assert list(_lines(right)["k3 KL(sampler ‖ trainer)"].get_ydata()) == [s[K.MISMATCH_KL] for s in grpo.steps]
    assert right.get_yscale() == "log"
    plt.close(fig)


def test_the_report_shows_the_entropy_figure_of_each_rl_arm_that_logged_it(arms):
    from labelrl.report.step_curves import curves

    class Sink:
        def image(self, name, caption, draw):
            return name

    arms_by_name, task = arms
    names = [block for block in curves(task, Sink()) if isinstance(block, str)]
    rl_arms = [a.name for a in task.arms if a.is_rl and a.steps]
    assert rl_arms and all(f"spam-{a}-entropy" in names for a in rl_arms)
    assert not any(n.endswith("-entropy") and "sft" in n for n in names)


def test_sft_figure_plots_only_the_eval_steps_with_the_ceiling(arms):
    sft = arms[0]["sft"]
    fig = F.sft_eval_figure("sft", sft.sft_records, 0.5)
    lines = _lines(fig.axes[0])
    assert list(lines["val balanced accuracy"].get_xdata()) == [4, 8]  # evals every 4 steps
    assert "label ceiling 1 − ε = 0.500" in lines
    assert len(_lines(fig.axes[1])["train loss"].get_xdata()) == 8
    plt.close(fig)


def test_failed_positive_figure_has_one_line_per_arm(arms):
    a = arms[0]
    fig = F.failed_positive_figure("spam", [("grpo", a["grpo"].steps), ("corpo", a["corpo"].steps)])
    assert set(_lines(fig.axes[0])) == {"grpo", "corpo"}
    assert list(_lines(fig.axes[0])["corpo"].get_ydata()) == [s[K.FAILED_POSITIVE_FRAC] for s in a["corpo"].steps]
    plt.close(fig)


def test_a_ladders_replicates_share_their_arms_colour_and_differ_in_line_style(arms):
    a = arms[0]
    steps = a["grpo"].steps
    runs = ["grpo@s0", "grpo@s1", "grpo@s2", "corpo@s0", "corpo@s1"]
    fig = F.failed_positive_figure("spam", [(name, steps) for name in runs])
    lines = _lines(fig.axes[0])
    assert set(lines) == set(runs)
    colour = {name: lines[name].get_color() for name in runs}
    style = {name: lines[name].get_linestyle() for name in runs}
    assert colour["grpo@s0"] == colour["grpo@s1"] == colour["grpo@s2"] != colour["corpo@s0"] == colour["corpo@s1"]
    assert len({style["grpo@s0"], style["grpo@s1"], style["grpo@s2"]}) == 3 and style["grpo@s0"] == style["corpo@s0"]
    plt.close(fig)
    # a replicate's legend entry is its run's name, not "grpo@s1 (grpo)"
    from dataclasses import replace

    assert replace(a["grpo"], name="grpo@s1", replicate_of="grpo").label == "grpo@s1"
    assert replace(a["grpo"], name="arm2").label == "arm2 (grpo)"


def test_label_share_has_a_gap_where_every_group_was_uniform():
    info, data = K.per_label(K.LABEL_SHARE_INFORMATIVE, "spam"), K.per_label(K.LABEL_SHARE_DATA, "spam")
    steps = [{K.STEP: 1, K.UNIFORM_FRAC: 1.0, info: 0.0, data: 0.2},
             {K.STEP: 2, K.UNIFORM_FRAC: 0.5, info: 0.6, data: 0.2}]
    fig = F.skip_drift_figure("grpo", steps)
    lines = _lines(fig.axes[1])
    shares = list(lines["spam: informative groups"].get_ydata())
    assert math.isnan(shares[0]) and shares[1] == 0.6  # step 1 had no informative group to take a share of
    assert list(lines["spam: training data"].get_ydata()) == [0.2, 0.2]
    assert lines["spam: training data"].get_linestyle() == "--"
    plt.close(fig)


def test_truncation_tax_bars_are_the_bucket_mean_rewards(arms):
    buckets = arms[0]["grpo"].length_buckets
    fig = F.truncation_tax_figure("grpo", buckets)
    heights = [bar.get_height() for bar in fig.axes[1].patches]
    assert heights == pytest.approx([b["mean_reward"] for b in buckets if b["n"]])
    plt.close(fig)


def test_save_figure_writes_a_png_and_closes_the_figure(tmp_path, arms):
    fig = F.length_figure("grpo", arms[0]["grpo"].steps)
    data = F.save_figure(fig, tmp_path / "figures" / "x.png")
    assert data.startswith(PNG) and (tmp_path / "figures" / "x.png").read_bytes() == data
    assert fig.number not in plt.get_fignums()


def test_roc_names_operating_points_by_arm(monkeypatch, tmp_path, arms):
    seen = {}

    def fake_plot_roc(result, path):
        seen.update(result)
        path.write_bytes(PNG)
        return path

    monkeypatch.setattr(F, "plot_roc", fake_plot_roc)
    sweep = arms[1].sweep
    assert F.roc_png(sweep, tmp_path / "roc.png") == PNG
    names = [p["name"] for p in seen["operating_points"]]
    assert names[-2:] == ["grpo", "corpo"] and "best balanced accuracy" in names
    assert sweep["operating_points"][-1]["name"].endswith("corpo-val.parquet")  # the input is left as it was


def test_roc_and_cascade_pngs_are_drawn(tmp_path, arms):
    task = arms[1]
    assert F.roc_png(task.sweep, tmp_path / "roc.png").startswith(PNG)
    assert F.cascade_png(task.routes["grpo"], tmp_path / "cascade.png").startswith(PNG)


@pytest.mark.parametrize("source, arm", [("/r/spam/eval/grpo-val.parquet", "grpo"), ("cot_rl-holdout.csv", "cot_rl"),
                                         ("model7", "model7"), (None, "None")])
def test_source_arm(source, arm):
    assert F.source_arm(source) == arm


def test_render_png_closes_a_figure_whose_drawing_failed(tmp_path):
    def broken():
        plt.subplots()
        raise KeyError("roc_curve")

    before = set(plt.get_fignums())
    with pytest.raises(KeyError):
        F.render_png(broken, tmp_path / "x.png")
    assert set(plt.get_fignums()) == before and not (tmp_path / "x.png").exists()


def test_roc_png_of_an_incomplete_sweep_raises_and_leaves_no_figure_open(tmp_path):
    before = set(plt.get_fignums())
    with pytest.raises(KeyError):
        F.roc_png({"n": 3, "compared": []}, tmp_path / "roc.png")
    assert set(plt.get_fignums()) == before


@pytest.mark.parametrize("n", [2, 10, 12, 20, 25])
def test_every_label_of_a_per_label_figure_has_its_own_colour_and_marker(n):
    # matplotlib's cycle has ten colours: the eleventh label would wear the first one's
    labels = [f"topic {i}" for i in range(n)]
    steps = [{"step": s, "recall": {label: (s + i) / (n + 3) for i, label in enumerate(labels)}} for s in (1, 2, 3)]
    fig = F.recall_figure("grpo", steps, labels)
    lines = _lines(fig.axes[0])
    looks = {(matplotlib.colors.to_hex(line.get_color()), line.get_marker()) for line in lines.values()}
    assert set(lines) == {f"label {label}" for label in labels} and len(looks) == n
    plt.close(fig)
