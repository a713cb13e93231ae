"""Reference and property tests for labelrl.rewards.parse."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labelrl.rewards.parse import ParseStatus, label_lookup, parse_answer
from labelrl.types import LabelSpace

LABELS = ["ham", "spam"]
S = ParseStatus


def strict_direct(text, **kw):
    return parse_answer(text, reasoning=False, labels=LABELS, **kw)


def strict_reasoning(text, **kw):
    return parse_answer(text, reasoning=True, labels=LABELS, **kw)


@pytest.mark.parametrize(
    "text, status, answer",
    [
        ("<answer>spam</answer>", S.OK, "spam"),
        ("\n  <answer> SPAM </answer>\n", S.OK, "spam"),  # trimmed + case-folded content
        ("The answer is <answer>spam</answer>.", S.NO_ANSWER, None),  # text around the block
        ("<answer>spam</answer> because it sells pills", S.NO_ANSWER, None),
        ("<answer>spam</answer><answer>ham</answer>", S.MULTIPLE_ANSWERS, None),
        ("<answer>spam</answer>\n<answer>spam</answer>", S.MULTIPLE_ANSWERS, None),  # even if they agree
        ("<answer><answer>spam</answer></answer>", S.NO_ANSWER, None),  # nested
        ("<answer>spam", S.NO_ANSWER, None),  # never closed
        ("spam</answer>", S.NO_ANSWER, None),  # never opened
        ("<answer>spam</answer></answer>", S.NO_ANSWER, None),  # stray closer
        ("<ANSWER>spam</ANSWER>", S.NO_ANSWER, None),  # tags are exact
        ("<answer>eggs</answer>", S.UNKNOWN_LABEL, None),
        ("<answer></answer>", S.UNKNOWN_LABEL, None),
        ("spam", S.NO_ANSWER, None),  # a bare word is not an answer in strict mode
        ("", S.EMPTY, None),
        (" \n\t", S.EMPTY, None),
    ],
)
def test_strict_direct_reference(text, status, answer):
    result = strict_direct(text)
    assert result.status is status
    assert result.answer == answer
    assert result.ok == (status is S.OK)


def test_strict_direct_keeps_raw_content_and_counts_blocks():
    result = strict_direct("x <answer> Spam </answer>")
    # The block exists (n_answers 1, raw shown) but prose around it fails the format.
    assert (result.status, result.n_answers, result.raw) == (S.NO_ANSWER, 1, " Spam ")
    assert strict_direct("<answer>a</answer><answer>b</answer><answer>c</answer>").n_answers == 3


@pytest.mark.parametrize(
    "text, status, answer",
    [
        ("<think>looks like an ad</think>\n<answer>spam</answer>", S.OK, "spam"),
        ("looks like an ad</think><answer>spam</answer>", S.OK, "spam"),  # <think> was in the prompt
        ("<think>maybe <answer>ham</answer>?</think><answer>spam</answer>", S.OK, "spam"),  # quoted tag ignored
        ("<think>say <answer>ham</answer></think>", S.NO_ANSWER, None),  # answer only inside thought
        ("<think>a</think>b</think><answer>ham</answer>", S.OK, "ham"),  # the LAST </think> counts
        ("<think>a</think><answer>ham</answer></think>", S.NO_ANSWER, None),  # answer before the last </think>
        ("<think>hmm <answer>spam</answer>", S.UNCLOSED_THINK, None),
        ("<answer>spam</answer>", S.UNCLOSED_THINK, None),  # reasoning mode demands </think>
        ("<think>x</think>so: <answer>spam</answer>", S.NO_ANSWER, None),  # text after the thought
        ("<think>x</think><answer>spam</answer><answer>ham</answer>", S.MULTIPLE_ANSWERS, None),
        ("<think>x</think><answer>maybe</answer>", S.UNKNOWN_LABEL, None),
    ],
)
def test_strict_reasoning_reference(text, status, answer):
    result = strict_reasoning(text)
    assert result.status is status
    assert result.answer == answer


def test_think_closed_is_recorded_in_both_modes():
    assert strict_reasoning("<think>x</think><answer>ham</answer>").think_closed is True
    assert strict_reasoning("<think>x <answer>ham</answer>").think_closed is False
    assert strict_direct("<think>x</think><answer>ham</answer>").think_closed is True


def test_truncated_replaces_failure_status_but_not_ok():
    assert strict_reasoning("<think>long long", truncated=True).status is S.TRUNCATED
    assert strict_direct("", truncated=True).status is S.TRUNCATED
    ok = strict_direct("<answer>ham</answer>", truncated=True)
    assert (ok.status, ok.answer) == (S.OK, "ham")


def test_lenient_takes_first_block_anywhere_even_inside_thinking():
    text = "<think>is it <answer>ham</answer>? no</think><answer>spam</answer>"
    lenient = parse_answer(text, reasoning=True, mode="lenient", labels=LABELS)
    assert (lenient.status, lenient.answer, lenient.n_answers) == (S.OK, "ham", 2)
    assert strict_reasoning(text).answer == "spam"


def test_lenient_accepts_prose_and_bare_words():
    lenient = dict(reasoning=False, mode="lenient", labels=LABELS)
    assert parse_answer("The answer is <answer>spam</answer>.", **lenient).answer == "spam"
    assert parse_answer("I think this is Spam, not ham.", **lenient).answer == "spam"  # first word wins
    assert parse_answer("hamster spammer", **lenient).status is S.NO_ANSWER  # whole words only
    assert parse_answer("<answer>eggs</answer> spam", **lenient).status is S.UNKNOWN_LABEL  # first block decides


def test_lenient_bare_word_prefers_earliest_then_longest_label():
    labels = ["negative", "very negative", "-1"]
    lenient = dict(reasoning=False, mode="lenient", labels=labels)
    assert parse_answer("it is very negative overall", **lenient).answer == "very negative"
    assert parse_answer("negative, maybe very negative", **lenient).answer == "negative"
    assert parse_answer("score: -1", **lenient).answer == "-1"  # symbol labels match


def test_returns_declared_spelling_and_accepts_label_space():
    space = LabelSpace(("Ham", "SPAM"), kind="binary")
    assert parse_answer("<answer>spam</answer>", reasoning=False, labels=space).answer == "SPAM"
    assert parse_answer("<answer> ham</answer>", reasoning=False, labels=["Ham", "SPAM"]).answer == "Ham"


def test_a_label_with_a_run_of_spaces_is_the_label_with_one():
    # a model that writes "not  spam" (two spaces, one more token) has answered "not spam"
    labels = ["not spam", "spam"]
    assert parse_answer("<answer>Not  spam</answer>", reasoning=False, labels=labels).answer == "not spam"
    assert parse_answer("<answer>not\nspam</answer>", reasoning=False, labels=labels).answer == "not spam"
    assert parse_answer("<answer>notspam</answer>", reasoning=False, labels=labels).status is S.UNKNOWN_LABEL


def test_bad_arguments_raise_value_error_naming_the_value():
    with pytest.raises(ValueError, match="'ham,spam' is a single string"):
        parse_answer("x", reasoning=False, labels="ham,spam")
    with pytest.raises(ValueError, match="mode='loose'"):
        parse_answer("x", reasoning=False, labels=LABELS, mode="loose")
    with pytest.raises(ValueError, match="labels=\\[\\]"):
        parse_answer("x", reasoning=False, labels=[])
    with pytest.raises(ValueError, match="differ after trimming"):
        label_lookup(["Spam", " spam"])
    with pytest.raises(ValueError, match="folding runs of whitespace"):
        label_lookup(["not spam", "not  spam"])


# --- properties -------------------------------------------------------------------------

FRAGMENTS = st.sampled_from(
    ["<answer>", "</answer>", "<think>", "</think>", "<answer", "answer>", "</", "<", ">",
     "ham", "spam", "SPAM ", " eggs", "\n", " ", "é", "ß", "日本", "\u200b", "🙂", "\x00"]
)
TEXTS = st.lists(st.one_of(FRAGMENTS, st.text(max_size=6)), max_size=14).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=TEXTS, reasoning=st.booleans(), mode=st.sampled_from(["strict", "lenient"]), truncated=st.booleans())
def test_any_text_parses_without_raising_and_answers_only_labels(text, reasoning, mode, truncated):
    result = parse_answer(text, reasoning=reasoning, mode=mode, labels=LABELS, truncated=truncated)
    assert isinstance(result.status, ParseStatus)
    assert (result.answer is not None) == (result.status is S.OK)
    assert result.answer is None or result.answer in LABELS
    assert result.think_closed == ("</think>" in text)


@settings(max_examples=200, deadline=None)
@given(text=TEXTS)
def test_strict_reasoning_never_answers_from_an_unclosed_think(text):
    text = text.replace("</think>", "")
    result = parse_answer("<think>" + text, reasoning=True, labels=LABELS)
    assert result.answer is None
    assert result.status is S.UNCLOSED_THINK


@settings(max_examples=200, deadline=None)
@given(thought=TEXTS, label=st.sampled_from(LABELS))
def test_strict_reasoning_ignores_tags_quoted_in_the_thought(thought, label):
    thought = thought.replace("</think>", "")
    text = f"<think>{thought} <answer>eggs</answer></think>\n<answer>{label}</answer>"
    result = parse_answer(text, reasoning=True, labels=LABELS)
    assert (result.status, result.answer, result.n_answers) == (S.OK, label, 1)
