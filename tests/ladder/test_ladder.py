"""The ladder end to end on tiny-random: every arm type, a failing arm and the arms that need
it, shared splits, one holdout look per model, analyses from files, and a re-run that redoes
nothing finished.

The teacher is a local fake endpoint that reasons correctly about the toy task (is the word a
fruit?), so the distillation arms have survivors to train on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

from labelrl.evaluate.ledger import merge_readings  # noqa: E402
from labelrl.fileio import read_jsonl  # noqa: E402
from labelrl.ladder import Ladder, load_recipe, read_state  # noqa: E402

FRUIT, THINGS = ["grape", "mango", "apple"], ["chair", "table", "stone"]


def toy_rows(n: int = 60) -> list[dict]:
    """Unique texts (so the group-aware split spreads them over all three splits); ``label_clean``
    is a second answer key that disagrees with ``label`` on every fifth item."""
    words = FRUIT + THINGS
    rows = [{"id": f"t{i}", "text": f"item {i}: {words[i % 6]}", "label": "yes" if words[i % 6] in FRUIT else "no"}
            for i in range(n)]
    for i, row in enumerate(rows):
        row["label_clean"] = ({"yes": "no", "no": "yes"}[row["label"]]) if i % 5 == 0 else row["label"]
    return rows


def teacher(body: dict) -> str:
    text = body["messages"][-1]["content"]
    fruit = any(w in text for w in FRUIT)
    return f"<think>The item names {'a fruit' if fruit else 'no fruit'}.</think><answer>{'yes' if fruit else 'no'}</answer>"


def toy_recipe(data: Path, teacher_url: str | None) -> dict:
    arms = {
        "sft": {"type": "sft"},
        "grpo": {"type": "rl", "from": "sft", "preset": "grpo"},
        "corpo": {"type": "rl", "from": "sft", "preset": "corpo", "threshold": 0.5},
        "noise": {"type": "random_reward", "from": "sft"},
        # fails at run time: every prompt is longer than 16 tokens, which preflight refuses
        "sft_short": {"type": "sft", "max_length": 16},
        # a local judge relabels the task's samples under the rubric: a second answer key
        "relabel": {"type": "relabel", "judge": "tiny-random", "self_agreement_sample": 10},
        "rl_short": {"type": "rl", "from": "sft_short"},
    }
    if teacher_url:
        arms |= {
            "distill": {"type": "distill", "teacher": teacher_url, "teacher_model": "t", "attempts": 1, "retries": 0},
            "cot": {"type": "cot_sft", "from": "distill", "max_steps": 1},
            "cot_rl": {"type": "cot_rl", "from": "cot", "max_new_tokens": 24},
            "control": {"type": "control", "from": "distill"},
        }
    return {
        "version": 1, "name": "toy", "model": "tiny-random", "seed": 0,
        "defaults": {
            "sft": {"lora": False, "learning_rate": 3e-3, "max_steps": 2, "batch_size": 4, "eval_every": 2, "eval_limit": 4, "quiet": True},
            "rl": {"lora": False, "learning_rate": 1e-3, "steps": 1, "group_size": 2, "prompts_per_step": 2,
                   "max_new_tokens": 8, "checkpoint_every": 1, "quiet": True},
        },
        "tasks": {"toy": {"data": str(data), "text_col": ["text"], "label_col": "label", "limit": 12, "eval_limit": 4,
                          "holdout_limit": 4, "n_boot": 20, "eval_label_cols": ["label_clean", "relabel"],
                          "rubric": str(data.parent / "rubric.md"), "arms": arms}},
    }


def write(path: Path, obj) -> Path:
    path.write_text(yaml.safe_dump(obj, sort_keys=False) if path.suffix == ".yaml" else "".join(json.dumps(r) + "\n" for r in obj), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def ladder_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ladder")
    data = write(root / "toy.jsonl", toy_rows())
    (root / "rubric.md").write_text("Answer yes when the item names a fruit, else no.\n", encoding="utf-8")
    with FakeOpenAIServer(teacher) as server:
        recipe_path = write(root / "recipe.yaml", toy_recipe(data, server.url))
        state = Ladder(load_recipe(recipe_path), root / "run", Console(quiet=True)).run()
        requests = len(server.requests)
    return root, recipe_path, state, requests


def test_every_arm_type_runs_and_failures_are_contained(ladder_run):
    root, _, state, _ = ladder_run
    arms = state["tasks"]["toy"]["arms"]
    assert {a["type"] for a in arms.values()} == {"sft", "rl", "random_reward", "distill", "cot_sft", "cot_rl", "control",
                                                 "relabel"}
    status = {name: a["status"] for name, a in arms.items()}
    assert status.pop("sft_short") == "failed" and "max_length" in arms["sft_short"]["error"].replace("--max-length", "max_length")
    assert status.pop("rl_short") == "skipped" and "sft_short" in arms["rl_short"]["error"]
    assert set(status.values()) == {"done"}, status
    assert (root / "run" / "toy" / "sft_short" / "error.txt").read_text().startswith("Traceback")
    assert arms["noise"]["config"]["random_reward"] is True
    assert arms["cot_rl"]["config"]["mode"] == "reasoning" and arms["cot"]["config"]["traces"].endswith("distill/traces.jsonl")
    assert arms["distill"]["survival"]["n_survived"] > 0
    # the time per phase is in the state for the report: one training row per trained arm
    trained = {p["what"] for p in state["phases"] if p["phase"] == "train"}
    assert {"sft (sft)", "cot_rl (rl)", "control (sft)"} <= trained and state["seconds_last_invocation"] > 0


def test_arms_share_one_split_and_each_model_looks_at_the_holdout_once(ladder_run):
    root, _, state, _ = ladder_run
    task_dir = root / "run" / "toy"
    shared = (task_dir / "splits.json").read_text()
    trained = [n for n, a in state["tasks"]["toy"]["arms"].items() if a["status"] == "done" and a["type"] not in ("distill", "relabel")]
    for name in trained:
        assert (task_dir / name / "splits.json").read_text() == shared
        assert (task_dir / "eval" / f"{name}-val.parquet").is_file() and (task_dir / "eval" / f"{name}-holdout.json").is_file()
    records = read_jsonl(task_dir / "ledger.jsonl")
    holdout = [r for r in records if r["split"] == "holdout" and not r["derived"]]
    assert not any(r["repeat"] for r in holdout)
    # one look per distinct model: a direct RL arm's generations are a reading of its look, each reading taken once
    looks = [r for r in holdout if not r.get("reading_of")]
    assert len({r["model_fingerprint"] for r in looks}) == len(looks)
    assert len({(r["model_fingerprint"], r["method"]) for r in holdout}) == len(holdout)
    shared_with = {n: a.get("holdout_same_model_as") for n, a in state["tasks"]["toy"]["arms"].items() if a.get("holdout_same_model_as")}
    assert len(looks) + len(shared_with) == len(trained)
    generated = [n for n, a in state["tasks"]["toy"]["arms"].items() if a.get("holdout_generate")]
    assert set(generated) == {n for n, a in state["tasks"]["toy"]["arms"].items()
                              if a["status"] == "done" and a["type"] in ("rl", "random_reward")}
    # the listing: one row per look, a direct RL arm's with both readings (its scores and its generations)
    rows = {r["model_fingerprint"]: r for r in merge_readings(records) if r["split"] == "holdout" and not r["derived"]}
    assert len(rows) == len(looks)
    for name in generated:
        fingerprint = json.loads((task_dir / "eval" / f"{name}-holdout-generate.json").read_text())["info"]["model_fingerprint"]
        assert set(rows[fingerprint]["readings"]) == {"scores", "generate"}, name


def test_analyses_are_built_from_the_evaluation_files(ladder_run):
    root, _, state, _ = ladder_run
    analysis = state["tasks"]["toy"]["analysis"]
    sweep = json.loads(Path(analysis["sweep"]["file"]).read_text())
    answering = ["grpo", "corpo", "noise", "cot", "cot_rl", "control"]  # RL, CoT-SFT and control arms
    # every arm's val operating point on the SFT ROC, and each SFT → arm cascade's (routed) one
    # and the greedy generations' point of each direct RL arm (labelrl.ladder.generation_point)
    generated = [f"{n} (greedy generation)" for n in ("grpo", "corpo")]
    assert sweep["arms"] == {"base": "sft", "compared": answering + [f"route → {n}" for n in answering] + generated}
    assert set(analysis["route"]["files"]) == set(answering)
    for name in ("grpo", "cot", "route → cot_rl"):
        assert name in analysis["sweep"]["verdicts"]
    assert set(analysis["rescore"]["files"]) == {"grpo", "corpo", "noise", "cot_rl"}
    compare = json.loads(Path(analysis["compare"]["file"]).read_text())
    assert [compare["models"][r]["name"] for r in ("direct_all", "direct_survivors", "cot")] == ["sft", "control", "cot"]


def test_reasoning_arms_are_scored_at_their_own_caps_and_survival_is_banded_by_difficulty(ladder_run):
    root, _, state, _ = ladder_run
    arms = state["tasks"]["toy"]["arms"]
    assert arms["cot_rl"]["eval_max_new_tokens"] == 24 == arms["cot_rl"]["val"]["max_new_tokens"]  # its RL cap
    assert arms["cot"]["eval_max_new_tokens"] == arms["distill"]["config"]["max_new_tokens"]  # the distillation cap
    assert arms["sft"]["eval_max_new_tokens"] is None and arms["sft"]["holdout"]["max_new_tokens"] is None  # scored
    # the SFT model scored the training sample (never recorded), and the traces' survival is banded by it
    assert (root / "run" / "toy" / "eval" / "sft-train.parquet").is_file()
    assert not any(r["split"] == "train" for r in read_jsonl(root / "run" / "toy" / "ledger.jsonl"))
    summary = json.loads((root / "run" / "toy" / "distill" / "traces.summary.json").read_text())
    assert summary["by_confidence"] and sum(b["n_items"] for b in summary["by_confidence"].values()) > 0


def test_other_answer_keys_rescore_the_same_predictions(ladder_run):
    import pyarrow.parquet as pq

    root, _, state, _ = ladder_run
    task = root / "run" / "toy"
    clean = {r["id"]: r["label_clean"] for r in toy_rows()}
    for name in ("sft", "grpo"):
        table = pq.read_table(task / "eval" / f"{name}-holdout.parquet").to_pylist()
        accuracy = sum(r["prediction"] == clean[r["id"]] for r in table) / len(table)
        keyed = state["tasks"]["toy"]["arms"][name]["answer_keys"]["label_clean"]
        assert keyed["holdout"]["accuracy"] == pytest.approx(accuracy) and keyed["holdout"]["n"] == len(table)
    derived = [r for r in read_jsonl(task / "ledger.jsonl") if r.get("label_col") == "label_clean"]
    assert derived and all(r["derived"] for r in derived)


def test_a_relabel_arm_relabels_the_samples_and_becomes_an_answer_key(ladder_run):
    root, _, state, _ = ladder_run
    task = root / "run" / "toy"
    arms = state["tasks"]["toy"]["arms"]
    samples = json.loads((task / "samples.json").read_text())
    key = json.loads((task / "relabel" / "answer_key.json").read_text())
    assert set(key["labels"]) == {i for s in samples.values() for i in s["ids"]}  # exactly the samples' items
    originals = {r["id"]: r["label"] for r in toy_rows()}
    assert all(key["original"][i] == originals[i] for i in key["labels"])
    summary = arms["relabel"]["relabel"]
    assert summary["n_items"] == len(key["labels"]) and summary["self_agreement"]["n_sample"] == 10
    # every evaluated arm is also scored against the relabelled answer key, from its own predictions
    import pyarrow.parquet as pq

    rows = pq.read_table(task / "eval" / "sft-holdout.parquet").to_pylist()
    accuracy = sum(r["prediction"] == key["labels"][r["id"]] for r in rows) / len(rows)
    assert arms["sft"]["answer_keys"]["relabel"]["holdout"]["accuracy"] == pytest.approx(accuracy)
    assert state["tasks"]["toy"]["arm_order"].index("relabel") < state["tasks"]["toy"]["arm_order"].index("sft")


def test_rerun_redoes_nothing_finished(ladder_run):
    root, recipe_path, state, requests = ladder_run
    task_dir = root / "run" / "toy"
    stamps = {p: p.stat().st_mtime_ns for p in task_dir.rglob("*") if p.is_file() and "sft_short" not in p.parts and p.name != "ledger.jsonl"}
    ledger = (task_dir / "ledger.jsonl").read_text()
    with FakeOpenAIServer(teacher) as server:
        again = Ladder(load_recipe(recipe_path), root / "run", Console(quiet=True)).run()
        assert len(server.requests) == 0  # the teacher is never asked again
    assert {n: a["status"] for n, a in again["tasks"]["toy"]["arms"].items()} == {n: a["status"] for n, a in state["tasks"]["toy"]["arms"].items()}
    changed = [p for p, t in stamps.items() if p.exists() and p.stat().st_mtime_ns != t and "analysis" not in p.parts]
    assert changed == [], changed
    holdout_before = [line for line in ledger.splitlines() if '"holdout"' in line]
    holdout_after = [line for line in (task_dir / "ledger.jsonl").read_text().splitlines() if '"holdout"' in line]
    assert holdout_after == holdout_before
    assert read_state(root / "run")["tasks"]["toy"]["arms"]["sft"]["status"] == "done"


def test_a_changed_config_for_a_finished_arm_is_refused(ladder_run, tmp_path):
    root, recipe_path, _, _ = ladder_run
    raw = yaml.safe_load(recipe_path.read_text())
    raw["tasks"]["toy"]["arms"]["grpo"]["steps"] = 3
    changed = write(tmp_path / "changed.yaml", raw)
    with pytest.raises(ValueError, match=r"tasks\.toy\.arms\.grpo: finished .* with another config \(steps: 1 → 3\)"):
        Ladder(load_recipe(changed), root / "run", Console(quiet=True))


def test_report_has_every_section_built_from_the_files(ladder_run, tmp_path):
    import re
    import shutil

    from labelrl.report import NOT_RUN, SECTIONS, build_report

    root, _, _, _ = ladder_run
    copy = tmp_path / "run"
    shutil.copytree(root / "run", copy, ignore=shutil.ignore_patterns("model", "checkpoints"))  # no model is needed
    result = build_report(copy)
    html, md = result.html.read_text(), result.markdown.read_text()
    for key, title in SECTIONS:
        assert title in html and title in md
        if key != "noise":  # one task: no label-noise comparison (tests/cli/test_noise_cli.py has one)
            assert NOT_RUN[key] not in md, key  # every section had its inputs
    assert f"Not run: {NOT_RUN['noise']}" in md
    assert "sft_short" in md and "max_length" in md.replace("--max-length", "max_length")  # the failed arm and its error
    assert not re.search(r"""(src|href)=["']https?://""", html)  # nothing fetched from the network
    assert all(src.startswith("data:image/") for src in re.findall(r'<img[^>]*src="([^"]+)"', html))


