"""The suite itself: no test compares a call's result with a second, identical call.

A pure function called twice with the same arguments agrees with itself whatever it
computes, so ``assert f(x) == f(x)`` (or ``a = f(x); b = f(x); assert a == b``) passes against
any implementation. Determinism is two runs compared: another process (the
``fresh_process`` fixture), fresh objects, or a value pinned by hand (DESIGN.md, habit 11).

The check reads every test module's syntax tree and flags an equality (``==``, ``pytest.approx``,
``torch.equal``, ``assert_close``, ``assert_allclose``, ``assert_same_*``, ``.equals`` …) whose two sides are
the same call expression, directly or through names each bound once to that expression. A
flagged comparison is allowed only when state changed between the two calls (a file was
written, the global RNG was reseeded, …): ``STATEFUL`` lists each one with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# Functions whose first two arguments are asserted equal (or close).
EQUALITY_CALLS = {"equal", "assert_close", "assert_allclose", "assert_array_equal", "assert_equal", "allclose"}

# (test file, comparison as ast.unparse writes it) → what changed between the two calls.
STATEFUL = {
    ("evaluate/test_score_fast.py", "torch.allclose(fast, module, atol=1e-05)"):
        "scoring_weights was patched to refuse the model in between: the same call then runs the module pass",
    ("train/test_reference.py", "torch.equal(_logits(model, ids), start)"):
        "the adapter was moved after `start` was taken; inside reference.active the starting weights are back",
    ("train/test_reference.py", "torch.equal(_logits(model, ids), moved)"):
        "reference.active swapped the weights in and out in between; the trained ones must be back bit for bit",
    ("data/test_split.py", "load_or_make_splits(ds, tmp_path, seed=0) == first"):
        "the first call wrote splits.json; the second must read it (make_splits is patched to fail)",
    ("distill/test_teacher.py", "paths.out.read_text() == before"):
        "run_distill ran again between the two reads of its output file",
    ("models/test_cache.py", "cache.file_identity(path, head_bytes=10) == first"):
        "the file was rewritten (beyond the hashed head) between the calls",
    ("models/test_load.py", "torch.equal(torch.get_rng_state(), state)"):
        "load_model ran in between; the global RNG state must be as it was",
    ("models/test_families.py", "torch.equal(torch.get_rng_state(), state)"):
        "build_tiny ran in between; the global RNG state must be as it was",
    ("models/test_load.py", "model_fingerprint(model) == base"):
        "a weight was changed and restored in between",
    ("report/test_figures.py", "set(plt.get_fignums()) == before"):
        "a figure was drawn in between; none may be left open",
    ("rollout/test_hf.py", "torch.equal(torch.get_rng_state(), state)"):
        "sampling ran in between; the global RNG state must be as it was",
    ("ladder/test_derived.py", "len(read_ledger(task)) == lines"):
        "the threshold arm was evaluated again in between; a rerun must read its records back, not append",
    ("rollout/test_fused.py", "assert_same_samples(first, second, atol=0)"):
        "the first call packed the weights into the cache; the second decodes from the cached copy",
    ("rollout/test_fused.py", "assert_same_samples(run(wrapped), first)"):
        "the adapter was merged and unmerged in between; the packed weights must be rebuilt to the unmerged ones",
    ("train/test_memory.py", "saved_bytes_of_training_forward(model, 300) == plain"):
        "gradient checkpointing was switched on and off in between; off must save what it saved before",
    ("train/test_memory.py", "probe(first) == measured"):
        "the second call is answered from the per-process memo (the call count beside it shows no forward "
        "ran); a model with other weights is then measured afresh and must give the same bytes",
}


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def self_comparisons(source: str) -> list[str]:
    """Equalities in ``source`` whose two sides are the same call (see the module docstring)."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        bound: dict[str, list[str]] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
                pairs = [(target, value)]
                if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                    pairs = list(zip(target.elts, value.elts))
                for name, expr in pairs:
                    if isinstance(name, ast.Name):
                        bound.setdefault(name.id, []).append(ast.dump(expr))

        def call_of(expr: ast.expr) -> str | None:
            if isinstance(expr, ast.Call) and _call_name(expr) == "approx" and expr.args:
                expr = expr.args[0]  # pytest.approx(f(x)) compares with f(x)
            if isinstance(expr, ast.Name) and len(bound.get(expr.id, [])) == 1:
                (dumped,) = bound[expr.id]
                return dumped if dumped.startswith("Call(") else None
            return ast.dump(expr) if any(isinstance(n, ast.Call) for n in ast.walk(expr)) else None

        for node in ast.walk(function):
            sides = []
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
                sides.append((node.left, node.comparators[0]))
            if isinstance(node, ast.Call) and len(node.args) >= 2:
                name = _call_name(node)
                if name in EQUALITY_CALLS or name.startswith("assert_same"):
                    sides.append((node.args[0], node.args[1]))
            if isinstance(node, ast.Call) and _call_name(node) == "equals" and len(node.args) == 1 \
                    and isinstance(node.func, ast.Attribute):
                sides.append((node.func.value, node.args[0]))  # table.equals(other)
            for left, right in sides:
                key = call_of(left)
                if key is not None and key == call_of(right):
                    found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("source, flagged", [
    ("def test():\n    assert f(1) == f(1)", ["f(1) == f(1)"]),
    ("def test():\n    a = f(1)\n    b = f(1)\n    assert a == b", ["a == b"]),
    ("def test():\n    a, b = f(x), f(x)\n    torch.testing.assert_close(a, b)", ["torch.testing.assert_close(a, b)"]),
    ("def test():\n    assert_same_weights(load(d), load(d))", ["assert_same_weights(load(d), load(d))"]),
    ("def test():\n    assert read(d).equals(read(d))", ["read(d).equals(read(d))"]),
    ("def test():\n    a = f(1)\n    assert a == pytest.approx(f(1))", ["a == pytest.approx(f(1))"]),
    # not flagged: other arguments, an inequality, a value pinned by hand, a name bound twice
    ("def test():\n    assert f(1) == f(2) and f(1) != f(1)", []),
    ("def test():\n    assert step_seed(0, 5, 1) == 5046", []),
    ("def test():\n    assert read(a).equals(read(b)) and f(1) == pytest.approx(0.5)", []),
    ("def test():\n    a = f(1)\n    a = g(a)\n    assert a == f(1)", []),
])
def test_the_audit_flags_self_comparisons_and_nothing_else(source, flagged):
    assert self_comparisons(source) == flagged


def test_no_test_compares_a_call_with_the_same_call():
    found = {
        (str(path.relative_to(TESTS)), comparison)
        for path in sorted(TESTS.rglob("*.py"))
        for comparison in self_comparisons(path.read_text(encoding="utf-8"))
    }
    unexplained = sorted(found - STATEFUL.keys())
    assert not unexplained, (
        "these compare a call with the same call, which passes whatever the code computes; compare two "
        f"runs (fresh_process, fresh objects) or a value pinned by hand, or list real state changes in STATEFUL: {unexplained}"
    )
    stale = sorted(STATEFUL.keys() - found)
    assert not stale, f"STATEFUL lists comparisons that no longer exist; remove them: {stale}"


def test_a_fresh_process_sees_what_one_process_cannot(fresh_process):
    # The helper the determinism tests use would catch a draw keyed on hash() of a string:
    # equal within one process, different in the next (another hash seed).
    assert fresh_process(hash, "item-17") != hash("item-17")
    assert fresh_process(sorted, ["b", "a"]) == ["a", "b"]
