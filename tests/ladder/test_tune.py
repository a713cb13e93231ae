"""A matched tuning budget in the ladder (labelrl.ladder.tune, tune_grid) on tiny-random: every
value of an arm's grid trains a candidate, the best on val becomes the arm, only it looks at the
holdout (once), its children start from it, the report and the console name every value tried,
a killed tuning resumes keeping what finished, replicates follow their first seed's choice, and
bad grids are refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from rich.console import Console

from labelrl.fileio import read_jsonl
from labelrl.ladder import Ladder, load_recipe, read_state
from labelrl.ladder.arms import LadderStopped
from labelrl.ladder.recipe import recipe_from_dict
from labelrl.ladder.tune import select, tie, tie_text

FRUIT, THINGS = ["grape", "mango", "apple"], ["chair", "table", "stone"]
SFT_GRID = [1.0e-6, 3.0e-3]  # a rate that barely moves the weights, and one that trains
RL_GRID = [1.0e-3, 1.0e-5]


def toy_rows(n: int = 60) -> list[dict]:
    words = FRUIT + THINGS
    return [{"id": f"t{i}", "text": f"item {i}: {words[i % 6]}", "label": "yes" if words[i % 6] in FRUIT else "no"}
            for i in range(n)]


def toy_recipe(data: Path, arms: dict, **task) -> dict:
    return {
        "version": 1, "name": "tune", "model": "tiny-random",
        "defaults": {
            "sft": {"lora": False, "learning_rate": 3e-3, "max_steps": 2, "batch_size": 4, "eval_every": 2, "eval_limit": 4,
                    "quiet": True},
            "rl": {"lora": False, "learning_rate": 1e-3, "steps": 1, "group_size": 2, "prompts_per_step": 2,
                   "max_new_tokens": 8, "checkpoint_every": 1, "quiet": True, "tune": {"learning_rate": RL_GRID}},
        },
        "tasks": {"toy": {"data": str(data), "limit": 12, "eval_limit": 8, "holdout_limit": 8, "n_boot": 20,
                          "generate_eval": False, "arms": arms, **task}},
    }


def write_recipe(root: Path, raw: dict, name: str = "recipe.yaml") -> Path:
    path = root / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def write_data(root: Path) -> Path:
    data = root / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in toy_rows()), encoding="utf-8")
    return data


# A random-reward RL arm: tiny-random's answers are all wrong, so a graded RL step would have no
# informative group and never move the weights; random rewards do move them, so its two
# candidates are two different models.
ARMS = {"sft": {"type": "sft", "tune": {"learning_rate": SFT_GRID}},  # the arm's own grid
        "noise": {"type": "random_reward", "from": "sft", "prompts_per_step": 4},  # the rl defaults' grid
        "threshold": {"type": "threshold", "from": "sft"},
        # the first value fails at run time (every prompt is longer than 16 tokens): the second must win
        "sft_len": {"type": "sft", "learning_rate": 2e-3, "tune": {"max_length": [16, 256]}}}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    recipe = write_recipe(root, toy_recipe(write_data(root), ARMS))
    state = Ladder(load_recipe(recipe), root / "run", Console(quiet=True)).run()
    return root / "run", recipe, state


def val_fingerprint(run_dir: Path, candidate: dict) -> str:
    """The model fingerprint of a candidate's val evaluation."""
    report = run_dir / f"{candidate['dir']}-val.json"
    return json.loads(report.read_text())["info"]["model_fingerprint"]


def test_select_takes_the_highest_val_score():
    done = lambda ba: {"status": "done", "val": {"balanced_accuracy": ba}}  # noqa: E731
    # catches "always the first" (0.6 < 0.7) and "always the last" (0.7 > 0.65)
    assert select([done(0.6), done(0.7), done(0.65)]) == 1
    assert tie([done(0.6), done(0.7), done(0.65)]) is None
    # a failed candidate is never chosen, whatever it recorded; nor a non-finite score
    failed = {"status": "failed", "val": {"balanced_accuracy": 0.9}, "error": "boom"}
    assert select([done(float("nan")), failed, done(0.55)]) == 2
    assert select([failed]) is None


