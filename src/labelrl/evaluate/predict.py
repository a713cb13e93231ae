"""Run a model over one split of its data and return a predictions table.

Two methods:

* ``scores`` (direct models): label-token scoring (``labelrl.evaluate.score.score_labels``),
  one forward pass per batch, no generation. The prediction is the most probable label and
  every row parses (``parse_status`` "ok").
* ``generate`` (reasoning models, or direct ones when asked): greedy decoding (temperature
  0) with the shared-prompt sampler, parsed by the strict parser in the run's answer mode.
  An unparseable output has prediction null and its ``ParseStatus`` value; metrics count it
  as wrong.

The split's examples and the loaded model come from ``labelrl.evaluate.setup.prepare``
(``EvalSetup``); ``evaluate_split`` adds the metrics and the holdout ledger's record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from labelrl.data.options import DataOptions
from labelrl.data.prompts import (
    ANSWER_PREFIX,
    check_answer_fits,
    longest_answer,
    render_messages,
    render_prompt,
)
from labelrl.evaluate.io import Predictions, predictions_table
from labelrl.evaluate.setup import EvalData, EvalSetup, prepare
from labelrl.models.precision import precision_name
from labelrl.rollout.sampler import pad_id
from labelrl.types import Example, LabelSpace

METHODS = ("scores", "generate")
REASONING_MAX_NEW_TOKENS = 256
# Scoring's batches hold at most this many token positions (rows × the longest): texts of a few
# thousand tokens then go a few at a time, so the count moves every few seconds and the batch's
# activations stay small, while short texts keep whole batches (16 × 286 tokens for sms-spam).
SCORE_BATCH_POSITIONS = 8192
# Scoring on the packed weights computes real tokens only, so larger batches cost no padding:
# 128 vader-movies val prompts in bf16 (AMX Xeon, 2 threads, median of 3) took 2.62 s in batches
# of 16, 2.25 s of 32 and 2.33 s of 64 (the module pass: 3.88 s in batches of 16); in fp32,
# 5.66, 5.22 and 9.63 s. Batches of ``batch_size`` prompts are taken up to this many.
FAST_SCORE_ROWS = 32


def example_prompt_ids(tokenizer, data: EvalData, example: Example) -> list[int]:
    messages = render_messages(example, labels=data.labels, mode=data.options.mode, rubric=data.rubric)
    return tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"]


def prompt_token_ids(tokenizer, data: EvalData) -> list[list[int]]:
    """Prompt ids of every example as it stands (``fit_to_context`` also fits them to the model)."""
    return [example_prompt_ids(tokenizer, data, ex) for ex in data.examples]


def answer_tokens(tokenizer, labels: LabelSpace, mode: str, method: str, max_new_tokens: int | None) -> int:
    """Tokens an answer may take after the prompt: scoring reads ``<answer>`` and the longest
    label; generating writes up to the token cap, ``max_new_tokens`` (which must hold the longest
    answer and its end-of-text token, ``check_answer_fits``: checked before anything is scored, so
    a holdout look is not spent on cut-off answers) or ``default_max_new_tokens``."""
    if method == "generate":
        if max_new_tokens:
            check_answer_fits(tokenizer, labels, max_new_tokens)
            return max_new_tokens
        return default_max_new_tokens(tokenizer, labels, mode)
    return max(len(tokenizer(ANSWER_PREFIX + x, add_special_tokens=False)["input_ids"]) for x in labels.labels)


def fit_to_context(setup: EvalSetup, method: str, max_new_tokens: int | None):
    """(examples, prompt ids, LongItems): every prompt fits the model's context with its answer,
    by the data options' ``on_long_item`` (``labelrl.data.length``), said on stderr when any
    item was cut or left out; the record goes into the predictions' info."""
    from labelrl.data.length import announce, fit_prompts

    data, tokenizer = setup.data, setup.tokenizer
    context = getattr(getattr(setup.model, "config", None), "max_position_embeddings", None) or 10**12  # none stated
    answer = answer_tokens(tokenizer, data.labels, data.options.mode, method, max_new_tokens)
    _, examples, prompts, report = fit_prompts(
        tokenizer, data.examples, lambda ex: example_prompt_ids(tokenizer, data, ex), context - answer,
        policy=data.options.on_long_item,
        stage=f"{data.split} items", limit=f"the model's context of {context} tokens with {answer} for the answer",
        fix="shorten the texts" if method == "scores" else "lower --max-new-tokens",
    )
    announce(report, None)
    return examples, prompts, report


