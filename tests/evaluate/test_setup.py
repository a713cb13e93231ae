"""``labelrl.evaluate.setup``: within ``shared_models()`` a run's evaluations load its model once
(and get the same predictions as loading it each time); outside, each ``prepare`` loads anew."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import labelrl.models as models
from labelrl.evaluate.predict import predict
from labelrl.evaluate.setup import prepare, shared_models

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_predict import make_run_dir, tiny  # noqa: E402,F401


def counting_loads(monkeypatch) -> list[str]:
    loads, real = [], models.load_model
    monkeypatch.setattr(models, "load_model", lambda spec, *a, **k: loads.append(spec) or real(spec, *a, **k))
    return loads


def test_within_shared_models_a_run_is_loaded_once_for_all_its_evaluations(tmp_path, tiny, monkeypatch):  # noqa: F811
    run = make_run_dir(tmp_path, tiny)
    loads = counting_loads(monkeypatch)
    alone = [predict(str(run), None, split) for split in ("val", "holdout")]
    assert len(loads) == 2  # outside the block: a load per evaluation
    with shared_models():
        val, holdout = prepare(str(run), None, "val"), prepare(str(run), None, "holdout", precision="bf16")
        assert val.model is holdout.model and val.model_fingerprint == holdout.model_fingerprint
        assert str(holdout.dtype) == "torch.bfloat16"  # the precision is still each evaluation's own
        with shared_models():  # a nested block shares the outer one's models
            assert prepare(str(run), None, "val").model is val.model
        shared = [predict(str(run), None, split) for split in ("val", "holdout")]
    assert len(loads) == 3
    for a, b in zip(alone, shared):
        assert a.ids == b.ids and np.array_equal(a.scores(), b.scores())
    prepare(str(run), None, "val")  # the block let its models go
    assert len(loads) == 4
