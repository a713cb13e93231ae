import matplotlib.image as mpimg
import numpy as np

from labelrl.evaluate.io import Predictions, predictions_table
from labelrl.evaluate.metrics import classification_metrics
from labelrl.evaluate.plots import plot_cascade, plot_reliability, plot_roc
from labelrl.evaluate.route import route
from labelrl.evaluate.sweep import sweep
from labelrl.types import LabelSpace

SPACE = LabelSpace(("ham", "spam"), kind="binary")


def predictions(seed, scored=True):
    n = 200
    y = np.random.default_rng(0).random(n) < 0.4  # the same answer key for every model
    score = np.clip(0.35 * y + np.random.default_rng(seed + 1).random(n) * 0.65, 0, 1)
    preds = ["spam" if s >= 0.5 else "ham" for s in score]
    probs = np.stack([1 - score, score], axis=1) if scored else None
    table = predictions_table([str(i) for i in range(n)], ["spam" if v else "ham" for v in y], preds, ["ok"] * n, SPACE, probs)
    return Predictions(table, SPACE, {"source": f"model{seed}"})


def assert_png(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = mpimg.imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_roc_plot_with_operating_points(tmp_path):
    scored = predictions(0)
    result = sweep(scored, compare=[predictions(1, scored=False)])
    assert_png(plot_roc(result, tmp_path / "roc.png"))


def test_reliability_plot(tmp_path):
    p = predictions(0)
    metrics = classification_metrics(p.y_true, p.y_pred, SPACE, scores=p.scores(), n_boot=0)
    assert_png(plot_reliability(metrics, tmp_path / "rel.png"))


def test_cascade_plot(tmp_path):
    assert_png(plot_cascade(route(predictions(0), predictions(1)), tmp_path / "cascade.png"))
