"""pass@k: the unbiased estimator against the closed form, and sampled end to end on a warm model."""

from __future__ import annotations

import json
from math import comb

import pytest
from typer.testing import CliRunner

from labelrl.evaluate.passk import pass_at_k, summarise


@pytest.mark.parametrize("n", [1, 4, 8, 20])
def test_pass_at_k_equals_the_closed_form(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            closed = 1.0 - comb(n - c, k) / comb(n, k)  # Chen et al. 2021, eq. 1
            assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12), (n, c, k)


def test_pass_at_one_is_the_share_right_and_k_beyond_n_is_refused():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    with pytest.raises(ValueError, match="raise --pass-samples"):
        pass_at_k(4, 1, 5)


def test_summary_averages_items_and_splits_by_label():
    # items: 0 of 4 right, 2 of 4, 4 of 4; pass@2 = 0, 1 − C(2,2)/C(4,2) = 5/6, 1
    out = summarise([0, 2, 4], ["a", "b", "b"], n=4, k=2, n_boot=200, seed=0)
    assert out["pass_at_k"] == pytest.approx((0 + 5 / 6 + 1) / 3)
    assert out["pass_at_1"] == pytest.approx((0 + 0.5 + 1) / 3)
    assert out["per_label"] == {"a": 0.0, "b": pytest.approx((5 / 6 + 1) / 2)}
    lo, hi = out["pass_at_k_ci"]
    assert 0.0 <= lo <= out["pass_at_k"] <= hi <= 1.0


def test_eval_pass_at_k_samples_a_warm_model_and_refuses_the_holdout(warm_model, tmp_path):
    from labelrl.cli.main import app

    runner = CliRunner(env={"COLUMNS": "200"})
    out = tmp_path / "pass.json"
    result = runner.invoke(app, ["eval", str(warm_model), "--split", "val", "--limit", "6", "--pass-at-k", "2",
                                 "--pass-samples", "4", "--json", str(out), "--n-boot", "50"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())["pass_at_k"]
    assert report["n_items"] == 6 and report["n_samples"] == 4 and len(report["correct_counts"]) == 6
    # recomputed from the counts the sampler produced
    expected = sum(pass_at_k(4, c, 2) for c in report["correct_counts"]) / 6
    assert report["pass_at_k"] == pytest.approx(expected)
    assert "pass@2" in result.output
    refused = runner.invoke(app, ["eval", str(warm_model), "--split", "holdout", "--pass-at-k", "2"])
    assert refused.exit_code == 2 and "--split val" in refused.output


def test_pass_at_k_refuses_a_holdout_setup_before_sampling(tmp_path, monkeypatch):
    # the ladder calls pass_at_k_and_write directly (not through run_eval's option check): a holdout
    # setup must be refused there too, since pass@k is never recorded in the ledger
    from types import SimpleNamespace

    from labelrl.evaluate import passk
    from labelrl.evaluate.run import EvalConfig, pass_at_k_and_write

    monkeypatch.setattr(passk, "sample_pass_at_k", lambda *a, **k: pytest.fail("sampled the holdout"))
    setup = SimpleNamespace(data=SimpleNamespace(split="holdout"))
    cfg = EvalConfig(run_or_model="m", split="holdout", pass_at_k=2, json_path=tmp_path / "p.json")
    with pytest.raises(ValueError, match="run it on --split val"):
        pass_at_k_and_write(setup, cfg)