def test_a_tie_on_val_is_reported_and_broken_by_the_ranking_not_by_order():
    # lr 3e-6 and 1e-5 both reach val BA 0.391 (as GRPO's two rates did in a demo run); the second
    # ranks the items better (ROC-AUC 0.90 vs 0.85), so it wins — "the first listed" would take 3e-6.
    rec = lambda lr, ba, **m: {"status": "done", "values": {"learning_rate": lr},  # noqa: E731
                               "val": {"balanced_accuracy": ba, **m}}
    records = [rec(3e-6, 0.391, roc_auc=0.85, accuracy=0.8), rec(1e-5, 0.391, roc_auc=0.90, accuracy=0.7)]
    found = tie(records)
    assert found["candidates"] == [0, 1] and found["broken_by"] == "roc_auc"
    assert select(records) == 1
    assert tie_text(records, found) == ("tie on val balanced accuracy 0.391 (learning_rate=3e-06, learning_rate=1e-05): "
                                        "broken by val roc_auc (0.850 vs 0.900)")
    # ordinal labels (no ROC-AUC): the lower mean grade error breaks it
    records = [rec(3e-6, 0.4, mean_abs_grade_error=0.9), rec(1e-5, 0.4, mean_abs_grade_error=0.8)]
    assert select(records) == 1 and tie(records)["broken_by"] == "mean_abs_grade_error"
    # nothing separates them: the first listed is kept, and the words say so
    records = [rec(3e-6, 0.4, accuracy=0.5), rec(1e-5, 0.4, accuracy=0.5)]
    assert select(records) == 0
    assert tie_text(records, tie(records)).endswith("no val metric separates them, the first listed kept")


@pytest.mark.parametrize("arm", ["sft", "noise"])
def test_every_value_trains_a_candidate_and_the_best_on_val_becomes_the_arm(tuned, arm):
    run_dir, _, state = tuned
    st = state["tasks"]["toy"]["arms"][arm]
    assert st["status"] == "done", st.get("error")
    tune = st["tune"]
    grid = SFT_GRID if arm == "sft" else RL_GRID
    assert tune["grid"] == {"learning_rate": grid} and [c["values"]["learning_rate"] for c in tune["candidates"]] == grid
    assert all(c["status"] == "done" and (run_dir / c["dir"] / "model").is_dir() for c in tune["candidates"])
    scores = [c["val"]["balanced_accuracy"] for c in tune["candidates"]]
    winner = tune["candidates"][select(tune["candidates"])]  # the best on val (a tie broken as tune.tie says)
    assert winner["val"]["balanced_accuracy"] == max(scores)
    assert tune["chosen"] == winner["values"] and st["config"]["learning_rate"] == winner["values"]["learning_rate"]
    # the arm's holdout predictions come from the winner's weights, not the loser's (they differ: other rate)
    loser = next(c for c in tune["candidates"] if c is not winner)
    holdout = json.loads((run_dir / "toy" / "eval" / f"{arm}-holdout.json").read_text())
    assert holdout["info"]["model_fingerprint"] == val_fingerprint(run_dir, winner) != val_fingerprint(run_dir, loser)
    # the arm's val figures are the winner's (the same model, the same items)
    assert st["val"]["balanced_accuracy"] == winner["val"]["balanced_accuracy"]
    if arm == "noise":  # each RL candidate's path on val ends at its own val scores, and the arm keeps the winner's
        for c in tune["candidates"]:
            run = run_dir / c["dir"]
            last = json.loads((run / "val_path.jsonl").read_text().splitlines()[-1])
            assert Path(last["read_from"]).resolve() == (run.parent / f"{run.name}-val.parquet").resolve(), c["dir"]
        arm_path = (run_dir / "toy" / arm / "val_path.jsonl").read_text()
        assert arm_path == (run_dir / winner["dir"] / "val_path.jsonl").read_text()


