"""RL learning-rate sweep: one SFT parent, one GRPO run per learning rate, judged on val.

    .venv/bin/python benchmarks/rl_lr_sweep.py --out runs/lr-sweep [--task spam|movies]
        [--lrs 1e-6 3e-6 1e-5 3e-5 1e-4] [--full] [--steps 24] [--json OUT]

A ladder (labelrl.ladder) with the demo's SFT parent and shape (SmolLM2-135M-Instruct, LoRA
r=16 unless ``--full``, 4 prompts × G=4 per step, 12 new tokens) and one GRPO arm per learning
rate, all from the same SFT model on the same samples. Per rate it prints what the choice of a
default rests on, all on val (the holdout looks the ladder takes are not used here):

- ``val BA``: balanced accuracy of the label-token scores (the ladder's val metric);
- ``top share``: the share of val items given the most frequent answer (1.0: a constant
  predictor) and that answer;
- ``collapsed``: the run's collapse flag (labelrl.train.collapse), from its rollouts;
- ``reward``: mean rollout reward of the first and last 4 steps; ``s/step``: median step time.

The machine and its load are printed first: step times are comparable within one invocation only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import busy_note, cpu_line  # noqa: E402

TASKS = {
    "spam": {"data": "sms-spam", "limit": 320, "sft": {"learning_rate": 1.0e-4}},
    "movies": {"data": "vader-movies", "limit": 320, "rubric": "rubrics/sentiment5.md", "sft": {"learning_rate": 3.0e-4},
               "success_threshold": 1.0},
}


def sweep_recipe(task: str, lrs: list[float], *, full: bool, steps: int, sft_steps: int) -> dict:
    spec = dict(TASKS[task])
    sft_options = {"max_steps": sft_steps, "batch_size": 8, "eval_every": sft_steps, **spec.pop("sft")}
    arms = {"sft": {"type": "sft"}} | {arm_name(lr, full): {"type": "rl", "from": "sft", "preset": "grpo",
                                                             "learning_rate": lr, "lora": not full} for lr in lrs}
    return {
        "version": 1, "name": f"lr-sweep-{task}", "model": "smollm2-135m-instruct", "seed": 0,
        "defaults": {"sft": sft_options,
                     "rl": {"steps": steps, "group_size": 4, "prompts_per_step": 4, "max_new_tokens": 12,
                            "checkpoint_every": steps}},
        "tasks": {task: {**spec, "eval_limit": 64, "holdout_limit": 32, "n_boot": 200, "generate_eval": False,
                         "arms": arms}},
    }


def arm_name(lr: float, full: bool) -> str:
    """``lr3e-6`` (LoRA) or ``full-lr3e-6``: both kinds can share one run directory and its SFT parent."""
    return ("full-" if full else "") + f"lr{lr:.0e}".replace("-0", "-").replace("+0", "")


def summarise(run_dir: Path, task: str, lrs: list[float], full: bool) -> list[dict]:
    from labelrl import metrics_keys as K
    from labelrl.evaluate.io import read_predictions
    from labelrl.fileio import read_jsonl

    state = json.loads((run_dir / "ladder.json").read_text(encoding="utf-8"))["tasks"][task]["arms"]
    rows = []
    for name, lr in [("sft", None)] + [(arm_name(lr, full), lr) for lr in lrs]:
        st = state.get(name, {})
        row = {"arm": name, "learning_rate": lr, "status": st.get("status"),
               "val_ba": (st.get("val") or {}).get("balanced_accuracy")}
        val = run_dir / task / "eval" / f"{name}-val.parquet"
        if val.is_file():
            answers = Counter(read_predictions(val).y_pred)
            top, count = answers.most_common(1)[0]
            row.update(top_answer=top, top_share=count / sum(answers.values()))
        if lr is not None and (run_dir / task / name / "metrics.jsonl").is_file():
            records = read_jsonl(run_dir / task / name / "metrics.jsonl")
            rewards = [r[K.REWARD_MEAN] for r in records]
            summary = json.loads((run_dir / task / name / "rl_summary.json").read_text(encoding="utf-8"))
            row.update(reward_first=statistics.mean(rewards[:4]), reward_last=statistics.mean(rewards[-4:]),
                       step_seconds=statistics.median(r[K.STEP_SECONDS] for r in records),
                       collapse=summary.get("collapse", "unknown"))
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'arm':>13} {'lr':>8} {'val BA':>7} {'top share':>14} {'collapsed':>22} {'reward':>13} {'s/step':>7}")
    for r in rows:
        collapse = r.get("collapse")
        flag = (f"{collapse['label']} at step {collapse['step']}" if isinstance(collapse, dict)
                else collapse if isinstance(collapse, str) else "no" if "collapse" in r else "")
        lr = f"{r['learning_rate']:.0e}" if r["learning_rate"] else "—"
        share = f"{r['top_share']:.2f} ({r['top_answer']})" if "top_share" in r else ""
        reward = f"{r['reward_first']:.2f} → {r['reward_last']:.2f}" if "reward_first" in r else ""
        ba = f"{r['val_ba']:.3f}" if r["val_ba"] is not None else r["status"] or ""
        step = f"{r['step_seconds']:.1f}" if "step_seconds" in r else ""
        print(f"{r['arm']:>13} {lr:>8} {ba:>7} {share:>14} {flag:>22} {reward:>13} {step:>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="run directory (finished arms are kept on a re-run)")
    parser.add_argument("--task", choices=sorted(TASKS), default="spam")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 3e-6, 1e-5, 3e-5, 1e-4])
    parser.add_argument("--full", action="store_true", help="full fine-tuning RL (the SFT parent keeps LoRA, merged)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--sft-steps", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from rich.console import Console

    from labelrl.ladder.recipe import recipe_from_dict
    from labelrl.ladder.run import Ladder
    from labelrl.recipes import __file__ as recipes_init

    print(cpu_line())
    print(busy_note())
    raw = sweep_recipe(args.task, args.lrs, full=args.full, steps=args.steps, sft_steps=args.sft_steps)
    recipe = recipe_from_dict(raw, "lr sweep", Path(recipes_init).parent)
    Ladder(recipe, args.out, Console(quiet=True)).run()
    rows = summarise(args.out.resolve(), args.task, args.lrs, args.full)
    print(f"{args.task}: GRPO from one SFT parent, {'full fine-tuning' if args.full else 'LoRA r=16'}, {args.steps} steps")
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"task": args.task, "full": args.full, "steps": args.steps, "cpu": cpu_line(),
                                         "rows": rows}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
