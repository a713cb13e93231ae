"""Prompt rendering in both answer modes, with and without a chat template, and SFT targets."""

from __future__ import annotations

import pytest

from labelrl.data.prompts import (
    ANSWER_PREFIX,
    answer_target,
    check_answer_fits,
    check_labels_expressible,
    longest_answer,
    render_messages,
    render_prompt,
)
from labelrl.types import Example, LabelSpace

BINARY = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
GRADES = LabelSpace(("1", "2", "3"), kind="ordinal")
ITEM = Example(id="7", text="WIN a FREE prize now", label="spam")
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def templated_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "</s>": 1, "win": 2}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", eos_token="</s>")
    tokenizer.chat_template = TEMPLATE
    return tokenizer


class NoTemplate:
    """The two attributes render_prompt looks at, for a tokenizer without a chat template."""

    chat_template = None

    def apply_chat_template(self, *args, **kwargs):
        raise AssertionError("must not be called without a template")


def test_direct_messages_state_labels_and_format():
    system, user = render_messages(ITEM, labels=BINARY, mode="direct")
    assert system["role"] == "system" and user == {"role": "user", "content": "WIN a FREE prize now"}
    assert "The possible labels are: ham, spam." in system["content"]
    assert "inside answer tags, for example: <answer>ham</answer>" in system["content"]
    assert "<think>" not in system["content"]


def test_reasoning_messages_ask_for_think_then_answer_and_carry_rubric():
    system, _ = render_messages(ITEM, labels=GRADES, mode="reasoning", rubric="  Grade 3 = glowing.\n",
                                instruction="Rate the review.")
    text = system["content"]
    assert text.startswith("Rate the review.")
    assert "ordered grades, from lowest to highest: 1, 2, 3." in text
    assert "First think step by step inside <think>...</think>" in text
    assert text.index("<think>") < text.index("<answer>1</answer>")
    assert text.endswith("Labelling rules:\nGrade 3 = glowing.")


def test_bad_mode_and_unexpressible_labels():
    with pytest.raises(ValueError, match="mode='cot': not an answer mode; choose 'direct' or 'reasoning'"):
        render_messages(ITEM, labels=BINARY, mode="cot")
    for label in ["a<b", "x>", "two\nlines", " "]:
        with pytest.raises(ValueError, match="cannot be empty or contain '<', '>' or a line break"):
            check_labels_expressible(["fine", label])
    check_labels_expressible(BINARY)  # plain labels pass
    with pytest.raises(ValueError, match=r"label '<b>'"):
        render_messages(ITEM, labels=LabelSpace(("a", "<b>")), mode="direct")


def test_render_prompt_uses_the_chat_template(templated_tokenizer):
    messages = render_messages(ITEM, labels=BINARY, mode="direct")
    prompt = render_prompt(templated_tokenizer, messages)
    assert prompt == (
        f"<|system|>{messages[0]['content']}<|end|>\n"
        "<|user|>WIN a FREE prize now<|end|>\n"
        "<|assistant|>"
    )


def test_render_prompt_plain_fallback():
    messages = render_messages(ITEM, labels=BINARY, mode="direct")
    prompt = render_prompt(NoTemplate(), messages)
    assert prompt == f"System:\n{messages[0]['content']}\n\nUser:\nWIN a FREE prize now\n\nAssistant:\n"


def test_answer_target_direct():
    assert answer_target("spam", "direct") == "<answer>spam</answer>"
    assert answer_target("spam", "direct").startswith(ANSWER_PREFIX)
    with pytest.raises(ValueError, match="a trace was given in direct mode"):
        answer_target("spam", "direct", trace="<think>x</think><answer>spam</answer>")


def test_answer_target_reasoning_validates_the_trace():
    trace = "  <think>Prize and caps: typical spam.</think>\n<answer>Spam</answer>\n"
    assert answer_target("spam", "reasoning", trace=trace) == trace.strip()
    with pytest.raises(ValueError, match="this item has none; make traces with `labelrl distill`"):
        answer_target("spam", "reasoning")
    bad_traces = [
        "<answer>spam</answer>",  # no think block
        "<think>x</think>",  # no answer
        "<think>x</think><answer>spam</answer> trailing",  # text after the answer
        "<think>x <answer>ham</answer></think><answer>spam</answer>",  # a second answer tag
    ]
    for bad in bad_traces:
        with pytest.raises(ValueError, match="must be <think>...</think> followed by one <answer>LABEL</answer>"):
            answer_target("spam", "reasoning", trace=bad)
    with pytest.raises(ValueError, match="trace answers 'ham' but the label is 'spam'"):
        answer_target("spam", "reasoning", trace="<think>x</think><answer>ham</answer>")


class CharTokenizer:
    """One token per character: an answer tag's token count is its length."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(ch) for ch in text]}


def test_the_longest_answer_is_counted_in_the_models_tokens_and_must_fit_with_its_end_token():
    tags = {label: f"<answer>{label}</answer>" for label in ("no", "maybe so", "yes")}
    assert longest_answer(CharTokenizer(), ["no", "maybe so", "yes"]) == (len(tags["maybe so"]), tags["maybe so"])
    assert longest_answer(CharTokenizer(), BINARY) == (len("<answer>spam</answer>"), "<answer>spam</answer>")
    need = len(tags["maybe so"]) + 1  # the tag, then the end-of-text token, within the cap
    check_answer_fits(CharTokenizer(), ["no", "maybe so", "yes"], need)
    with pytest.raises(ValueError) as info:
        check_answer_fits(CharTokenizer(), ["no", "maybe so", "yes"], need - 1)
    message = str(info.value)  # the value, the tag that does not fit, and the fix
    assert f"--max-new-tokens {need - 1}" in message and tags["maybe so"] in message
    assert f"at least {need}" in message and "count as truncated" in message
