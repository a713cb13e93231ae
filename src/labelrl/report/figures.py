"""The report's figures (matplotlib, Agg backend), drawn from the data ``collect`` read.

Each ``*_figure`` function returns the ``Figure`` (so its axes can be checked) and draws
nothing else; ``save_figure`` writes it as PNG and closes it. Every axes has a title and
axis labels with units. Accuracy panels draw the task's label ceiling 1 − ε as a dashed
horizontal line when the audit found one. The ROC and the cascade trade-off are drawn by
``labelrl.evaluate.plots`` (``roc_png``, ``cascade_png``), with the RL arms named.
"""

from __future__ import annotations

import copy
import io
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from labelrl import metrics_keys as K  # noqa: E402
from labelrl.evaluate.plots import DPI, plot_cascade, plot_roc  # noqa: E402
from labelrl.fileio import atomic_write_bytes  # noqa: E402

STEP_LABEL = "RL step (optimizer steps)"
FRACTION = "(fraction, 0–1)"


def save_figure(fig: Figure, path: str | Path) -> bytes:
    """Write ``fig`` as a PNG at ``path`` (atomically), close it, and return the PNG bytes."""
    buffer = io.BytesIO()
    if fig.get_layout_engine() is None:  # a figure with its own layout (constrained) keeps it
        fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    data = buffer.getvalue()
    atomic_write_bytes(Path(path), data)
    return data


@contextmanager
def closing_on_error():
    """Close the figures opened inside the block when it raises (malformed input data)."""
    before = set(plt.get_fignums())
    try:
        yield
    except Exception:
        for number in set(plt.get_fignums()) - before:
            plt.close(number)
        raise


def render_png(make: Callable[[], Figure], path: str | Path) -> bytes:
    """``save_figure(make(), path)``; a figure left open by a ``make`` that raised is closed."""
    with closing_on_error():
        fig = make()
    return save_figure(fig, path)


def drawer(make: Callable[[], Figure]) -> Callable[[Path], bytes]:
    """``make`` as the draw function ``FigureSink.image`` takes: ``render_png(make, path)``."""
    return lambda path: render_png(make, path)


def known(pairs) -> tuple[list[float], list[float]]:
    """(x, y) of the (x, y) pairs whose y is not None."""
    points = [(x, y) for x, y in pairs if y is not None]
    return [p[0] for p in points], [p[1] for p in points]


def series(records: Sequence[dict], key: str, x_key: str = K.STEP) -> tuple[list[float], list[float]]:
    """(x, y) of the records holding a numeric ``key``; others are left out."""
    return known((r[x_key], r[key]) for r in records
                 if isinstance(r.get(key), (int, float)) and isinstance(r.get(x_key), (int, float)))


def _line(ax, x, y, marker: str = "o", **kwargs) -> None:
    if x:
        ax.plot(x, y, marker=marker if len(x) <= 30 else None, markersize=3, **kwargs)


SEED_STYLES = ("-", "--", ":", "-.")


def run_styles(names: Sequence[str]) -> list[dict]:
    """Colour and line style per run of a one-line-per-run figure: one colour per arm, one line
    style per seed, so a ladder's replicates (runs named ``ARM@sSEED``) read as one arm's lines
    (``grpo@s0``, ``grpo@s1``: the same colour, solid and dashed)."""
    groups: dict[str, int] = {}
    seen: dict[str, int] = {}
    styles = []
    for name in names:
        group = name.split(" ")[0].split("@")[0]  # "grpo@s1 (grpo)" → grpo
        colour = groups.setdefault(group, len(groups))
        seen[group] = seen.get(group, -1) + 1
        styles.append({"color": f"C{colour % 10}", "linestyle": SEED_STYLES[seen[group] % len(SEED_STYLES)]})
    return styles


def label_colours(n: int) -> list:
    """A colour per label of a one-line-per-label figure, no two alike: matplotlib's ten-colour
    cycle up to ten labels, then tab20's twenty (past twenty, colours repeat with a marker of
    their own: ``label_markers``)."""
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    tab20 = plt.get_cmap("tab20")
    return [tab20(i % 20) for i in range(n)]


