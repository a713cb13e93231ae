"""`labelrl rescore`: logged rollouts re-graded with the lenient parser, inflation by hand."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from labelrl.rollout.log import write_step
from labelrl.train.rescore import rescore_run

# Reference "spam" for all four. Strict reads exactly one <answer> block: only the first.
# Lenient takes the first block anywhere, else the first bare label word.
COMPLETIONS = [
    ("<answer>spam</answer>", 1.0, 1.0),                              # both right
    ('I think it is "spam".', 0.0, 1.0),                              # quoted, no tag: lenient finds the word
    ("<answer>spam</answer> or <answer>ham</answer>", 0.0, 1.0),      # two blocks: strict refuses, lenient takes the first
    ("surely ham, not spam", 0.0, 0.0),                                # lenient's first label is ham: wrong
]


@pytest.fixture
def run_dir(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "text": f"t{i}", "label": "ham" if i % 2 else "spam"}) + "\n"
                            for i in range(20)), encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    (run / "rl_config.yaml").write_text(yaml.safe_dump({"data": str(data), "model": "tiny-random", "out": str(run),
                                                        "labels": "ham,spam"}))
    for step in (1, 2):
        n = len(COMPLETIONS)
        write_step(run, step, {
            "step": [step] * n, "prompt_id": [f"p{step}"] * n, "sample_index": list(range(n)), "label": ["spam"] * n,
            "completion": [c for c, _, _ in COMPLETIONS], "completion_tokens": [6] * n, "truncated": [False] * n,
            "think_closed": [False] * n, "parse_status": ["ok"] * n, "answer": [None] * n,
            "reward": [s for _, s, _ in COMPLETIONS], "advantage": [0.0] * n, "group_uniform": [False] * n,
            "skipped": [False] * n, "sampler_logprobs": [[-0.5] * 6] * n})
    return run


def test_lenient_rescoring_inflates_the_reward_by_the_quoted_and_doubled_answers(run_dir):
    result = rescore_run(run_dir, "lenient")
    # strict: 1 of 4 right → 0.25; lenient: 3 of 4 → 0.75; inflation 0.5 at every step
    for block in [result["overall"], *result["per_step"]]:
        assert block["reward_strict"] == pytest.approx(0.25) and block["reward_lenient"] == pytest.approx(0.75)
        assert block["inflation"] == pytest.approx(0.5)
        assert block["parsed_strict"] == pytest.approx(0.25) and block["parsed_lenient"] == pytest.approx(1.0)
        assert block["answer_changed"] == pytest.approx(0.75)  # None → spam, None → spam, None → ham
    assert result["logged_reward_mean"] == pytest.approx(result["overall"]["reward_strict"])
    assert json.loads((run_dir / "rescore-lenient.json").read_text())["overall"]["inflation"] == pytest.approx(0.5)


def test_rescore_command_prints_the_steps_and_refuses_a_non_rl_directory(run_dir, tmp_path):
    from labelrl.cli.main import app

    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(app, ["rescore", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "+0.500" in result.output and "strict vs lenient" in result.output
    result = runner.invoke(app, ["rescore", str(tmp_path)])
    assert result.exit_code == 2 and "rl_config.yaml" in result.output