def test_a_failed_arm_fixed_and_rerun_leaves_no_trace_of_the_failure(tmp_path):
    data = write(tmp_path / "toy.jsonl", toy_rows())
    raw = toy_recipe(data, None)
    task = raw["tasks"]["toy"]
    task.pop("rubric")
    task["eval_label_cols"] = ["label_clean"]
    task["arms"] = {"sft_short": {"type": "sft", "max_length": 16}}
    first = Ladder(load_recipe(write(tmp_path / "r1.yaml", raw)), tmp_path / "run", Console(quiet=True)).run()
    arm_dir = tmp_path / "run" / "toy" / "sft_short"
    assert first["tasks"]["toy"]["arms"]["sft_short"]["status"] == "failed" and (arm_dir / "error.txt").is_file()
    task["arms"]["sft_short"]["max_length"] = 256
    again = Ladder(load_recipe(write(tmp_path / "r2.yaml", raw)), tmp_path / "run", Console(quiet=True)).run()
    arm = again["tasks"]["toy"]["arms"]["sft_short"]
    assert arm["status"] == "done" and "error" not in arm and not (arm_dir / "error.txt").exists()


@pytest.mark.parametrize("where, rl_cap, eval_cap", [("toy/grpo's max_new_tokens", 4, None),
                                                      ("tasks.toy.eval_max_new_tokens", 9, 4)])