@pytest.mark.parametrize("arm", ["sft", "noise"])
def test_each_candidates_val_score_is_recomputed_from_its_predictions_and_the_argmax_wins(tuned, arm):
    # The winner is not taken on the implementation's word: each candidate's val balanced accuracy is
    # recomputed here from its val predictions file (an unparsed answer is wrong), by scikit-learn
    # over the task's labels, and the chosen candidate must hold the highest (a tie: one of the tied).
    import pyarrow.parquet as pq
    from sklearn.metrics import recall_score

    run_dir, _, state = tuned
    tune = state["tasks"]["toy"]["arms"][arm]["tune"]
    recomputed = []
    for candidate in tune["candidates"]:
        table = pq.read_table(run_dir / f"{candidate['dir']}-val.parquet").to_pydict()
        truth = table["label"]
        pred = [p if p is not None else "<unparsed>" for p in table["prediction"]]
        # balanced accuracy = mean recall over the labels present in the truth
        ba = float(recall_score(truth, pred, labels=sorted(set(truth)), average="macro", zero_division=0))
        assert ba == pytest.approx(candidate["val"]["balanced_accuracy"], abs=1e-12), candidate["dir"]
        recomputed.append(ba)
    chosen = next(i for i, c in enumerate(tune["candidates"]) if c["values"] == tune["chosen"])
    assert recomputed[chosen] == max(recomputed)
    # the candidates are different models by construction (a rate that barely moves the weights
    # against one that trains): their val predictions or scores differ
    tables = [pq.read_table(run_dir / f"{c['dir']}-val.parquet").to_pydict() for c in tune["candidates"]]
    assert any(a != b for a, b in zip(tables[0].get("score", tables[0]["prediction"]),
                                      tables[1].get("score", tables[1]["prediction"])))


def test_a_failed_candidate_is_recorded_and_left_out(tuned):
    run_dir, _, state = tuned
    st = state["tasks"]["toy"]["arms"]["sft_len"]
    failed, ok = st["tune"]["candidates"]
    assert failed["status"] == "failed" and "max_length" in failed["error"].replace("--max-length", "max_length")
    assert (run_dir / failed["dir"] / "error.txt").read_text().startswith("Traceback")
    # catches a tuner that adopts the first candidate listed whatever happened to it
    assert st["status"] == "done" and st["tune"]["chosen"] == {"max_length": 256} == ok["values"]
    holdout = json.loads((run_dir / "toy" / "eval" / "sft_len-holdout.json").read_text())
    assert holdout["info"]["model_fingerprint"] == val_fingerprint(run_dir, ok)


def test_only_the_chosen_candidate_looks_at_the_holdout_and_once(tuned):
    run_dir, _, state = tuned
    task_dir = run_dir / "toy"
    ledger = read_jsonl(task_dir / "ledger.jsonl")
    holdout = [r for r in ledger if r["split"] == "holdout" and not r["derived"]]
    assert not [r for r in holdout if "/tune/" in r["model_spec"]]  # no candidate is scored on the holdout
    for arm in ("sft", "noise", "sft_len"):
        tune = state["tasks"]["toy"]["arms"][arm]["tune"]
        candidates = tune["candidates"]
        winner = next(c for c in candidates if c["values"] == tune["chosen"])
        looks = [r for r in holdout if Path(r["model_spec"]).parent == (task_dir / arm).resolve()]
        # catches an arm evaluated twice (e.g. once per candidate, through the arm's directory)
        assert len(looks) == 1 and not looks[0]["repeat"], looks
        assert looks[0]["model_fingerprint"] == val_fingerprint(run_dir, winner)
        candidates = [c for c in candidates if c["status"] == "done"]
        vals = [r for r in ledger if r["split"] == "val" and not r["derived"] and f"/{arm}/tune/" in r["model_spec"]]
        assert len(vals) == len(candidates)  # every candidate, losers included, scored on val
        assert all((run_dir / f"{c['dir']}-val.parquet").is_file() for c in candidates)
        # on the same val items as every arm
        ids = {frozenset(pq.read_table(run_dir / f"{c['dir']}-val.parquet").column("id").to_pylist()) for c in candidates}
        assert ids == {frozenset(pq.read_table(task_dir / "eval" / "sft-val.parquet").column("id").to_pylist())}


