"""``labelrl ladder --data FILE``: a recipe built for the data's label kind, so "here is my file,
tell me whether RL helps" needs no YAML.

One task on the file, with its label audit, and these arms:

* ``sft``: direct SFT, the baseline every RL arm must beat;
* ``grpo`` and ``dr_grpo`` from it (GRPO's std division against none);
* ordinal labels (partial credit): also ``corpo`` from it, τ = the credit of an answer one grade
  off, 1 − 1/(K − 1), so only exact grades are reinforced; Dr. GRPO vs CoRPO changes one knob;
* ``threshold``: SFT with the decision rule chosen on val, the baseline an RL arm must beat to
  have bought more than a moved operating point.

**A matched tuning budget.** A budget's ``tune`` (or the ``tune`` argument) gives every SFT arm
(``defaults.sft.tune``) and every RL arm (``defaults.rl.tune``) a grid (``labelrl.ladder.tune``):
each arm trains one candidate per grid point and keeps the best on val. The SFT and the RL grids
must have the same number of candidates (their values may differ: a learning rate that suits SFT
need not suit RL), so no family gets more tries at val than another. ``cpu`` gives each two
learning rates, ``gpu`` three; ``smoke`` none (the plumbing, not an answer).

``--budget`` sets the scale: ``smoke`` (tiny-random unless ``--model``, a few steps: the plumbing
on any file in minutes), ``cpu`` (SmolLM2-135M with LoRA, measured as the demo is: three seeds,
512-item val and holdout samples; a real run on a 2-core CPU), ``gpu`` (a local model you name,
full epochs, G = 8, three seeds). RL's token cap holds the longest answer tag in the model's
tokens (``answer_tokens``), its end-of-text token and a few spare. The recipe is
written into the run directory as ``recipe.yaml``, to edit and run again with
``labelrl ladder RUN_DIR/recipe.yaml --out RUN_DIR``.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

BUDGETS = ("smoke", "cpu", "gpu")
ANSWER_SPARE = 3  # tokens past the longest answer and its end-of-text token

_SCALE = {
    "smoke": {
        "model": "tiny-random",
        "task": {"limit": 64, "eval_limit": 32, "holdout_limit": 64, "n_boot": 200},
        "sft": {"lora": False, "learning_rate": 3.0e-3, "max_steps": 8, "batch_size": 8, "eval_every": 8},
        "rl": {"lora": False, "learning_rate": 1.0e-3, "steps": 3, "group_size": 4, "prompts_per_step": 4,
               "max_new_tokens": 12, "checkpoint_every": 3},
        "tune": None,  # {"sft": {"learning_rate": [...]}, "rl": {"learning_rate": [...]}}: equal-sized grids
    },
    "cpu": {
        # Measured as the demo measures (recipes/demo.yaml): every trained arm on three seeds (tuned
        # on the first, the winner replicated), val and holdout samples of 512 items (a split's whole
        # when smaller: a verdict on 64 or 256 items flips on a rerun), label-token scores only, no
        # in-run SFT evaluation (the ladder scores each model on the whole val sample right after),
        # two runs side by side with one thread each (docs/performance.md, "Runs side by side").
        "model": "smollm2-135m-instruct",
        "workers": 2,
        # The 320 training items drawn label-balanced: a rare label keeps up to 320/K of its items
        # (all 49 of a 2% label, where its share kept 7, each then drawn about 23 times).
        "task": {"limit": 320, "train_sample": "balanced", "seeds": [0, 1, 2], "eval_limit": 512, "holdout_limit": 512,
                 "n_boot": 2000, "generate_eval": False},
        # label-balanced items and prompts: SFT's loss and RL's expected reward then weigh every
        # label as the verdict's balanced accuracy does (docs/algorithms.md, Prompt sampling)
        "sft": {"max_steps": 40, "batch_size": 8, "eval_every": 0, "prompt_sampling": "balanced"},
        # the RL path on val keeps 128 of the val items (step 12 scored; steps 0 and 24 read)
        "rl": {"steps": 24, "group_size": 4, "prompts_per_step": 4, "max_new_tokens": 12, "checkpoint_every": 12,
               "eval_limit": 128, "prompt_sampling": "balanced"},
        # Two tries each, chosen on val: around SFT's LoRA rate and RL's measured default (3e-6).
        # More than two labels need a faster start in the same 40 steps: the demo's 5-grade SFT
        # reached val BA 0.256 at 3e-4 and 0.371 at 1e-3, its binary one 0.879 at 1e-4.
        "tune": {"sft": {"learning_rate": [1.0e-4, 3.0e-4]}, "rl": {"learning_rate": [3.0e-6, 1.0e-5]}},
        "sft_tune_many_labels": {"learning_rate": [3.0e-4, 1.0e-3]},
    },
    "gpu": {
        "model": None,  # a local model directory: --model
        "task": {"n_boot": 2000, "seeds": [0, 1, 2]},
        "sft": {"epochs": 2, "batch_size": 16, "eval_every": 100, "eval_limit": 500, "prompt_sampling": "balanced"},
        "rl": {"steps": 300, "group_size": 8, "prompts_per_step": 16, "max_new_tokens": 16, "checkpoint_every": 25,
               "prompt_sampling": "balanced"},
        "tune": {"sft": {"learning_rate": [3.0e-5, 1.0e-4, 3.0e-4]}, "rl": {"learning_rate": [1.0e-6, 3.0e-6, 1.0e-5]}},
    },
}


def default_recipe(data: str | Path, *, kind: str, labels: list[str], budget: str = "smoke", model: str | None = None,
                   text_col: list[str] | None = None, label_col: str | None = None, label_list: str | None = None,
                   rubric: Path | None = None, name: str | None = None, data_options: dict | None = None,
                   tune: dict | None = None, answer_tokens: int | None = None, positive: str | None = None) -> dict:
    """The recipe (a plain dict, as YAML would give) for a dataset of ``kind`` with ``labels``;
    ``data_options`` (e.g. ``on_bad_row``, ``delimiter``) go to the task as they are; ``tune``
    (``{"sft": GRID, "rl": GRID}``, default: the budget's) the matched grids of the module docstring;
    ``answer_tokens``: the longest ``<answer>LABEL</answer>`` in the model's tokens
    (``labelrl.data.prompts.longest_answer``), which RL's token cap is raised to hold; ``positive``:
    a binary task's positive label (the task's ``positive_label``; default the second label)."""
    model = budget_model(budget, model)
    scale = copy.deepcopy(_SCALE[budget])
    if answer_tokens is not None:
        scale["rl"]["max_new_tokens"] = max(scale["rl"]["max_new_tokens"], answer_cap(answer_tokens))
    if len(labels) > 2 and "sft_tune_many_labels" in scale:
        scale["tune"]["sft"] = scale["sft_tune_many_labels"]
    if model is None:
        raise ValueError("--budget gpu: name the model to fine-tune with --model (a local Hugging Face directory; "
                         "labelrl never downloads one)")
    path = Path(data)
    source = str(path.resolve()) if path.exists() else str(data)  # a file, or a built-in dataset's name
    task: dict = {"data": source, **scale["task"]}
    for key, value in (("text_col", text_col), ("label_col", label_col), ("labels", label_list), ("kind", kind),
                       ("positive_label", positive)):
        if value:
            task[key] = value
    if rubric is not None:
        task["rubric"] = str(Path(rubric).resolve())
    task.update({k: v for k, v in (data_options or {}).items() if v is not None})
    task["arms"] = default_arms(kind, labels)
    stem = name or (path.stem if path.exists() else str(data))
    task_name = re.sub(r"[^A-Za-z0-9_-]+", "_", stem).strip("_") or "data"
    return {"version": 1, "name": stem, "description": f"The default ladder for {kind} labels ({', '.join(labels)}), "
            f"budget {budget}: direct SFT, GRPO, Dr. GRPO{', CoRPO' if kind == 'ordinal' else ''} and SFT + threshold.",
            "model": model, "seed": 0, **({"workers": scale["workers"]} if "workers" in scale else {}),
            "defaults": matched_tuning({"sft": scale["sft"], "rl": scale["rl"]},
                                       tune if tune is not None else scale["tune"]),
            "tasks": {task_name: task}}


# What --budget cpu's times rest on (docs/your-data.md, docs/performance.md): the demo's texts,
# sms-spam's and vader-movies', average 25 SmolLM2 tokens (24.9 and 24.5), and the 10–17 minutes
# were measured on files whose texts average about 25 and 65 (review snippets; tweets, one in
# twenty repeated forty times). Each item adds about 12 positions of its own to a pass (its
# answer tag, end of turn and the chat template's turn markers: the demo's SFT batches of 8
# computed 289–357 positions, the shared instructions, 63, once). Training cuts a prompt to 512
# tokens (--max-length, --max-prompt-length), of which the instructions take about 100; scoring
# reads each item whole. The demo's time on a 2-core CPU is about 2/3 training and 1/3 scoring
# (docs/performance.md, "The three-seed demo").
MEASURED_TEXT_TOKENS = 25
ITEM_POSITIONS = 12
TRAIN_TEXT_CAP = 512 - 100
TRAINING_SHARE = 2 / 3
LONG_NOTE_RATIO = 2.0  # below this the measured 10–17 minutes stand


def length_note(text_tokens: list[int], budget: str, task: str = "NAME") -> str | None:
    """For ``--budget cpu``: when the texts (their lengths in the model's tokens) are long enough
    that a ladder computes ``LONG_NOTE_RATIO``× or more the demo's token positions per item, how
    many times more, in training (texts cut to fit) and in scoring (texts whole), and what that
    makes of the measured time (``task``: the recipe's task name, for the options it names); else
    None. A pass's time grows about in proportion to its positions (a demo SFT step 1.9 s at one
    thread, one of 626-token texts 17–20 s beside another run: about the 8.7× its positions say);
    attention grows faster and a ladder's fixed costs not at all: an estimate, not a forecast."""
    if budget != "cpu" or not text_tokens:
        return None
    base = MEASURED_TEXT_TOKENS + ITEM_POSITIONS
    mean = sum(text_tokens) / len(text_tokens)
    train = (sum(min(n, TRAIN_TEXT_CAP) for n in text_tokens) / len(text_tokens) + ITEM_POSITIONS) / base
    score = (mean + ITEM_POSITIONS) / base
    ratio = TRAINING_SHARE * train + (1 - TRAINING_SHARE) * score
    if ratio < LONG_NOTE_RATIO:
        return None
    low, high = 10 * ratio, 17 * ratio  # minutes
    span = f"{low / 60:.0f}–{high / 60:.0f} hours" if low >= 120 else f"{low:.0f}–{high:.0f} minutes"
    return (f"long texts: they average {mean:,.0f} tokens, the demo's {MEASURED_TEXT_TOKENS}. Training computes about "
            f"{train:.1f}× the demo's token positions per item (prompts cut to 512 tokens) and scoring about "
            f"{score:.1f}× (items whole): expect roughly {ratio:.1f}× the 10–17 minutes --budget cpu took on texts "
            f"of 25–65 tokens, {span} on 2 cores. `labelrl data show` lists the lengths; fewer val and holdout "
            f"items (--set tasks.{task}.eval_limit=N, holdout_limit=N) shorten scoring at the cost of the "
            "verdict's power (`labelrl plan`).")


def answer_cap(answer_tokens: int) -> int:
    """RL's token cap for answers of at most ``answer_tokens`` tokens: the answer, the end-of-text
    token and ``ANSWER_SPARE`` more (a space or line break before the tag costs a token)."""
    return answer_tokens + 1 + ANSWER_SPARE


def budget_model(budget: str, model: str | None = None) -> str | None:
    """The model a ``budget`` fine-tunes: ``model`` if given, else the budget's (None for gpu)."""
    if budget not in BUDGETS:
        raise ValueError(f"--budget {budget!r}: choose one of {', '.join(BUDGETS)}")
    return model or _SCALE[budget]["model"]


def grid_size(grid: dict) -> int:
    """Candidates in a grid (every combination of its lists)."""
    return math.prod(len(values) for values in grid.values())


def matched_tuning(defaults: dict, tune: dict | None) -> dict:
    """``defaults`` with the SFT and RL grids of ``tune`` set as ``defaults.FAMILY.tune``, after
    checking that both are there and try as many candidates."""
    if not tune:
        return defaults
    missing = sorted({"sft", "rl"} - set(tune))
    if missing or set(tune) - {"sft", "rl"}:
        raise ValueError(f"tune {tune}: give one grid for sft and one for rl (missing: {', '.join(missing) or 'none'}), "
                         "e.g. {'sft': {'learning_rate': [...]}, 'rl': {'learning_rate': [...]}}")
    sizes = {family: grid_size(grid) for family, grid in tune.items()}
    if sizes["sft"] != sizes["rl"]:
        raise ValueError(f"tune: SFT tries {sizes['sft']} candidates and RL {sizes['rl']}; a matched tuning budget gives "
                         "both the same number of candidates (list as many values for each)")
    return {family: dict(options, tune=copy.deepcopy(tune[family])) for family, options in defaults.items()}


def default_arms(kind: str, labels: list[str]) -> dict:
    """The arms of the module docstring for this label kind."""
    arms: dict = {"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "sft", "preset": "grpo"},
                  "dr_grpo": {"type": "rl", "from": "sft", "preset": "dr_grpo"}}
    if kind == "ordinal" and len(labels) > 2:
        tau = round(1 - 1 / (len(labels) - 1), 6)  # partial credit of an answer one grade off
        arms["corpo"] = {"type": "rl", "from": "sft", "preset": "corpo", "threshold": tau}
    arms["threshold"] = {"type": "threshold", "from": "sft"}
    return arms
