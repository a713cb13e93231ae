"""PNG plots of evaluation results (matplotlib, Agg backend: no display needed).

Each function takes the dict produced by ``classification_metrics`` / ``sweep`` / ``route``
(so plots can be redrawn from the JSON files alone) and writes one PNG.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from labelrl.fileio import atomic_write_bytes  # noqa: E402

DPI = 120


def _save(fig, path: str | Path) -> Path:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    atomic_write_bytes(Path(path), buffer.getvalue())
    return Path(path)


def plot_roc(result: dict, path: str | Path) -> Path:
    """ROC curve of the scored model with its operating points (target recall, best balanced
    accuracy, each compared model: filled when on the curve, hollow when above or below it, a
    cross when a (near-)constant predictor makes the comparison uninformative)."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    roc = result["roc_curve"]
    ax.plot(roc["fpr"], roc["tpr"], color="C0", label=f"scored model (AUC {result['roc_auc']:.3f})")
    ax.plot([0, 1], [0, 1], color="0.7", linestyle=":", label="chance")
    for i, point in enumerate(result.get("operating_points", [])):
        hollow = point.get("reproduced") is False
        # "position" is the sweep's verdict word; a sweep file written before it only says "not reproduced"
        where = point.get("position") or ("not reproduced" if hollow else "")
        note = " (constant: uninformative)" if point.get("uninformative") else f" ({where})" if hollow else ""
        ax.scatter([point["fpr"]], [point["tpr"]], s=60, zorder=3, edgecolors=f"C{i + 1}", linewidths=1.5,
                   marker="X" if point.get("uninformative") else "o",
                   facecolors="none" if hollow else f"C{i + 1}", label=point["name"] + note)
    ax.set_xlabel("False positive rate (share of negatives flagged, 0–1)")
    ax.set_ylabel(f"True positive rate = recall of {result['positive_label']!r} (0–1)")
    ax.set_xlim(-0.01, 1.01)
    ax.set_ylim(-0.01, 1.01)
    ax.set_title("ROC curve and operating points")
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, path)


def plot_reliability(metrics: dict, path: str | Path) -> Path:
    """Reliability curve: per bin, mean predicted probability vs observed frequency, with the
    bin counts as bars on a second axis."""
    rel = metrics["reliability"]
    bins = [b for b in rel["bins"] if b["n"]]
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="0.7", linestyle=":", label="perfect calibration")
    ax.plot([b["mean_confidence"] for b in bins], [b["observed"] for b in bins], marker="o", color="C0",
            label=f"model (ECE {rel['ece']:.3f})")
    counts = ax.twinx()
    counts.bar([(b["lo"] + b["hi"]) / 2 for b in rel["bins"]], [b["n"] for b in rel["bins"]], width=0.09,
               color="C0", alpha=0.15)
    counts.set_ylabel("Examples per bin (count)")
    if rel["kind"] == "positive_probability":
        ax.set_xlabel("Predicted probability of the positive label (bin mean, 0–1)")
        ax.set_ylabel("Observed share of positives in the bin (0–1)")
    else:
        ax.set_xlabel("Top-label confidence (bin mean, 0–1)")
        ax.set_ylabel("Observed accuracy in the bin (0–1)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title("Reliability curve (10 equal-width bins)")
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, path)


def plot_cascade(result: dict, path: str | Path) -> Path:
    """Cascade trade-off: every band as a point (share routed, Δ balanced accuracy), the
    frontier as a line, and the oracle's Δ as a reference line."""
    cascade = result["cascade"]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.scatter([100 * b["share_routed"] for b in cascade["bands"]],
               [100 * b["delta_balanced_accuracy"] for b in cascade["bands"]], s=12, color="0.6", label="confidence bands")
    front = [{"share_routed": 0.0, "delta_balanced_accuracy": 0.0}] + cascade["frontier"]  # from routing nothing
    ax.plot([100 * b["share_routed"] for b in front], [100 * b["delta_balanced_accuracy"] for b in front],
            marker="o", color="C0", label="frontier")
    oracle = 100 * (result["oracle"]["balanced_accuracy"] - result["a"]["balanced_accuracy"])
    ax.axhline(oracle, color="C2", linestyle="--", label=f"oracle (+{oracle:.1f} pp)")
    ax.axhline(0, color="0.3", linewidth=0.8)
    ax.set_xlabel("Traffic routed from A to B (% of examples)")
    ax.set_ylabel("Δ balanced accuracy vs A alone (percentage points)")
    ax.set_title("Confidence cascade trade-off")
    ax.legend(loc="best", fontsize=8)
    return _save(fig, path)