def test_children_start_from_the_winner(tuned):
    from labelrl.models import load_model, model_fingerprint
    from labelrl.models.prepare import resolve_model_spec

    run_dir, _, state = tuned
    arms = state["tasks"]["toy"]["arms"]
    sft = arms["sft"]["tune"]
    winner = next(c for c in sft["candidates"] if c["values"] == sft["chosen"])
    assert Path(arms["noise"]["config"]["model"]) == run_dir / "toy" / "sft"
    for c in arms["noise"]["tune"]["candidates"]:  # every RL candidate starts from the arm, i.e. the winner
        assert Path(yaml.safe_load((run_dir / c["dir"] / "rl_config.yaml").read_text())["model"]) == run_dir / "toy" / "sft"
    model, _ = load_model(resolve_model_spec(str(run_dir / "toy" / "sft")))
    assert model_fingerprint(model) == val_fingerprint(run_dir, winner)
    # the threshold arm derives from the arm's (the winner's) scores
    assert arms["threshold"]["status"] == "done" and arms["threshold"]["derived_from"] == "sft"


def test_report_and_console_name_every_value_tried(tuned, tmp_path):
    import shutil

    from labelrl.cli.ladder import comparison_tables
    from labelrl.report import build_report, collect_run

    run_dir, _, state = tuned
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("model", "checkpoints"))
    arm = next(a for a in collect_run(copy).tasks[0].arms if a.name == "sft")
    assert [c["values"]["learning_rate"] for c in arm.tune["candidates"]] == SFT_GRID
    md = build_report(copy).markdown.read_text()
    chosen = state["tasks"]["toy"]["arms"]["sft"]["tune"]["chosen"]["learning_rate"]
    for lr in SFT_GRID:  # each value tried is a row, the chosen one marked
        row = next(line for line in md.splitlines() if line.startswith(f"| sft | learning_rate={lr} |"))
        assert row.rstrip(" |").endswith("chosen") == (lr == chosen)
    assert (copy / "report" / "figures" / "toy-tuning.png").is_file()
    console = Console(record=True, width=400)
    for table in comparison_tables(state):
        console.print(table)
    assert f"sft: learning_rate={chosen} chosen on val" in console.export_text()


def test_a_changed_grid_is_refused_and_the_base_value_of_a_tuned_key_is_not_used(tuned, tmp_path):
    run_dir, recipe, _ = tuned
    raw = yaml.safe_load(recipe.read_text())
    raw["defaults"]["sft"]["learning_rate"] = 0.5  # every arm's base rate: replaced by the grid's, so no change
    Ladder(load_recipe(write_recipe(tmp_path, raw, "base.yaml")), run_dir, Console(quiet=True))
    raw["tasks"]["toy"]["arms"]["sft"]["tune"]["learning_rate"] = SFT_GRID[::-1]  # order decides ties: a change
    with pytest.raises(ValueError, match=r"tasks\.toy\.arms\.sft: finished .* with another config"):
        Ladder(load_recipe(write_recipe(tmp_path, raw, "grid.yaml")), run_dir, Console(quiet=True))


