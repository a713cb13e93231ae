"""The constrained local teacher (labelrl.distill.constrained) and what distill says when it
keeps no trace at all."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

from labelrl.audit.judges import JudgeSpec, load_judge  # noqa: E402
from labelrl.data.prompts import THINK_CLOSE, THINK_OPEN, answer_target, render_prompt  # noqa: E402
from labelrl.distill.constrained import ConstrainedTeacher, sharpen  # noqa: E402
from labelrl.distill.run import DistillConfig, run_distill_config  # noqa: E402
from labelrl.distill.teacher import distill_paths, teacher_messages  # noqa: E402
from labelrl.fileio import read_jsonl  # noqa: E402
from labelrl.types import LabelSpace  # noqa: E402

SPACE = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
ROWS = [{"id": "1", "text": "win cash now", "label": "spam"}, {"id": "2", "text": "lunch at noon?", "label": "ham"},
        {"id": "3", "text": "free prize call", "label": "spam"}, {"id": "4", "text": "see you soon", "label": "ham"}]


@pytest.fixture(scope="module")
def tiny():
    return load_judge(JudgeSpec("tiny-random", flag="--teacher"), SPACE, None)


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def test_sharpen_reference():
    # T = 0.5: 0.8² = 0.64, 0.2² = 0.04, sum 0.68 → 0.941…, 0.0588…
    assert sharpen([0.8, 0.2], 0.5) == pytest.approx([0.64 / 0.68, 0.04 / 0.68])
    assert sharpen([0.3, 0.7], 1.0) == pytest.approx([0.3, 0.7])
    assert sharpen([0.3, 0.7], 0.0) == [0.0, 1.0]
    assert sharpen([0.5, 0.5], 0.0) == [1.0, 0.0]  # a tie goes to the first label


def test_every_reply_is_a_trace_whose_answer_is_the_teachers_own_most_probable_label(tiny):
    from labelrl.evaluate.score import score_labels

    teacher = ConstrainedTeacher(tiny, SPACE)
    tokenizer = tiny.tokenizer
    for row in ROWS:
        messages = teacher_messages(row["text"], SPACE, None)
        text = teacher.generate(messages, max_new_tokens=teacher.reserved + 6, temperature=0.0, seed=0)
        think, answer = text.removeprefix(THINK_OPEN).split(THINK_CLOSE)
        label = answer.removeprefix("<answer>").removesuffix("</answer>")
        assert answer_target(label, "reasoning", trace=text) == text  # well formed, whatever the model is
        assert "<" not in think and len(tokenizer(think, add_special_tokens=False)["input_ids"]) <= 6 + 1
        # T = 0: the answer is the label the teacher scores highest after its own reasoning
        ids = tokenizer(render_prompt(tokenizer, messages) + THINK_OPEN + think + THINK_CLOSE,
                        add_special_tokens=False)["input_ids"]
        probs = score_labels(tiny.model, tokenizer, [ids], SPACE, batch_size=1)[0].tolist()
        assert label == SPACE.labels[max(range(2), key=probs.__getitem__)]
    sampled = [teacher.generate(teacher_messages("win cash now", SPACE, None), max_new_tokens=20, temperature=1.0,
                                seed=s) for s in (3, 3)]
    assert sampled[0] == sampled[1]  # the same seed draws the same trace
    assert teacher.name == "local:tiny-random+constrained"


def test_constrained_refuses_an_endpoint_and_a_cap_too_small_for_the_tags(tiny, data, tmp_path):
    class Endpoint:
        kind, name = "endpoint", "http://x/v1"

    with pytest.raises(ValueError, match="is an endpoint.*--trace-format free"):
        ConstrainedTeacher(Endpoint(), SPACE)
    teacher = ConstrainedTeacher(tiny, SPACE)
    with pytest.raises(ValueError, match=f"set --max-new-tokens {teacher.reserved + 1} or more"):
        teacher.think_budget(teacher.reserved)
    with pytest.raises(ValueError, match="is an endpoint"):
        run_distill_config(DistillConfig(data=str(data), teacher="http://127.0.0.1:9/v1", teacher_model="t",
                                         out=tmp_path / "t.jsonl", trace_format="constrained"))


def test_a_constrained_local_teacher_keeps_traces_in_a_distill_run(data, tmp_path):
    out = tmp_path / "traces.jsonl"
    summary = run_distill_config(DistillConfig(data=str(data), teacher="tiny-random", out=out, attempts=3,
                                               max_new_tokens=24, trace_format="constrained"))
    attempts = [r for r in read_jsonl(distill_paths(out).journal) if r["kind"] == "attempt"]
    assert {r["status"] for r in attempts} == {"ok"}  # nothing fails to parse: only the label decides
    assert summary["trace_format"] == "constrained" and summary["teacher"] == "local:tiny-random+constrained"
    kept = [r for r in read_jsonl(out) if r["kept"]]
    assert kept and all(answer_target(r["label"], "reasoning", trace=r["trace"]) for r in kept)


def test_no_kept_trace_is_an_error_that_says_what_to_do_and_a_rerun_asks_nothing_again(data, tmp_path):
    out = tmp_path / "traces.jsonl"
    cfg = DistillConfig(data=str(data), teacher="", teacher_model="t", out=out, attempts=2, retries=0)
    with FakeOpenAIServer("I think this is spam.") as server:  # never the trace format
        cfg = cfg.model_copy(update={"teacher": server.url})
        for _ in range(2):
            with pytest.raises(ValueError) as caught:
                run_distill_config(cfg)
            assert len(server.requests) == 8  # 4 items × 2 attempts, asked once
    message = str(caught.value)
    assert "no trace kept: 0 of 4 items" in message and "8 attempts (0 parsed; replies: 8 unclosed_think)" in message
    for fix in ("raise --attempts (now 2)", "raise --max-new-tokens", "--trace-format constrained", "stronger teacher"):
        assert fix in message, fix
    # the summary is not written, so the ladder does not take the arm as finished
    assert not distill_paths(out).summary.exists() and distill_paths(out).journal.exists()