def test_a_token_cap_that_cannot_hold_an_answer_stops_the_ladder_before_anything_trains(tmp_path, where, rl_cap, eval_cap):
    # <answer>yes</answer> and its end-of-text token need 8 tokens: at 4 the RL run (or a generated
    # evaluation) would refuse to start, after its SFT parent had trained; the ladder says so first.
    data = write(tmp_path / "toy.jsonl", toy_rows())
    task = {"data": str(data), "limit": 12, "eval_limit": 4, "holdout_limit": 4, "n_boot": 20,
            "arms": {"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "sft"}}}
    recipe = {"version": 1, "name": "caps", "model": "tiny-random", "seed": 0,
              "defaults": {"sft": {"lora": False, "max_steps": 1, "batch_size": 4, "eval_every": 1, "quiet": True},
                           "rl": {"lora": False, "steps": 1, "group_size": 2, "prompts_per_step": 2,
                                  "max_new_tokens": rl_cap, "quiet": True}},
              "tasks": {"toy": task | ({"eval_max_new_tokens": eval_cap} if eval_cap else {})}}
    with pytest.raises(ValueError, match=rf"recipe: {where}: --max-new-tokens 4: the answer <answer>\w+</answer> "
                                         r"takes \d+ tokens.*at least \d+"):
        Ladder(load_recipe(write(tmp_path / "caps.yaml", recipe)), tmp_path / "run", Console(quiet=True)).run()
    assert not (tmp_path / "run" / "toy" / "sft").exists()  # nothing trained