def label_markers(n: int) -> list[str]:
    """A marker per label: circles, then (past twenty labels) squares, triangles and diamonds, so a
    colour that repeats marks another label."""
    return [("o", "s", "^", "D")[(i // 20) % 4] for i in range(n)]


def _ceiling(ax, ceiling: float | None) -> None:
    if ceiling is not None:
        ax.axhline(ceiling, color="0.25", linestyle="--", linewidth=1, label=f"label ceiling 1 − ε = {ceiling:.3f}")


def _legend(ax) -> None:
    handles = ax.get_legend_handles_labels()[0]
    if handles:
        ax.legend(loc="best", fontsize=7 if len(handles) <= 6 else 6, ncol=1 if len(handles) <= 6 else 2)


def _integer_x(*axes) -> None:
    """Steps are whole numbers: no 1.5 ticks."""
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def reward_accuracy_figure(arm: str, steps: Sequence[dict], rollout_steps: Sequence[dict],
                           ceiling: float | None) -> Figure:
    """Left: mean reward per step. Right: rollout accuracy (``reward/accuracy``) and the balanced
    accuracy of the step's rollouts, with the ceiling."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    _line(left, *series(steps, K.REWARD_MEAN), color="C0", label="mean reward")
    left.set(xlabel=STEP_LABEL, ylabel="mean reward per rollout (reward units)", title=f"{arm}: reward per step")
    _legend(left)
    _line(right, *series(steps, K.ACCURACY), color="C1", label="accuracy")
    _line(right, *series(rollout_steps, "balanced_accuracy"), color="C2", label="balanced accuracy")
    _ceiling(right, ceiling)
    right.set(xlabel=STEP_LABEL, ylabel=f"accuracy of rollouts {FRACTION}", title=f"{arm}: rollout accuracy per step",
              ylim=(-0.02, 1.02))
    _legend(right)
    _integer_x(left, right)
    return fig


def entropy_mismatch_figure(arm: str, steps: Sequence[dict]) -> Figure:
    """Left: the policy's entropy per completion token per step (mean and 10th percentile; a fall
    is the early sign of a collapse to one answer). Right: the sampler–trainer mismatch per step
    (k3 KL and mean |Δ log p|, log scale), when logged."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    _line(left, *series(steps, K.ENTROPY_MEAN), color="C0", label="mean")
    _line(left, *series(steps, K.ENTROPY_P10), color="C3", label="10th percentile")
    left.set(xlabel=STEP_LABEL, ylabel="entropy (nats per token)", title=f"{arm}: policy entropy per step")
    _legend(left)
    kl, diff = series(steps, K.MISMATCH_KL), series(steps, K.MISMATCH_LOGP_DIFF_MEAN)
    _line(right, *kl, color="C4", label="k3 KL(sampler ‖ trainer)")
    _line(right, *diff, color="C5", label="mean |Δ log p|")
    if any(v > 0 for v in kl[1] + diff[1]):
        right.set_yscale("log")
    right.set(xlabel=STEP_LABEL, ylabel="gap (nats per token)", title=f"{arm}: sampler–trainer mismatch")
    _legend(right)
    _integer_x(left, right)
    return fig


def sft_eval_figure(arm: str, records: Sequence[dict], ceiling: float | None) -> Figure:
    """Left: val accuracy and balanced accuracy at each SFT eval step, with the ceiling.
    Right: the training loss per step."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    _line(left, *series(records, K.EVAL_ACCURACY), color="C1", label="val accuracy")
    _line(left, *series(records, K.EVAL_BALANCED_ACCURACY), color="C2", label="val balanced accuracy")
    _ceiling(left, ceiling)
    left.set(xlabel="SFT step (optimizer steps)", ylabel=f"val accuracy {FRACTION}", title=f"{arm}: val accuracy per eval",
             ylim=(-0.02, 1.02))
    _legend(left)
    _line(right, *series(records, K.LOSS), color="C0", label="train loss")
    right.set(xlabel="SFT step (optimizer steps)", ylabel="train loss (nats per token)",
              title=f"{arm}: training loss")
    _legend(right)
    _integer_x(left, right)
    return fig


def length_figure(arm: str, steps: Sequence[dict]) -> Figure:
    """Left: mean and p90 completion length per step. Right: truncation and think-closure rates."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    _line(left, *series(steps, K.LENGTH_MEAN), color="C0", label="mean length")
    _line(left, *series(steps, K.LENGTH_P90), color="C3", label="p90 length")
    left.set(xlabel=STEP_LABEL, ylabel="completion length (tokens)", title=f"{arm}: completion length per step")
    _legend(left)
    _line(right, *series(steps, K.TRUNCATED_FRAC), color="C3", label="truncated")
    _line(right, *series(steps, K.THINK_CLOSED_FRAC), color="C2", label="think closed (</think> present)")
    right.set(xlabel=STEP_LABEL, ylabel=f"fraction of rollouts {FRACTION}", title=f"{arm}: truncation and think closure",
              ylim=(-0.02, 1.02))
    _legend(right)
    _integer_x(left, right)
    return fig


def truncation_tax_figure(arm: str, buckets: Sequence[dict]) -> Figure:
    """By completion-length bucket over all steps: left, think-closure and truncation rates;
    right, mean reward (bars as wide as the bucket)."""
    full = [b for b in buckets if b["n"]]
    mids = [(b["lo"] + b["hi"]) / 2 for b in full]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    _line(left, mids, [b["think_closed_rate"] for b in full], color="C2", label="think closed")
    _line(left, mids, [b["truncated_rate"] for b in full], color="C3", label="truncated")
    left.set(xlabel="completion length bucket (tokens, bucket centre)", ylabel=f"fraction of rollouts in bucket {FRACTION}",
             title=f"{arm}: think closure by length", ylim=(-0.02, 1.02))
    _legend(left)
    right.bar(mids, [b["mean_reward"] for b in full], width=[0.9 * (b["hi"] - b["lo"]) for b in full], color="C0",
              label="mean reward")
    for x, b in zip(mids, full):
        right.annotate(f"n={b['n']}", (x, b["mean_reward"]), ha="center", va="bottom", fontsize=6)
    right.set(xlabel="completion length bucket (tokens, bucket centre)", ylabel="mean reward per rollout (reward units)",
              title=f"{arm}: reward by length (truncation tax)")
    _legend(right)
    return fig


def share_labels(steps: Sequence[dict]) -> list[str]:
    """The labels with a ``groups/label_share_informative/<label>`` metric, in first-seen order."""
    prefix = K.LABEL_SHARE_INFORMATIVE + "/"
    seen: dict[str, None] = {}
    for record in steps:
        for key in record:
            if key.startswith(prefix):
                seen.setdefault(key[len(prefix):], None)
    return list(seen)


def skip_drift_figure(arm: str, steps: Sequence[dict], labels: Sequence[str] = ()) -> Figure:
    """Left: uniform-group fraction per step. Right: each label's share among informative
    groups (solid) against its share in the data (dashed)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    _line(left, *series(steps, K.UNIFORM_FRAC), color="C0", label="uniform groups (all rewards equal)")
    left.set(xlabel=STEP_LABEL, ylabel=f"fraction of groups {FRACTION}", title=f"{arm}: uniform-group fraction",
             ylim=(-0.02, 1.02))
    _legend(left)
    shown = list(labels) or share_labels(steps)
    for label, colour in zip(shown, label_colours(len(shown))):
        x, y = series(steps, K.per_label(K.LABEL_SHARE_INFORMATIVE, label))
        # A step whose groups are all uniform has no informative group; its logged share of 0
        # would read as "the label vanished", so it is drawn as a gap.
        uniform = {r[K.STEP]: r.get(K.UNIFORM_FRAC) for r in steps}
        y = [math.nan if uniform.get(s) == 1.0 else v for s, v in zip(x, y)]
        _line(right, x, y, color=colour, label=f"{label}: informative groups")
        _line(right, *series(steps, K.per_label(K.LABEL_SHARE_DATA, label)), color=colour, linestyle="--",
              label=f"{label}: training data")
    right.set(xlabel=STEP_LABEL, ylabel=f"label share {FRACTION}", title=f"{arm}: label share, informative vs data",
              ylim=(-0.02, 1.02))
    _legend(right)
    _integer_x(left, right)
    return fig


def failed_positive_figure(task: str, arms: Sequence[tuple[str, Sequence[dict]]], key: str = K.FAILED_POSITIVE_FRAC,
                           threshold: float | None = None) -> Figure:
    """Per step, the share of failed rollouts given a positive advantage, one line per RL arm
    (``key`` of each step record; failed = reward below ``threshold`` when given)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for (name, steps), style in zip(arms, run_styles([name for name, _ in arms])):
        _line(ax, *series(steps, key), label=name, **style)
    failed = f" (failed: reward < {threshold:g})" if threshold is not None else ""
    ax.set(xlabel=STEP_LABEL, ylabel=f"failed rollouts with advantage > 0 {FRACTION}",
           title=f"{task}: positive advantage on failed rollouts{failed}", ylim=(-0.02, 1.02))
    _legend(ax)
    _integer_x(ax)
    return fig


def corpo_regime_figure(task: str, arms: Sequence[tuple[str, Sequence[dict]]]) -> Figure:
    """Per step, the share of groups in CoRPO's correctness regime (solid) and preference
    regime (dashed), for each arm that logged them."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, (name, steps) in enumerate(arms):
        _line(ax, *series(steps, K.CORPO_CORRECTNESS_REGIME), color=f"C{i}", label=f"{name}: correctness (mean < τ)")
        _line(ax, *series(steps, K.CORPO_PREFERENCE_REGIME), color=f"C{i}", linestyle="--",
              label=f"{name}: preference (mean ≥ τ)")
    ax.set(xlabel=STEP_LABEL, ylabel=f"fraction of groups {FRACTION}", title=f"{task}: CoRPO regime shares",
           ylim=(-0.02, 1.02))
    _legend(ax)
    _integer_x(ax)
    return fig


def noise_figure(data: str, points: dict[str, Sequence[tuple[float, float, Sequence[float] | None]]]) -> Figure:
    """Holdout balanced accuracy (with its 95% interval) against the share ε of flipped training
    labels, one line per arm: ``points[arm] = [(ε, balanced accuracy, [lo, hi] or None), …]``."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    rates = sorted({p[0] for pts in points.values() for p in pts})
    dodge = 0.08 * (min(b - a for a, b in zip(rates, rates[1:])) if len(rates) > 1 else 0.1)  # arms side by side
    for i, (name, pts) in enumerate(points.items()):
        pts = sorted(pts)
        x, y = [p[0] + (i - (len(points) - 1) / 2) * dodge for p in pts], [p[1] for p in pts]
        lo = [p[1] - p[2][0] if p[2] else 0.0 for p in pts]
        hi = [p[2][1] - p[1] if p[2] else 0.0 for p in pts]
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, color=f"C{i}", label=name)
    ax.set(xlabel="share of training labels flipped, ε (fraction, 0–1)", ylabel=f"holdout balanced accuracy {FRACTION}",
           title=f"{data}: label noise in training vs holdout balanced accuracy")
    _legend(ax)
    return fig


def decomposition_figure(task: str, compare: dict, ceiling: float | None = None) -> Figure:
    """Balanced accuracy (with its 95% interval) of the three models of
    ``labelrl.distill.compare.compare_models``, titled with the filter and objective effects."""
    models = compare["models"]
    roles = [r for r in ("direct_all", "direct_survivors", "cot") if r in models]
    values = [models[r]["balanced_accuracy"] for r in roles]
    cis = [models[r].get("balanced_accuracy_ci") for r in roles]
    errors = [[v - ci[0] if ci else 0 for v, ci in zip(values, cis)], [ci[1] - v if ci else 0 for v, ci in zip(values, cis)]]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.bar(range(len(roles)), values, yerr=errors, capsize=4, color=["C0", "C1", "C2"][: len(roles)])
    ax.set_xticks(range(len(roles)), [f"{r}\n{models[r].get('name', r)}" for r in roles], fontsize=7)
    _ceiling(ax, ceiling)
    def signed(key: str) -> str:
        value = compare.get(key)
        return f"{value:+.3f}" if isinstance(value, (int, float)) else "—"

    effects = f"filter effect {signed('filter_effect')}, objective effect {signed('objective_effect')}"
    ax.set(xlabel="model (role in the decomposition)", ylabel=f"balanced accuracy {FRACTION}",
           title=f"{task}: distillation decomposition\n{effects}", ylim=(0, 1.05))
    _legend(ax)
    return fig


def source_arm(source: str | None) -> str:
    """The arm a predictions file belongs to: ``…/eval/grpo-val.parquet`` → ``grpo``."""
    stem = Path(str(source)).name.split(".")[0]
    for split in ("-val", "-holdout"):
        if stem.endswith(split):
            return stem[: -len(split)]
    return stem


def compared_arms(sweep: dict) -> list[str]:
    """The arm of each ``sweep["compared"]`` entry: as the ladder records them in
    ``sweep["arms"]["compared"]``, else from the predictions' file names."""
    compared = sweep.get("compared") or []
    names = (sweep.get("arms") or {}).get("compared") or []
    return [str(n) for n in names] if len(names) == len(compared) else [source_arm(c.get("source")) for c in compared]


def roc_png(sweep: dict, path: str | Path) -> bytes:
    """``labelrl.evaluate.plots.plot_roc`` of the SFT sweep, compared points named by arm
    (``sweep["arms"]["compared"]`` as the ladder writes it, else from the predictions' file names)."""
    result = copy.deepcopy(sweep)
    sources = {str(c.get("source")): name for c, name in zip(result.get("compared", []), compared_arms(result))}
    for point in result.get("operating_points", []):
        point["name"] = sources.get(str(point["name"]), point["name"])
    with closing_on_error():
        return Path(plot_roc(result, path)).read_bytes()


def cascade_png(route: dict, path: str | Path) -> bytes:
    """``labelrl.evaluate.plots.plot_cascade`` of one route-ARM.json result."""
    with closing_on_error():
        return Path(plot_cascade(route, path)).read_bytes()


def arm_lines_figure(task: str, arms: Sequence[tuple[str, Sequence[dict]]], key: str, ylabel: str, title: str,
                     ylim: tuple[float, float] | None = (-0.02, 1.02)) -> Figure:
    """One line per arm of ``key`` per step (e.g. the parse-failure rate, the lenient parser's
    reward inflation)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for (name, steps), style in zip(arms, run_styles([name for name, _ in arms])):
        _line(ax, *series(steps, key), label=name, **style)
    ax.set(xlabel=STEP_LABEL, ylabel=ylabel, title=f"{task}: {title}")
    if ylim is not None:
        ax.set_ylim(*ylim)
    _legend(ax)
    _integer_x(ax)
    return fig


def recall_figure(arm: str, recall_steps: Sequence[dict], labels: Sequence[str]) -> Figure:
    """Per step, the recall of each reference label among the rollouts (the recall drift)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for label, colour, marker in zip(labels, label_colours(len(labels)), label_markers(len(labels))):
        _line(ax, *known((r["step"], r["recall"].get(label)) for r in recall_steps), marker=marker, color=colour,
              label=f"label {label}")
    ax.set(xlabel=STEP_LABEL, ylabel=f"rollouts answered with their label {FRACTION}",
           title=f"{arm}: recall per label of the rollouts", ylim=(-0.02, 1.02))
    _legend(ax)
    _integer_x(ax)
    return fig


def residue_figure(arm: str, residue: dict) -> Figure:
    """Per step, the share of informative groups whose item is ambiguous (solid), per kind of
    ambiguity, against that share in the training sample (dashed)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, (kind, r) in enumerate(residue["kinds"].items()):
        _line(ax, *known(zip(residue["steps"], r["per_step"])), color=f"C{i}", label=f"{kind}: informative groups")
        if r.get("data_share") is not None:
            ax.axhline(r["data_share"], color=f"C{i}", linestyle="--", linewidth=1, label=f"{kind}: training sample")
    ax.set(xlabel=STEP_LABEL, ylabel=f"share of groups trained on {FRACTION}",
           title=f"{arm}: drift to the ambiguous residue", ylim=(-0.02, 1.02))
    _legend(ax)
    _integer_x(ax)
    return fig


def think_tax_figure(arm: str, tax: dict) -> Figure:
    """Among finished rollouts, mean reward (left) and think closure (right) by reasoning length,
    in the early and late windows of steps; the capped rollouts' closure rate in the titles."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.0), layout="constrained")
    for i, (name, w) in enumerate(tax["windows"].items()):
        mids = [(b["lo"] + b["hi"]) / 2 for b in w["buckets"] if b["n"]]
        label = f"{name} steps {w['steps'][0]}–{w['steps'][1]} (n={w['n_finished']})"
        _line(left, mids, [b["mean_reward"] for b in w["buckets"] if b["n"]], color=f"C{i}", label=label)
        _line(right, mids, [b["think_closed_rate"] for b in w["buckets"] if b["n"]], color=f"C{i}", label=label)
    capped = ", ".join(f"{name} {w['capped_think_closed_rate']:.2f} of {w['n_capped']}"
                       for name, w in tax["windows"].items() if w["capped_think_closed_rate"] is not None)
    unit = "reasoning length before </think> (characters)"
    fig.suptitle(f"{arm}: finished rollouts by reasoning length, early and late steps")
    left.set(xlabel=unit, ylabel="mean reward of finished rollouts (reward units)", title="reward")
    # the capped rollouts' closure, one line per window, so a long title never runs into the left panel's
    right.set(xlabel=unit, ylabel=f"think closure of finished rollouts {FRACTION}", ylim=(-0.02, 1.02),
              title="think closure" + (f"\ncapped rollouts closed: {capped}" if capped else ""))
    _legend(left)
    _legend(right)
    return fig