def score_counted(model, tokenizer, prompts: list[list[int]], labels: LabelSpace, *, batch_size: int, description: str,
                  plain: bool = False, dtype=None):
    """``score_labels`` of ``prompts`` [N, K], a batch at a time, with a count and an ETA
    (``labelrl.progress.Counter``): scoring a split of long texts takes minutes on a CPU. The
    prompts are taken in order of length, so each batch pads to a similar length, at most
    ``batch_size`` of them (at least ``FAST_SCORE_ROWS`` on the packed weights,
    ``labelrl.evaluate.score.scoring_weights``) and ``SCORE_BATCH_POSITIONS`` padded positions
    (one long prompt goes alone); the rows come back in the prompts' order. The ETA follows the token positions scored,
    not the items: shortest first, the first items' pace would promise the long ones far too soon."""
    import torch

    from labelrl.evaluate.score import score_labels, scoring_weights, split_prefix
    from labelrl.progress import Counter

    dtype = dtype or torch.float32
    fast = scoring_weights(model, dtype) if prompts else None  # gathered once for every batch
    past = split_prefix(model, prompts, fast)  # the prompts' shared prefix, run once for every batch
    batch_size = max(batch_size, FAST_SCORE_ROWS) if fast is not None else batch_size
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = torch.zeros((len(prompts), labels.k))
    batches: list[list[int]] = []
    for i in order:  # ascending length: the prompt added is the batch's longest
        if not batches or len(batches[-1]) == batch_size or (len(batches[-1]) + 1) * len(prompts[i]) > SCORE_BATCH_POSITIONS:
            batches.append([])
        batches[-1].append(i)
    cost = [len(rows) * max(1, len(prompts[rows[-1]])) for rows in batches]  # rows padded to the longest
    with Counter(len(prompts), description, plain=plain, work=sum(cost) or None) as count:
        for rows, work in zip(batches, cost):
            out[rows] = score_labels(model, tokenizer, [prompts[i] for i in rows], labels, batch_size=batch_size,
                                     dtype=dtype, fast=fast, past=past).to(out.dtype)
            count.advance(len(rows), work=work)
    return out


def _describe(setup: EvalSetup, what: str) -> str:
    """``scoring holdout of vader-tweets``: the phase as the progress display names it."""
    data = setup.data
    return f"{what} {data.split} of {Path(str(data.options.data)).name}"


def _dtype(setup: EvalSetup):
    import torch

    return setup.dtype if setup.dtype is not None else torch.float32


def _score(setup: EvalSetup, prompts: list[list[int]], batch_size: int) -> tuple[list, list, object]:
    probs = score_counted(setup.model, setup.tokenizer, prompts, setup.data.labels, batch_size=batch_size,
                          description=_describe(setup, "scoring"), dtype=_dtype(setup)).double().numpy()
    names = setup.data.labels.labels
    return [names[i] for i in probs.argmax(axis=1)], ["ok"] * len(prompts), probs


def default_max_new_tokens(tokenizer, labels: LabelSpace, mode: str) -> int:
    """Direct: the longest ``<answer>LABEL</answer>`` in tokens plus 8 spare; reasoning: 256."""
    if mode == "reasoning":
        return REASONING_MAX_NEW_TOKENS
    return longest_answer(tokenizer, labels)[0] + 8


def generation_cap(setup: EvalSetup, max_new_tokens: int | None) -> int:
    """The token cap of a generated answer (``answer_tokens``)."""
    return answer_tokens(setup.tokenizer, setup.data.labels, setup.data.options.mode, "generate", max_new_tokens)


def _generate(setup: EvalSetup, prompts: list[list[int]], batch_size: int, max_new_tokens: int | None) -> tuple[list, list, None]:
    from labelrl.progress import Counter
    from labelrl.rewards import parse_answer
    from labelrl.rollout import BACKENDS

    sampler, tok, data = BACKENDS.get("labelrl"), setup.tokenizer, setup.data
    cap = generation_cap(setup, max_new_tokens)
    pad = pad_id(tok)
    preds, statuses = [], []
    with Counter(len(prompts), _describe(setup, "generating answers for")) as count:
        for start in range(0, len(prompts), batch_size):
            batch = sampler(setup.model, prompts[start : start + batch_size], group_size=1, max_new_tokens=cap,
                            eos_token_ids=tok.eos_token_id, pad_token_id=pad, temperature=0.0, dtype=_dtype(setup))
            for ids, truncated in zip(batch.completion_ids, batch.truncated):
                text = tok.decode(ids, skip_special_tokens=True)
                parsed = parse_answer(text, reasoning=data.options.mode == "reasoning", labels=data.labels, truncated=truncated)
                preds.append(parsed.answer)
                statuses.append(parsed.status.value)
            count.advance(len(batch.completion_ids))
    return preds, statuses, None


