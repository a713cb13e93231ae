"""pass@k of sampled answers: does the model ever sample the right label in k tries?

RL on labels can only reinforce answers the policy samples. If the SFT model's pass@k is
already near 1, RL has the right answer to find on almost every item and can at most move
probability towards it; if RL raises pass@k itself, it found answers the SFT model could not
sample. For each item, n answers are sampled at temperature 1 and parsed strictly; with c of
them right, the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models
Trained on Code", eq. 1) is

    pass@k = 1 − C(n − c, k) / C(n, k),

computed as 1 − Π_{i = n−c+1}^{n} (1 − k/i) (their numerically stable form). The reported
value is its mean over items, with a percentile bootstrap interval over items.
"""

from __future__ import annotations

import numpy as np

SAMPLE_SEED_STREAM = 4_099


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are right (module docstring)."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"pass@k with n={n}, c={c}, k={k}: need 0 ≤ c ≤ n and k ≥ 1")
    if k > n:
        raise ValueError(f"pass@{k} from {n} samples: k cannot exceed the samples per item; raise --pass-samples to at least {k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def summarise(correct_counts: list[int], labels: list[str], *, n: int, k: int, n_boot: int = 1000, seed: int = 0) -> dict:
    """Mean pass@k and pass@1 over items with intervals, and pass@k per reference label."""
    per_item = np.array([pass_at_k(n, c, k) for c in correct_counts])
    pass1 = np.array(correct_counts, dtype=np.float64) / n
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(per_item), (n_boot, len(per_item))) if n_boot else None

    def interval(values: np.ndarray) -> list[float] | None:
        return None if draws is None else [float(v) for v in np.percentile(values[draws].mean(axis=1), [2.5, 97.5])]

    per_label = {label: float(per_item[[i for i, y in enumerate(labels) if y == label]].mean()) for label in sorted(set(labels))}
    return {"k": k, "n_samples": n, "n_items": len(per_item), "pass_at_k": float(per_item.mean()),
            "pass_at_k_ci": interval(per_item), "pass_at_1": float(pass1.mean()), "pass_at_1_ci": interval(pass1),
            "per_label": per_label, "estimator": "Chen et al. 2021, eq. 1 (unbiased), mean over items"}


def sample_pass_at_k(setup, *, k: int, n: int, max_new_tokens: int | None = None, seed: int = 0, batch_size: int = 8,
                     n_boot: int = 1000) -> dict:
    """Sample ``n`` answers per item of ``setup.data`` at temperature 1, parse them strictly, and
    summarise pass@k (``setup`` from ``labelrl.evaluate.setup.prepare``)."""
    from labelrl.evaluate.predict import _dtype, fit_to_context, generation_cap
    from labelrl.rewards import parse_answer
    from labelrl.rollout import BACKENDS
    from labelrl.rollout.sampler import pad_id
    from labelrl.types import canonical_label

    if k > n:
        raise ValueError(f"--pass-at-k {k} with --pass-samples {n}: draw at least k answers per item")
    data, tok = setup.data, setup.tokenizer
    cap = generation_cap(setup, max_new_tokens)
    examples, prompts, _ = fit_to_context(setup, "generate", cap)  # --on-long-item, as every evaluation
    sampler, counts = BACKENDS.get("labelrl"), []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        seeds = [seed * 1_000_003 + SAMPLE_SEED_STREAM + start + i for i in range(len(chunk))]
        batch = sampler(setup.model, chunk, group_size=n, max_new_tokens=cap, eos_token_ids=tok.eos_token_id,
                        pad_token_id=pad_id(tok), temperature=1.0, prompt_seeds=seeds, dtype=_dtype(setup))
        for i, ex in enumerate(examples[start : start + batch_size]):
            right = 0
            for j in range(n):
                row = i * n + j
                parsed = parse_answer(tok.decode(batch.completion_ids[row], skip_special_tokens=True),
                                      reasoning=data.options.mode == "reasoning", labels=data.labels,
                                      truncated=batch.truncated[row])
                right += parsed.answer is not None and canonical_label(parsed.answer) == canonical_label(ex.label)
            counts.append(right)
    out = summarise(counts, [ex.label for ex in examples], n=n, k=k, n_boot=n_boot, seed=seed)
    out.update(split=data.split, model_spec=setup.model_spec, model_fingerprint=setup.model_fingerprint,
               max_new_tokens=cap, correct_counts=counts, ids=[ex.id for ex in examples])
    return out