def test_a_killed_tuning_resumes_keeping_finished_candidates_and_replicates_follow_the_first_seed(tmp_path, monkeypatch):
    import labelrl.ladder.tune as tune_module

    raw = toy_recipe(write_data(tmp_path), {"sft": {"type": "sft", "tune": {"learning_rate": SFT_GRID}}}, seeds=[0, 1])
    recipe = write_recipe(tmp_path, raw)
    real, calls = tune_module.train_arm, []

    def killed_on_second(arm_type, cfg, task_dir, console):
        calls.append(Path(cfg.out).name)
        if len(calls) == 2:
            raise LadderStopped("killed")
        real(arm_type, cfg, task_dir, console)

    monkeypatch.setattr(tune_module, "train_arm", killed_on_second)
    with pytest.raises(LadderStopped):
        Ladder(load_recipe(recipe), tmp_path / "run", Console(quiet=True)).run()
    monkeypatch.setattr(tune_module, "train_arm", real)
    tune_dir = tmp_path / "run" / "toy" / "sft@s0" / "tune"
    first = tune_dir / f"learning_rate={SFT_GRID[0]}"
    kept = {p: p.stat().st_mtime_ns for p in [*first.rglob("*"), tune_dir / f"{first.name}-val.json"] if p.is_file()}
    assert (first / "sft_summary.json").is_file()
    assert read_state(tmp_path / "run")["tasks"]["toy"]["arms"]["sft@s0"]["status"] == "running"

    state = Ladder(load_recipe(recipe), tmp_path / "run", Console(quiet=True)).run()
    arms = state["tasks"]["toy"]["arms"]
    assert [p for p, t in kept.items() if p.stat().st_mtime_ns != t] == []  # the finished candidate was not redone
    assert arms["sft@s0"]["status"] == "done" and len(arms["sft@s0"]["tune"]["candidates"]) == 2
    chosen = arms["sft@s0"]["tune"]["chosen"]
    # the second seed trains once, with the first seed's choice, and waits for it
    assert arms["sft@s1"]["status"] == "done" and arms["sft@s1"]["tune"] == {"chosen": chosen, "selected_by": "sft@s0"}
    assert arms["sft@s1"]["config"]["learning_rate"] == chosen["learning_rate"] and arms["sft@s1"]["config"]["seed"] == 1
    assert "sft@s0" in arms["sft@s1"]["depends_on"] and not (tmp_path / "run" / "toy" / "sft@s1" / "tune").exists()

    # killed after the selection: the re-run keeps it (nothing relinked, no second holdout look)
    saved = read_state(tmp_path / "run")
    saved["tasks"]["toy"]["arms"]["sft@s0"]["status"] = "running"
    (tmp_path / "run" / "ladder.json").write_text(json.dumps(saved))
    # ctime: relinking the same files would change their link count, and so their ctime, not their mtime
    model = {p: p.stat().st_ctime_ns for p in [*(tmp_path / "run" / "toy" / "sft@s0" / "model").rglob("*"),
                                               tmp_path / "run" / "toy" / "eval" / "sft@s0-val.json"]}
    looks = [r for r in read_jsonl(tmp_path / "run" / "toy" / "ledger.jsonl") if r["split"] == "holdout"]
    again = Ladder(load_recipe(recipe), tmp_path / "run", Console(quiet=True)).run()
    assert again["tasks"]["toy"]["arms"]["sft@s0"]["status"] == "done"
    assert again["tasks"]["toy"]["arms"]["sft@s0"]["tune"]["chosen"] == chosen
    assert {p: p.stat().st_ctime_ns for p in model} == model
    assert [r for r in read_jsonl(tmp_path / "run" / "toy" / "ledger.jsonl") if r["split"] == "holdout"] == looks


def _ladder(tmp_path: Path, arms: dict, defaults: dict | None = None) -> Ladder:
    raw = toy_recipe(tmp_path / "toy.jsonl", arms)
    for family, options in (defaults or {}).items():
        raw["defaults"].setdefault(family, {}).update(options)
    return Ladder(recipe_from_dict(raw, "test", tmp_path), tmp_path / "run", Console(quiet=True))


