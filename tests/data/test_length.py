"""--on-long-item: items whose prompt exceeds a budget are cut, left out or refused, never silently."""

from __future__ import annotations

import json

import pytest

from labelrl.data.length import CUT_MARK, announce, fit_prompts
from labelrl.data.prompts import render_messages, render_prompt
from labelrl.types import Example, LabelSpace

LABELS = LabelSpace(("neg", "pos"), kind="binary", positive="pos")


@pytest.fixture(scope="module")
def tokenizer():
    from labelrl.models import load_tokenizer

    return load_tokenizer("tiny-random")


def render_with(tokenizer, rubric=None):
    def render(example: Example) -> list[int]:
        messages = render_messages(example, labels=LABELS, mode="direct", rubric=rubric)
        return tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"]

    return render


def examples() -> list[Example]:
    # items 1 and 3 are long (a few hundred tokens); the others a handful
    lengths = [2, 120, 3, 80, 1]
    return [Example(id=f"e{i}", text=" ".join(f"word{i}x{j}" for j in range(n)), label="pos") for i, n in enumerate(lengths)]


def budget_between_short_and_long(tokenizer) -> int:
    render = render_with(tokenizer)
    lengths = [len(render(ex)) for ex in examples()]
    short, long_ = max(lengths[0], lengths[2], lengths[4]), min(lengths[1], lengths[3])
    assert short + 20 < long_  # the fixture is what the tests assume
    return short + 20


def test_truncate_cuts_only_the_long_items_to_fit_their_budget(tokenizer):
    budget = budget_between_short_and_long(tokenizer)
    render = render_with(tokenizer)
    kept, out, prompts, report = fit_prompts(tokenizer, examples(), render, budget, policy="truncate",
                                             stage="training items", limit=f"{budget} tokens")
    assert kept == [0, 1, 2, 3, 4]
    assert report.ids == ["e1", "e3"] and report.n_items == 5 and report.policy == "truncate"
    assert all(len(p) <= budget for p in prompts)
    assert [render(ex) for ex in out] == prompts  # the prompts are those of the items returned
    original = examples()
    for before, after in zip(original, out):
        if before.id in report.ids:
            assert after.text.endswith(CUT_MARK) and before.text.startswith(after.text.removesuffix(CUT_MARK))
            assert len(prompts[out.index(after)]) >= budget - 8  # cut near the budget, not far below it
        else:
            assert after == before
    assert report.prompt_tokens == [len(render(original[1])), len(render(original[3]))]


def test_per_item_budgets_keep_each_items_answer_space(tokenizer):
    render = render_with(tokenizer)
    lengths = [len(render(ex)) for ex in examples()]
    budgets = [n - 1 if i == 4 else n for i, n in enumerate(lengths)]  # only the last item is 1 token over
    _, out, prompts, report = fit_prompts(tokenizer, examples(), render, budgets, policy="truncate", stage="x", limit="y")
    assert report.ids == ["e4"] and report.budgets == [lengths[4] - 1]
    assert [len(p) <= b for p, b in zip(prompts, budgets)] == [True] * 5


def test_skip_leaves_the_long_items_out(tokenizer):
    budget = budget_between_short_and_long(tokenizer)
    kept, out, prompts, report = fit_prompts(tokenizer, examples(), render_with(tokenizer), budget, policy="skip",
                                             stage="training items", limit="z")
    assert kept == [0, 2, 4] and [ex.id for ex in out] == ["e0", "e2", "e4"] and len(prompts) == 3
    assert report.ids == ["e1", "e3"]
    assert "they are left out" in report.message()


def test_error_refuses_with_the_count_and_the_choices(tokenizer):
    budget = budget_between_short_and_long(tokenizer)
    with pytest.raises(ValueError, match=r"^2 of 5 training items do not fit --max-length 99 with their answer "
                                         r"\(longest prompt \d+ tokens; ids e1, e3\); pass --on-long-item truncate .* "
                                         r"or --on-long-item skip .*, or raise --max-length$"):
        fit_prompts(tokenizer, examples(), render_with(tokenizer), budget, policy="error", stage="training items",
                    limit="--max-length 99 with their answer", fix="raise --max-length")
    # nothing long: every policy returns the items unchanged
    for policy in ("error", "skip", "truncate"):
        kept, out, _, report = fit_prompts(tokenizer, examples(), render_with(tokenizer), 10_000, policy=policy,
                                           stage="s", limit="l")
        assert kept == [0, 1, 2, 3, 4] and out == examples() and report.ids == []


def test_a_prompt_too_long_without_its_text_is_refused_by_name(tokenizer):
    rubric = "Rule. " * 200  # the instructions alone exceed the budget
    with pytest.raises(ValueError, match=r"item e0: the prompt without the item's text already takes .* shorten the rubric"):
        fit_prompts(tokenizer, examples(), render_with(tokenizer, rubric), 120, policy="truncate", stage="s", limit="l")
    with pytest.raises(ValueError, match=r"item e0: its answer alone takes all of l"):
        fit_prompts(tokenizer, examples(), render_with(tokenizer), 0, policy="truncate", stage="s", limit="l")


def test_announce_saves_the_record_and_prints_only_when_something_was_done(tokenizer, tmp_path, capsys):
    budget = budget_between_short_and_long(tokenizer)
    *_, report = fit_prompts(tokenizer, examples(), render_with(tokenizer), budget, policy="truncate",
                             stage="training items", limit="--max-length 64")
    announce(report, tmp_path / "long.json")
    saved = json.loads((tmp_path / "long.json").read_text())
    assert saved["ids"] == ["e1", "e3"] and saved["policy"] == "truncate" and saved["n_items"] == 5
    err = capsys.readouterr().err
    assert "2 of 5 training items do not fit --max-length 64" in err and "their text is cut to fit" in err
    assert str(tmp_path / "long.json") in err
    *_, none = fit_prompts(tokenizer, examples(), render_with(tokenizer), 10_000, policy="truncate", stage="s", limit="l")
    announce(none, tmp_path / "none.json")
    assert json.loads((tmp_path / "none.json").read_text())["ids"] == [] and capsys.readouterr().err == ""


def test_the_same_cut_is_said_once_per_process(tokenizer, tmp_path, capsys):
    # a ladder scores one val split once per model: the line about its long items is said once
    budget = budget_between_short_and_long(tokenizer)
    stage = f"val items of {tmp_path.name}"  # a line no other test prints in this process
    for _ in range(3):
        *_, report = fit_prompts(tokenizer, examples(), render_with(tokenizer), budget, policy="truncate",
                                 stage=stage, limit="the model's context")
        announce(report, None)
    assert capsys.readouterr().err.count(f"2 of 5 {stage} do not fit") == 1
    *_, skipped = fit_prompts(tokenizer, examples(), render_with(tokenizer), budget, policy="skip",
                              stage=stage, limit="the model's context")
    announce(skipped, None)  # another choice is another line
    assert "they are left out" in capsys.readouterr().err
