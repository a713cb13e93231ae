"""Tests for labelrl.audit.relabel: provenance columns and the final-label rule, agreement
numbers against hand-computed values, the journal (resume re-asks nothing, torn lines,
mismatched setups), outputs and bad input; end to end with an endpoint and with tiny-random."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

from labelrl.audit.judges import JudgeError, JudgeSpec, Verdict, load_judge  # noqa: E402
from labelrl.audit.relabel import (  # noqa: E402
    PROVENANCE_COLUMNS,
    agreement_with,
    load_items,
    output_paths,
    read_rubric,
    run_relabel,
    self_agreement_ids,
)
from labelrl.types import LabelSpace  # noqa: E402

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
RUBRIC = "Spam: unsolicited advertising or scams."
ORIGINAL = ["spam", "ham", "spam", "ham", "ham", "spam"]


class ScriptedJudge:
    """A judge answering from a table by item id (``retest`` for sampled passes); records calls."""

    kind = "scripted"

    def __init__(self, name, answers, retest=None, fail_after=None):
        self.name, self.answers, self.retest, self.fail_after = name, answers, retest or answers, fail_after
        self.calls: list[tuple[str, int | None]] = []

    def label(self, items, *, sample_seed=None, on_result=None):
        out = []
        for i, ex in enumerate(items):
            if self.fail_after is not None and len(self.calls) >= self.fail_after:
                raise JudgeError("scripted judge: endpoint refused the connection")
            self.calls.append((ex.id, sample_seed))
            verdict = (self.answers if sample_seed is None else self.retest)[ex.id]
            out.append(verdict)
            if on_result is not None:
                on_result(i, verdict)
        return out

    def generate(self, messages, **kw):
        return ""


def V(label, confidence):  # noqa: N802 - reads like a table row
    return Verdict(label, confidence, f"<answer>{label}</answer><confidence>{confidence}</confidence>")


JUDGE = {"1": V("spam", 0.9), "2": V("spam", 0.95), "3": V("ham", 0.5), "4": Verdict(None, None, "no idea"),
         "5": Verdict("ham", None, "<answer>ham</answer>"), "6": V("spam", 0.7)}
RETEST = {"1": V("spam", 0.6), "2": V("ham", 0.6), "3": V("ham", 0.6), "4": V("ham", 0.6),
          "5": V("ham", 0.6), "6": V("spam", 0.6)}
ADJUDICATOR = {"3": V("spam", 0.8), "4": V("ham", 0.9), "5": Verdict(None, None, "hmm")}


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "msgs.jsonl"
    rows = [{"text": f"message {i}", "label": label, "source": "web" if i % 2 else "sms", "score": i}
            for i, label in enumerate(ORIGINAL, start=1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def run(data, tmp_path, judge, adjudicator=None, out="out.jsonl", **kw):
    items = load_items(data, limit=kw.pop("limit", None))
    paths = output_paths(items, tmp_path / out)
    rubric = kw.pop("rubric", RUBRIC)
    options = {"self_agreement_sample": 6, "seed": 0, **kw}
    return run_relabel(items, rubric, judge, adjudicator, paths, **options), paths


def read_out(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_provenance_columns_and_final_label_rule(data, tmp_path):
    judge, adjudicator = ScriptedJudge("j", JUDGE, RETEST), ScriptedJudge("a", ADJUDICATOR)
    summary, paths = run(data, tmp_path, judge, adjudicator)
    rows = read_out(paths.out)
    assert [r["source"] for r in rows] == ["web", "sms"] * 3 and [r["score"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(set(PROVENANCE_COLUMNS) <= set(r) for r in rows)
    assert [r["label_original"] for r in rows] == ORIGINAL
    # 1, 2 confident; 3 low (0.5); 4 unparseable; 5 no confidence; 6 at the threshold (not below)
    assert [r["adjudicated"] for r in rows] == [False, False, True, True, True, False]
    assert [id_ for id_, _ in adjudicator.calls] == ["3", "4", "5"]
    assert [r["label_final"] for r in rows] == ["spam", "spam", "spam", "ham", "ham", "spam"]
    assert [r["final_source"] for r in rows] == ["judge", "judge", "adjudicator", "adjudicator", "judge", "judge"]
    assert [r["judge_status"] for r in rows] == ["ok", "ok", "ok", "unparseable", "no_confidence", "ok"]
    assert rows[2]["adjudicator_confidence"] == 0.8 and rows[4]["label_adjudicator"] is None
    assert summary["judge_status"] == {"ok": 4, "no_confidence": 1, "unparseable": 1}
    assert (summary["n_low_confidence"], summary["n_adjudicated"], summary["n_adjudicator_unparseable"]) == (3, 3, 1)
    assert summary["n_changed"] == 1 and summary["final_source"] == {"judge": 4, "adjudicator": 2}
    assert json.loads(paths.summary.read_text()) == json.loads(json.dumps(summary))


def test_agreement_numbers_match_hand_computation(data, tmp_path):
    summary, _ = run(data, tmp_path, ScriptedJudge("j", JUDGE, RETEST), ScriptedJudge("a", ADJUDICATOR))
    judge = summary["agreement_with_original"]["judge"]
    # judged items 1,2,3,5,6: original s,h,s,h,s vs judge s,s,h,h,s → 3/5 agree.
    # κ: p_o = 0.6; both marginals s 3/5, h 2/5 → p_e = 0.36 + 0.16 = 0.52; κ = 0.08/0.48 = 1/6.
    assert (judge["n"], judge["n_missing"], judge["agreement"]) == (5, 1, pytest.approx(0.6))
    assert judge["kappa"] == pytest.approx(1 / 6)
    assert judge["per_class"] == {"ham": {"n": 2, "agreement": 0.5}, "spam": {"n": 3, "agreement": pytest.approx(2 / 3)}}
    assert judge["confusion"] == {"ham": {"ham": 1, "spam": 1}, "spam": {"ham": 1, "spam": 2}}
    assert summary["agreement_with_original"]["final"]["agreement"] == pytest.approx(5 / 6)
    sa = summary["self_agreement"]
    # pairs (first, retest): 1 s/s, 2 s/h, 3 h/h, 5 h/h, 6 s/s; item 4's first reply did not parse.
    # d = 1/5 → agreement 0.8; ε = (1 − √(1 − 2·0.2))/2 = 0.112702; symmetrised κ: endpoints
    # s 5, h 5 → p_e = 0.5, κ = (0.8 − 0.5)/0.5 = 0.6.
    assert (sa["n_sample"], sa["n_compared"], sa["n_unparseable"]) == (6, 5, 1)
    assert sa["agreement"] == pytest.approx(0.8)
    assert sa["flip_rate"] == pytest.approx(0.112702, abs=1e-6) and sa["ceiling"] == pytest.approx(0.887298, abs=1e-6)
    assert sa["kappa"] == pytest.approx(0.6)
    assert sa["agreement_ci"][0] <= 0.8 <= sa["agreement_ci"][1]


def test_agreement_with_small_table_and_undefined_kappa():
    # p_o = 3/4; marginals a (2/4, 1/4), b (2/4, 3/4) → p_e = 0.125 + 0.375 = 0.5 → κ = 0.5
    block = agreement_with(["ham", "ham", "spam", "spam"], ["ham", "spam", "spam", "spam"], SPAM)
    assert block["agreement"] == 0.75 and block["kappa"] == pytest.approx(0.5)
    assert agreement_with(["ham", "ham"], ["ham", "ham"], SPAM)["kappa"] is None  # one label only
    assert agreement_with(["ham"], [None], SPAM)["agreement"] is None


def test_self_agreement_sample_is_seeded_and_bounded(data, fresh_process):
    examples = load_items(data).examples
    # a second run (another interpreter, another hash seed) samples the same items
    assert fresh_process(self_agreement_ids, examples, 3, 5) == self_agreement_ids(examples, 3, 5)
    assert len(self_agreement_ids(examples, 50, 0)) == 6 and self_agreement_ids(examples, 0, 0) == []
    picks = {tuple(self_agreement_ids(examples, 3, seed)) for seed in range(10)}
    assert len(picks) > 1


def test_retest_calls_use_the_seed(data, tmp_path):
    judge = ScriptedJudge("j", JUDGE, RETEST)
    run(data, tmp_path, judge, self_agreement_sample=2, seed=9)
    retests = [c for c in judge.calls if c[1] is not None]
    assert len(retests) == 2 and all(seed == 9 for _, seed in retests)


def test_interrupted_run_resumes_without_re_asking(data, tmp_path):
    def stop_after_three(kind, item_id, seen=[]):  # noqa: B006 - a counter across calls
        seen.append(item_id)
        if len(seen) == 3:
            raise KeyboardInterrupt

    first = ScriptedJudge("j", JUDGE, RETEST)
    with pytest.raises(KeyboardInterrupt):
        run(data, tmp_path, first, on_record=stop_after_three)
    assert not (tmp_path / "out.jsonl").exists()  # the output is written only at the end
    second = ScriptedJudge("j", JUDGE, RETEST)
    summary, paths = run(data, tmp_path, second)
    assert [i for i, s in second.calls if s is None] == ["4", "5", "6"]  # items 1-3 were saved
    rows = read_out(paths.out)
    assert sorted(r["text"] for r in rows) == [f"message {i}" for i in range(1, 7)]
    # A third run finds everything in the journal and asks nothing.
    third = ScriptedJudge("j", JUDGE, RETEST)
    assert run(data, tmp_path, third)[0] == summary and third.calls == []


def test_judge_failure_keeps_answers_and_says_how_to_resume(data, tmp_path):
    with pytest.raises(JudgeError, match=r"refused the connection\. Saved so far in .*out\.journal\.jsonl: 4 judge; re-run"):
        run(data, tmp_path, ScriptedJudge("j", JUDGE, RETEST, fail_after=4))
    judge = ScriptedJudge("j", JUDGE, RETEST)
    run(data, tmp_path, judge)
    assert [i for i, s in judge.calls if s is None] == ["5", "6"]


def test_torn_last_journal_line_is_dropped_and_re_asked(data, tmp_path):
    run(data, tmp_path, ScriptedJudge("j", JUDGE, RETEST), self_agreement_sample=0)
    journal = tmp_path / "out.journal.jsonl"
    text = journal.read_text()
    journal.write_text(text[: len(text) - 20])  # a kill in the middle of the last line (item 6)
    judge = ScriptedJudge("j", JUDGE, RETEST)
    run(data, tmp_path, judge, self_agreement_sample=0)
    assert judge.calls == [("6", None)]
    assert all(json.loads(line) for line in journal.read_text().splitlines())


def test_a_journal_from_another_setup_is_refused(data, tmp_path):
    run(data, tmp_path, ScriptedJudge("j", JUDGE, RETEST))
    with pytest.raises(ValueError, match=r"written for a different rubric_sha256; delete it to start over"):
        run(data, tmp_path, ScriptedJudge("j", JUDGE, RETEST), rubric="Other rules.")
    with pytest.raises(ValueError, match=r"written for a different judge"):
        run(data, tmp_path, ScriptedJudge("other", JUDGE, RETEST))


def test_a_wrong_model_name_leaves_no_journal_in_the_way_of_the_corrected_run(tmp_path):
    # vLLM refuses a model name it does not serve (404) on the first request; the journal then
    # holds only its header, which must not refuse the re-run with the right --judge-model.
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"text": f"item {i}", "label": "ham" if i % 2 else "spam"}) + "\n" for i in range(3)))
    items = load_items(path)
    paths = output_paths(items, tmp_path / "out.jsonl")
    with FakeOpenAIServer(answer_by_number, served_models=["smollm2"]) as server:
        for model in ("smollm2-135m", "smollm2"):
            spec = JudgeSpec(server.url, model=model, retries=0, timeout_s=5)
            judge = load_judge(spec, items.labels, RUBRIC)
            if model == "smollm2-135m":
                with pytest.raises(JudgeError, match="the server serves 'smollm2', not 'smollm2-135m'; give --judge-model "
                                                     "smollm2. Saved so far in .*: nothing yet"):
                    run_relabel(items, RUBRIC, judge, None, paths, self_agreement_sample=0)
            else:
                summary = run_relabel(items, RUBRIC, judge, None, paths, self_agreement_sample=0)
    lines = read_out(paths.journal)
    assert lines[0]["judge"].endswith("model=smollm2") and len(lines) == 4
    assert summary["n_items"] == 3 and sum(r.status == 200 for r in server.requests) == 3
    # a journal holding answers is still refused for another judge
    other = load_judge(JudgeSpec(server.url, model="other", retries=0), items.labels, RUBRIC)
    with pytest.raises(ValueError, match="written for a different judge"):
        run_relabel(items, RUBRIC, other, None, paths, self_agreement_sample=0)


def test_a_new_adjudicator_is_asked_but_the_judge_is_not(data, tmp_path):
    run(data, tmp_path, ScriptedJudge("j", JUDGE, RETEST), ScriptedJudge("a", ADJUDICATOR))
    judge, stronger = ScriptedJudge("j", JUDGE, RETEST), ScriptedJudge("b", {k: V("spam", 0.99) for k in "345"})
    summary, _ = run(data, tmp_path, judge, stronger)
    assert judge.calls == [] and [i for i, _ in stronger.calls] == ["3", "4", "5"]
    assert summary["adjudicator"] == "b" and summary["n_adjudicator_unparseable"] == 0


def test_without_adjudicator_low_confidence_keeps_judge_label(data, tmp_path):
    summary, paths = run(data, tmp_path, ScriptedJudge("j", JUDGE, RETEST))
    rows = read_out(paths.out)
    assert not any(r["adjudicated"] for r in rows)
    assert [r["final_source"] for r in rows] == ["judge", "judge", "judge", "original", "judge", "judge"]
    assert any("no --adjudicator was given" in note for note in summary["notes"])
    assert any("they keep their original label" in note for note in summary["notes"])


def test_parquet_output_matches_jsonl(data, tmp_path):
    run(data, tmp_path, ScriptedJudge("j", JUDGE, RETEST), out="out.jsonl")
    run(data, tmp_path, ScriptedJudge("j", JUDGE, RETEST), out="out.parquet")
    assert pq.read_table(tmp_path / "out.parquet").to_pylist() == read_out(tmp_path / "out.jsonl")


def test_limit_relabels_the_first_rows_only(data, tmp_path):
    judge = ScriptedJudge("j", JUDGE, RETEST)
    summary, paths = run(data, tmp_path, judge, limit=2)
    assert summary["n_items"] == 2 and len(read_out(paths.out)) == 2 and {i for i, _ in judge.calls} == {"1", "2"}


def test_output_paths_protect_the_input(data, tmp_path):
    items = load_items(data)
    with pytest.raises(ValueError, match="would be the input file .* never overwrites its input"):
        output_paths(items, data.parent / "." / data.name)
    with pytest.raises(ValueError, match="writes .jsonl or .parquet"):
        output_paths(items, tmp_path / "out.csv")
    paths = output_paths(items, None)
    assert paths.out == data.parent / "msgs.relabelled.jsonl"
    assert paths.journal == data.parent / "msgs.relabelled.journal.jsonl"
    assert paths.summary == data.parent / "msgs.relabelled.summary.json"


def test_bad_input_is_a_clear_value_error(tmp_path, data):
    with pytest.raises(ValueError, match="--text-col 'body': no such column"):
        load_items(data, text_cols=["body"])
    empty = tmp_path / "empty.csv"
    empty.write_text("text,label\n")
    with pytest.raises(ValueError, match="no data rows"):
        load_items(empty)
    clash = tmp_path / "clash.jsonl"
    clash.write_text('{"text": "a", "label": "x", "label_final": "x"}\n{"text": "b", "label": "y", "label_final": "y"}\n')
    with pytest.raises(ValueError, match=r"already has the column\(s\) \['label_final'\]"):
        load_items(clash)
    with pytest.raises(ValueError, match="--rubric .*: no such file"):
        read_rubric(tmp_path / "missing.md")
    (tmp_path / "blank.md").write_text("  \n")
    with pytest.raises(ValueError, match="the file is empty"):
        read_rubric(tmp_path / "blank.md")
    with pytest.raises(ValueError, match="--limit 0"):
        load_items(data, limit=0)


def answer_by_number(body: dict) -> str:
    text = body["messages"][-1]["content"]
    label = "spam" if int(text.split()[-1]) % 3 == 0 else "ham"
    return f"<answer>{label}</answer><confidence>0.9</confidence>"


def test_endpoint_resume_after_the_server_dies_re_asks_nothing_saved(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps({"text": f"item {i}", "label": "ham" if i % 2 else "spam"}) + "\n" for i in range(12)))
    with FakeOpenAIServer(answer_by_number, fail_after=5) as server:
        spec = JudgeSpec(server.url, model="m", concurrency=2, retries=0, backoff_s=0.01, timeout_s=5)
        items = load_items(path)
        paths = output_paths(items, tmp_path / "out.jsonl")
        with pytest.raises(JudgeError, match="HTTP 503"):
            run_relabel(items, RUBRIC, load_judge(spec, items.labels, RUBRIC), None, paths, self_agreement_sample=3)
        saved = {r["id"] for r in map(json.loads, paths.journal.read_text().splitlines()[1:])}
        saved_texts = {f"item {int(i) - 1}" for i in saved}
        assert 1 <= len(saved) <= 5
        first_run = len(server.requests)
        server.fail_after = None  # the server comes back
        summary = run_relabel(items, RUBRIC, load_judge(spec, items.labels, RUBRIC), None, paths, self_agreement_sample=3)
        second_run = server.requests[first_run:]
        everything = [r.user_text for r in server.requests if "seed" not in r.body]
    assert all(everything.count(text) == 1 for text in saved_texts)  # each saved item was sent once, ever
    main_pass = [r.user_text for r in second_run if "seed" not in r.body]
    assert not saved_texts & set(main_pass)  # nothing saved was asked again
    assert len(main_pass) == len(set(main_pass)) == 12 - len(saved)
    assert sum("seed" in r.body for r in second_run) == 3
    rows = read_out(paths.out)
    assert sorted(r["text"] for r in rows) == sorted(f"item {i}" for i in range(12))
    assert [r["label_final"] for r in rows] == ["spam" if i % 3 == 0 else "ham" for i in range(12)]
    assert summary["requests"]["judge"]["requests"] == len(second_run)


def test_end_to_end_with_tiny_random_as_judge_and_adjudicator(data, tmp_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    local = load_judge(JudgeSpec("tiny-random"), SPAM, RUBRIC)
    summary, paths = run(data, tmp_path, local, local, self_agreement_sample=4, min_confidence=0.99)
    rows = read_out(paths.out)
    assert len(rows) == 6 and all(r["judge_status"] == "ok" for r in rows)
    assert all(0.5 <= r["judge_confidence"] < 0.99 for r in rows)  # a random model is never that sure
    assert all(r["adjudicated"] and r["label_final"] == r["label_adjudicator"] for r in rows)
    assert summary["self_agreement"]["n_compared"] == 4
    assert "label distribution" in summary["self_agreement"]["method"]


def test_progress_bar_counts_each_phase(data, tmp_path):
    import io

    from rich.console import Console

    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=100)
    judge, adjudicator = ScriptedJudge("j", JUDGE, RETEST), ScriptedJudge("a", ADJUDICATOR)
    run(data, tmp_path, judge, adjudicator, self_agreement_sample=2, console=console)
    shown = stream.getvalue()
    assert "judging" in shown and "6/6" in shown
    assert "adjudicating" in shown and "3/3" in shown
    assert "self-agreement" in shown and "2/2" in shown