@pytest.mark.parametrize(("arms", "defaults", "message"), [
    ({"sft": {"type": "sft", "tune": [1e-3]}}, None, r"arms\.sft\.tune: .* is not a mapping; write tune: \{learning_rate"),
    ({"sft": {"type": "sft", "tune": {"learning_rate": []}}}, None, r"arms\.sft\.tune\.learning_rate: .* at least one value"),
    ({"sft": {"type": "sft", "tune": {"learning_rate": 1e-3}}}, None, r"tune\.learning_rate: 0\.001: give a list"),
    ({"sft": {"type": "sft"}, "th": {"type": "threshold", "from": "sft", "tune": {"learning_rate": [1e-3]}}}, None,
     r"arms\.th\.tune: a threshold arm trains no model .*; drop tune"),
    ({"sft": {"type": "sft"}}, {"distill": {"tune": {"attempts": [1, 2]}}}, r"defaults\.distill\.tune: a distill arm"),
    ({"sft": {"type": "sft", "tune": {"learning_rat": [1e-3]}}}, None,
     r"arms\.sft\.tune\.learning_rat: not an option of a sft arm; .*labelrl sft --help"),
    ({"sft": {"type": "sft", "tune": {"seed": [0, 1]}}}, None, r"tune\.seed: .*seeds: \[\.\.\.\]"),
    ({"sft": {"type": "sft", "tune": {"limit": [8, 12]}}}, None, r"tune\.limit: the task's data"),
    ({"sft": {"type": "sft"}, "rl": {"type": "rl", "from": "sft", "tune": {"model": ["x"]}}}, None,
     r"arms\.rl\.tune\.model: set by the ladder"),
    ({"sft": {"type": "sft", "tune": {"learning_rate": [-1.0]}}}, None, r"tune\.learning_rate: -1\.0: .*greater than 0"),
    # "1e-3" is YAML text for the number 0.001: the same value twice
    ({"sft": {"type": "sft", "tune": {"learning_rate": ["1e-3", 0.001]}}}, None, r"0\.001 listed twice"),
])
def test_bad_grids_are_refused_before_anything_runs(tmp_path, arms, defaults, message):
    write_data(tmp_path)
    with pytest.raises(ValueError, match=message):
        _ladder(tmp_path, arms, defaults)
    assert not (tmp_path / "run").exists()


def test_grids_resolve_from_the_most_specific_scope(tmp_path):
    write_data(tmp_path)
    arms = {"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "sft"},
            "dr": {"type": "rl", "from": "sft", "preset": "dr_grpo", "tune": {"learning_rate": [0.1, 0.2, 0.3]}},
            "off": {"type": "rl", "from": "sft", "tune": {}}}
    grids = _ladder(tmp_path, arms).grids["toy"]
    assert grids["sft"] is None  # the recipe sets no sft grid
    assert grids["grpo"].grid == {"learning_rate": RL_GRID} and grids["grpo"].where == "defaults.rl.tune"
    assert grids["dr"].grid == {"learning_rate": [0.1, 0.2, 0.3]}  # the arm's own replaces the defaults' whole
    assert grids["off"] is None  # tune: {} turns it off
    both = _ladder(tmp_path, {"sft": {"type": "sft", "tune": {"learning_rate": [1e-4, 1e-3], "batch_size": [2, 4]}}})
    # every combination, the first key slowest (ties go to the first)
    assert [(c["learning_rate"], c["batch_size"]) for c in both.grids["toy"]["sft"].candidates] == [
        (1e-4, 2), (1e-4, 4), (1e-3, 2), (1e-3, 4)]


