"""`labelrl ladder --data FILE --budget smoke`: a default recipe for the file's label kind, run to
a verdict and a report, written to RUN_DIR/recipe.yaml and re-runnable as it is."""

from __future__ import annotations

import csv
import json
import os
import re
import random
import subprocess
import sys

import yaml

GOOD = ["great product, works well", "love it", "excellent quality", "very happy with this"]
BAD = ["broke after a day", "terrible, do not buy", "waste of money", "very disappointed"]


def labelrl(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
    return subprocess.run([sys.executable, "-m", "labelrl.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


def test_a_binary_csv_gets_the_default_ladder_a_verdict_and_a_rerunnable_recipe(tmp_path):
    rng = random.Random(0)
    with open(tmp_path / "reviews.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "sentiment"])
        for i in range(300):
            pos = rng.random() < 0.6
            writer.writerow([f"{rng.choice(GOOD if pos else BAD)} (order {i})", "pos" if pos else "neg"])
    done = labelrl("ladder", "--data", "reviews.csv", "--text-col", "review", "--label-col", "sentiment",
                   "--budget", "smoke", "--out", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((tmp_path / "run" / "ladder.json").read_text())
    arms = state["tasks"]["reviews"]["arms"]
    assert set(arms) == {"sft", "grpo", "dr_grpo", "threshold"}  # no CoRPO for binary labels
    assert {a["status"] for a in arms.values()} == {"done"}
    sentence = state["tasks"]["reviews"]["analysis"]["grid"]["sentence"]
    assert "─ verdict ─" in done.stdout and " ".join(sentence.split()) in " ".join(done.stdout.split())
    explained = labelrl("report", "run", "--explain", cwd=tmp_path)  # each arm's line, after any "no learning signal …"
    assert explained.returncode == 0, explained.stderr[-3000:]
    flat = " ".join(explained.stdout.split())  # the console wraps long lines
    assert re.search(r"• grpo: [^•]*vs sft:", flat) and re.search(r"• dr_grpo: [^•]*vs sft:", flat)
    assert (tmp_path / "run" / "report" / "report.html").is_file()
    recipe = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert recipe["tasks"]["reviews"]["data"] == str(tmp_path / "reviews.csv") and recipe["model"] == "tiny-random"
    again = labelrl("ladder", "run/recipe.yaml", "--out", "run", cwd=tmp_path)  # the written recipe, as it is
    assert again.returncode == 0, again.stderr[-3000:]
    assert all(f"reviews/{arm}: done earlier, skipped" in again.stdout for arm in arms)


def test_an_ordinal_jsonl_gets_corpo_at_the_credit_of_one_grade_off(tmp_path):
    rng = random.Random(1)
    words = {"1": "awful", "2": "poor", "3": "okay", "4": "good", "5": "superb"}
    rows = [{"id": f"r{i}", "text": f"the film was {words[g]} ({i})", "grade": g}
            for i, g in enumerate(rng.choice("12345") for _ in range(250))]
    (tmp_path / "grades.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    done = labelrl("ladder", "--data", "grades.jsonl", "--label-col", "grade", "--labels", "1,2,3,4,5", "--kind",
                   "ordinal", "--out", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((tmp_path / "run" / "ladder.json").read_text())
    arms = state["tasks"]["grades"]["arms"]
    assert set(arms) == {"sft", "grpo", "dr_grpo", "corpo", "threshold"}
    assert arms["corpo"]["config"]["threshold"] == 0.75  # 1 − 1/(5 − 1)
    assert arms["threshold"]["rule"]["kind"] == "offsets"
    explained = labelrl("report", "run", "--explain", cwd=tmp_path)
    assert re.search(r"• corpo: [^•]*vs sft:", " ".join(explained.stdout.split()))  # the console wraps long lines
    assert (tmp_path / "run" / "report" / "report.md").is_file()


def test_a_recipe_and_data_together_are_refused(tmp_path):
    done = labelrl("ladder", "demo", "--data", "x.csv", cwd=tmp_path)
    assert done.returncode == 2 and "not both" in done.stderr


def test_long_label_names_raise_rls_token_cap_to_hold_the_longest_answer(tmp_path):
    # The smoke budget's 12 tokens cannot hold <answer>clearly negative in its tone of voice</answer>, nor its
    # end-of-text token: with that cap every such completion would count as truncated.
    from labelrl.cli.ladder import data_recipe
    from labelrl.data.prompts import check_answer_fits, longest_answer
    from labelrl.ladder.default_recipe import answer_cap
    from labelrl.models.load import load_tokenizer

    labels = ["clearly positive in its tone of voice", "neutral", "clearly negative in its tone of voice"]
    with open(tmp_path / "tones.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "tone"])
        writer.writerows([f"message {i}", labels[i % 3]] for i in range(60))
    recipe = data_recipe(str(tmp_path / "tones.csv"), budget="smoke", model=None, text_col=["text"], label_col="tone",
                         labels=None, kind=None, rubric=None, on_bad_row="error", delimiter=None, sets=[])
    tokens, _ = longest_answer(load_tokenizer("tiny-random"), labels)
    cap = recipe.defaults["rl"]["max_new_tokens"]
    assert tokens + 1 > 12 and cap == answer_cap(tokens)
    check_answer_fits(load_tokenizer("tiny-random"), labels, cap)


def test_a_cpu_ladder_on_long_texts_says_before_it_starts_how_much_longer_it_will_take(tmp_path, capsys):
    from labelrl.cli.ladder import data_recipe

    args = dict(model="tiny-random", text_col=["review"], label_col="sentiment", labels=None, kind=None, rubric=None,
                on_bad_row="error", delimiter=None, sets=[])
    # sorted by length: the short reviews first, the long ones after (the lengths are read through the file)
    rows = [[f"short review {i}", "pos" if i % 2 else "neg"] for i in range(40)]
    rows += [[" ".join(f"word{j}" for j in range(900)), "pos" if i % 2 else "neg"] for i in range(40)]
    with open(tmp_path / "reviews.csv", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["review", "sentiment"], *rows])
    data_recipe(str(tmp_path / "reviews.csv"), budget="cpu", **args)
    out = " ".join(capsys.readouterr().out.split())
    assert "long texts: they average" in out and "hours" in out and "labelrl data show" in out
    assert "--set tasks.reviews.eval_limit=N" in out  # the recipe's own task name
    # short texts: nothing to say
    with open(tmp_path / "short.csv", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["review", "sentiment"], *rows[:40]])
    data_recipe(str(tmp_path / "short.csv"), budget="cpu", **args)
    assert "long texts" not in capsys.readouterr().out


def test_the_gpu_budget_is_refused_where_torch_sees_no_gpu(tmp_path, monkeypatch):
    import pytest
    import torch

    from labelrl.cli.ladder import data_recipe

    with open(tmp_path / "reviews.csv", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["review", "sentiment"], *[[f"review {i}", "pos" if i % 2 else "neg"] for i in range(40)]])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = dict(model="tiny-random", text_col=["review"], label_col="sentiment", labels=None, kind=None, rubric=None,
                on_bad_row="error", delimiter=None, sets=[])
    with pytest.raises(ValueError, match=r"--budget gpu: no CUDA GPU is visible .* use --budget cpu"):
        data_recipe(str(tmp_path / "reviews.csv"), budget="gpu", **args)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine builds the budget's recipe
    recipe = data_recipe(str(tmp_path / "reviews.csv"), budget="gpu", **args)
    assert recipe.defaults["rl"]["group_size"] == 8 and recipe.model == "tiny-random"


def test_positive_names_the_binary_label_the_sweep_reads_and_the_table_says_which(tmp_path, capsys):
    import pytest
    from rich.console import Console

    from labelrl.cli.ladder import comparison_tables, data_recipe

    with open(tmp_path / "rare.csv", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["message", "flag"], *[[f"message {i}", "fraud" if i % 10 == 0 else "ok"]
                                                              for i in range(100)]])
    args = dict(budget="smoke", model=None, text_col=["message"], label_col="flag", labels=None, kind=None, rubric=None,
                on_bad_row="error", delimiter=None, sets=[])
    default = data_recipe(str(tmp_path / "rare.csv"), **args)
    assert default.tasks["rare"].positive_label is None  # the loader's rule: the second in sorted order, "ok"
    said = " ".join(capsys.readouterr().out.split())  # "ok" is 90% of the rows: the user is told how to choose
    assert "positive label: ok (the second in sorted order), 90% of the rows" in said and "--positive fraud" in said
    chosen = data_recipe(str(tmp_path / "rare.csv"), positive="FRAUD", **args)  # spelled as the data spells it
    assert chosen.tasks["rare"].positive_label == "fraud"
    assert "positive label:" not in capsys.readouterr().out  # named: nothing to say
    with pytest.raises(ValueError, match="positive='maybe'"):
        data_recipe(str(tmp_path / "rare.csv"), positive="maybe", **args)
    state = {"tasks": {"rare": {"data": "rare.csv", "kind": "binary", "positive_label": "fraud", "arms": {}}}}
    console = Console(record=True, width=200)
    for table in comparison_tables(state):
        console.print(table)
    assert "rare: rare.csv (binary, positive label fraud)" in console.export_text()


def test_before_anything_trains_the_ladder_says_what_it_read(tmp_path, capsys):
    """Items, the label kind and how to say otherwise, each label's count and the rare labels:
    a grade column saved by pandas as "4.0" reads as the 1–5 scale, in grade order."""
    from labelrl.cli.ladder import data_recipe

    args = dict(model=None, text_col=["text"], label_col="grade", labels=None, kind=None, rubric=None,
                on_bad_row="error", delimiter=None, sets=[])
    counts = {"1": 3, "2": 20, "3": 40, "4": 30, "5": 12}
    rows = [(f"review {g}-{i}", f"{g}.0") for g, n in counts.items() for i in range(n)]
    with open(tmp_path / "grades.csv", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([("text", "grade"), *rows])
    data_recipe(str(tmp_path / "grades.csv"), budget="smoke", **args)
    said = " ".join(capsys.readouterr().out.split())
    assert f"{tmp_path / 'grades.csv'}: 105 items, 5 labels, ordinal (every label a number: a scale; --kind " \
           "categorical if it is not one): 1 (3), 2 (20), 3 (40), 4 (30), 5 (12)." in said
    assert "Fewer than 10 items of 1: val and holdout hold a few at most, and one such item moves balanced " \
           "accuracy by up to 1/5 = 0.200" in said
    assert "No item is graded" not in said
    rows = [(f"review {g}-{i}", g) for g in "1235" for i in range(12)]  # a 1–5 scale nobody graded 4
    with open(tmp_path / "gap.csv", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([("text", "grade"), *rows])
    data_recipe(str(tmp_path / "gap.csv"), budget="smoke", **args)
    said = " ".join(capsys.readouterr().out.split())
    assert "No item is graded 4: grades count as steps of the list above, so declare the whole scale if it has " \
           "them (--labels 1,2,3,4,5)" in said
    data_recipe(str(tmp_path / "gap.csv"), budget="smoke", **{**args, "labels": "1,2,3,4,5"})
    said = " ".join(capsys.readouterr().out.split())
    assert "4 (0), 5 (12). No item is labelled 4: balanced accuracy averages the other 4 labels' recalls" in said
    assert "No item is graded" not in said and "Fewer" not in said
    import pandas as pd

    quality = pd.Categorical(["low", "mid", "high"] * 10, categories=["low", "mid", "high"], ordered=True)
    pd.DataFrame({"text": [f"snippet {i}" for i in range(30)], "grade": quality}).to_parquet(tmp_path / "q.parquet")
    data_recipe(str(tmp_path / "q.parquet"), budget="smoke", **args)
    said = " ".join(capsys.readouterr().out.split())
    assert "30 items, 3 labels, ordinal (the file's ordered categories, lowest first): low (10), mid (10), high (10)" in said
    with open(tmp_path / "tones.csv", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([("text", "grade"), *((f"t{i}", "calm" if i % 3 else "Tense ") for i in range(30))])
    data_recipe(str(tmp_path / "tones.csv"), budget="smoke", **args)
    said = " ".join(capsys.readouterr().out.split())
    assert "30 items, 2 labels, binary (positive label Tense): calm (20), Tense (10)" in said and "Fewer" not in said