def run_predictions(
    setup: EvalSetup, *, method: str | None = None, batch_size: int = 16, max_new_tokens: int | None = None
) -> Predictions:
    """Predict every example of ``setup.data``; ``method`` None means scores for direct
    models and generate for reasoning ones."""
    mode = setup.data.options.mode
    method = method or ("scores" if mode == "direct" else "generate")
    if method not in METHODS:
        raise ValueError(f"method={method!r}: choose 'scores' (label-token probabilities) or 'generate' (greedy decoding)")
    if method == "scores" and mode == "reasoning":
        raise ValueError("method='scores' reads the label right after the prompt, but this model reasons first (mode 'reasoning'); use --method generate")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: need at least 1 prompt per batch")
    started = time.perf_counter()
    examples, prompts, long_items = fit_to_context(setup, method, max_new_tokens)
    if method == "scores":
        preds, statuses, probs = _score(setup, prompts, batch_size)
    else:
        preds, statuses, probs = _generate(setup, prompts, batch_size, max_new_tokens)
    data = setup.data
    table = predictions_table([ex.id for ex in examples], [ex.label for ex in examples],
                              preds, statuses, data.labels, probs)
    info = {
        "model_spec": setup.model_spec, "model_fingerprint": setup.model_fingerprint, "method": method,
        "mode": mode, "split": data.split, "split_fingerprint": data.split_fingerprint,
        "splits_dir": str(data.splits_dir), "data": data.options.data, "label_col": data.label_col,
        "holdout_fingerprint": data.holdout_fingerprint,
        "max_new_tokens": generation_cap(setup, max_new_tokens) if method == "generate" else None,
        "n": len(examples), "seconds": round(time.perf_counter() - started, 3), "long_items": long_items.record(),
        "precision": precision_name(_dtype(setup)),
    }
    return Predictions(table, data.labels, info)


def predict(
    model_spec_or_run_dir: str,
    data_options: DataOptions | None,
    split: str,
    *,
    method: str | None = None,
    label_col: str | None = None,
    limit: int | None = None,
    splits_dir: str | Path | None = None,
    batch_size: int = 16,
    max_new_tokens: int | None = None,
    precision: str = "fp32",
) -> Predictions:
    """``prepare`` then ``run_predictions``: the predictions table of one model on one split.

    This does not consult the holdout ledger; ``labelrl eval`` (``run_eval``) does.
    """
    setup = prepare(model_spec_or_run_dir, data_options, split, splits_dir=splits_dir, label_col=label_col, limit=limit,
                    precision=precision)
    return run_predictions(setup, method=method, batch_size=batch_size, max_new_tokens=max_new_tokens)


@dataclass
class EvalResult:
    """One evaluation: its predictions, metrics and ledger record."""

    predictions: Predictions
    metrics: dict
    record: dict
    repeat: bool


def evaluate_split(
    setup: EvalSetup,
    *,
    method: str | None = None,
    allow_repeat_holdout: bool = False,
    n_boot: int = 1000,
    seed: int = 0,
    batch_size: int = 16,
    max_new_tokens: int | None = None,
    record_extra: dict | None = None,
) -> EvalResult:
    """Predict, score and record one evaluation, honouring the holdout ledger.

    A model has one look per holdout (same splits, or the same holdout content in another
    splits directory; ``labelrl.evaluate.ledger.plan_holdout``): the first evaluation is the
    look, one by another method is recorded as a reading of that look, and one by a method
    already read is refused (ValueError, before anything is predicted) unless
    ``allow_repeat_holdout``, then recorded with ``repeat: true``. Every evaluation (val too) is
    appended to the ledger, with ``record_extra`` (e.g. the paths of the files it is written to).
    """
    from labelrl.evaluate import ledger
    from labelrl.evaluate.metrics import classification_metrics

    data = setup.data
    repeat, look = False, None
    method = method or ("scores" if data.options.mode == "direct" else "generate")
    if data.split == ledger.HOLDOUT:
        repeat, look = ledger.plan_holdout(data.splits_dir, setup.model_fingerprint, data.split_fingerprint,
                                           allow_repeat=allow_repeat_holdout, holdout_fp=data.holdout_fingerprint,
                                           method=method)
    pred = run_predictions(setup, method=method, batch_size=batch_size, max_new_tokens=max_new_tokens)
    metrics = classification_metrics(pred.y_true, pred.y_pred, pred.labels, scores=pred.scores(), n_boot=n_boot, seed=seed)
    statuses = pred.table.column("parse_status").to_pylist()
    metrics["n_truncated"] = sum(s == "truncated" for s in statuses)
    metrics["max_new_tokens"] = pred.info["max_new_tokens"]
    pred.info["repeat"] = repeat
    if data.split == "train":  # scores of the training items (difficulty): never a look, never recorded
        return EvalResult(pred, metrics, {}, repeat)
    extra = {k: pred.info[k] for k in ("method", "label_col", "data", "n")} | (record_extra or {})
    record = ledger.record_evaluation(
        data.splits_dir, split=data.split, model_spec=setup.model_spec, model_fingerprint=setup.model_fingerprint,
        split_fingerprint=data.split_fingerprint, metrics=metrics, repeat=repeat, extra=extra,
        holdout_fp=data.holdout_fingerprint, reading_of=look,
    )
    return EvalResult(pred, metrics, record, repeat)