@pytest.mark.parametrize("kind,labels", [("binary", ["no", "yes"]), ("ordinal", ["1", "2", "3", "4", "5"])])
def test_the_default_recipe_gives_sft_and_every_rl_arm_grids_of_one_size(tmp_path, kind, labels):
    from labelrl.ladder.default_recipe import default_recipe
    from labelrl.ladder.tune_scope import resolve_tune

    data = write_data(tmp_path)
    tune = {"sft": {"learning_rate": [1e-5, 1e-4, 1e-3]}, "rl": {"learning_rate": [2e-6, 1e-5, 5e-5]}}
    recipe = recipe_from_dict(default_recipe(data, kind=kind, labels=labels, tune=tune), "test", tmp_path)
    task_name, task = next(iter(recipe.tasks.items()))
    grids = {name: resolve_tune(recipe.defaults, task_name, task, name) for name in task.arms}
    rl = [name for name, arm in task.arms.items() if arm.type == "rl"]
    assert len(rl) == (3 if kind == "ordinal" else 2)  # grpo, dr_grpo (and corpo)
    # every training arm tunes, on its family's grid, with as many candidates as SFT; threshold trains nothing
    assert grids["sft"][1] == tune["sft"] and all(grids[name][1] == tune["rl"] for name in rl)
    assert grids["threshold"] is None
    assert {len(grids[name][1]["learning_rate"]) for name in ["sft", *rl]} == {3}
    # the smoke budget (the default) tunes nothing; cpu and gpu give SFT and RL as many tries each
    plain = recipe_from_dict(default_recipe(data, kind=kind, labels=labels), "test", tmp_path)
    assert not any(resolve_tune(plain.defaults, task_name, next(iter(plain.tasks.values())), n) for n in task.arms)
    for budget, size in (("cpu", 2), ("gpu", 3)):
        real = recipe_from_dict(default_recipe(data, kind=kind, labels=labels, budget=budget, model="tiny-random"),
                                "test", tmp_path)
        real_name, real_task = next(iter(real.tasks.items()))
        first = [n for n, a in real_task.arms.items() if a.type in ("sft", "rl") and a.tuned_by is None]  # gpu: seed 0
        sizes = {n: len(resolve_tune(real.defaults, real_name, real_task, n)[1]["learning_rate"]) for n in first}
        assert len(first) == 1 + len(rl) and set(sizes.values()) == {size}, (budget, sizes)
    with pytest.raises(ValueError, match="SFT tries 3 candidates and RL 2"):
        default_recipe(data, kind=kind, labels=labels, tune={"sft": tune["sft"], "rl": {"learning_rate": [1e-5, 5e-5]}})
    with pytest.raises(ValueError, match="missing: rl"):
        default_recipe(data, kind=kind, labels=labels, tune={"sft": tune["sft"]})


def test_a_candidate_resolves_its_defaults_again_from_its_own_values():
    # A grid over the preset (or --lora, --max-new-tokens) must not carry the defaults the arm's
    # config resolved from its own preset: a dr_grpo candidate of a grpo arm divides by no std.
    from labelrl.train.config import RL_LR_FULL, RLConfig
    from labelrl.ladder.tune_grid import with_values

    arm = RLConfig(out="/tmp/unused", data="sms-spam")  # grpo: group scale, zero truncation, LoRA's rate
    assert (arm.scale, arm.truncation, arm.overlong_cache) == ("group", "zero", 6)
    dr = with_values(arm, {"preset": "dr_grpo"})
    assert dr.scale == "none"
    dapo = with_values(arm, {"preset": "dapo", "lora": False, "max_new_tokens": 100})
    assert (dapo.scale, dapo.truncation, dapo.learning_rate, dapo.overlong_cache) == ("group", "soft_penalty", RL_LR_FULL, 20)
    # what the user set stays set
    explicit = RLConfig(out="/tmp/unused", data="sms-spam", scale="batch", truncation="mask", learning_rate=1e-5)
    kept = with_values(explicit, {"preset": "dr_grpo"})
    assert (kept.scale, kept.truncation, kept.learning_rate) == ("batch", "mask", 1e-5)


def test_an_option_added_since_a_run_finished_matches_at_its_default_and_only_there():
    """A run recorded before an option existed computed what the option's default computes: it is
    kept when the recipe leaves the option at its default and refused when the recipe sets it
    (a ladder run before `train_sample` resumed with `train_sample: balanced` would otherwise
    reuse models trained on another sample)."""
    from labelrl.ladder.tune_grid import config_changes
    from labelrl.train.config import SFTConfig

    cfg = SFTConfig(model="tiny-random", data="sms-spam", out="/tmp/run/toy/sft", limit=320)
    before = {k: v for k, v in cfg.model_dump(mode="json").items() if k != "train_sample"}
    assert config_changes(cfg, None, {"config": before}) == []
    balanced = cfg.model_copy(update={"train_sample": "balanced"})
    assert config_changes(balanced, None, {"config": before}) == ["train_sample: (not recorded) → balanced"]
    # recorded with the option: every value compares as it is
    assert config_changes(balanced, None, {"config": balanced.model_dump(mode="json")}) == []
    assert config_changes(cfg, None, {"config": balanced.model_dump(mode="json")}) == ["train_sample: balanced → stratified"]
    # a changed value of an option the run did record is still a change
    assert config_changes(cfg.model_copy(update={"limit": 640}), None, {"config": before}) == ["limit: 320 → 640"]
