"""A local teacher held to the trace format: its reasoning is its own, the tags are not.

A small instruct model asked for ``<think>…</think><answer>LABEL</answer>`` rarely writes it
(SmolLM2-135M-Instruct: 0 well-formed replies in 256 samples of sms-spam items at temperature
0.7 and 1.0, 128 tokens), so free rejection sampling keeps nothing and says only that the
teacher ignores the format. ``trace_format: constrained`` asks a *local* teacher for the format
by construction, as constrained decoding does:

1. the reply is opened with ``<think>`` (appended to the prompt);
2. the teacher writes its reasoning, sampled as usual, until it starts a tag (``<``), ends its
   turn, or reaches its budget: ``max_new_tokens`` less the tokens of the closing tags and the
   longest label;
3. ``</think><answer>`` is appended and the answer is drawn from the teacher's own label
   probabilities after its reasoning (``labelrl.evaluate.score.score_labels``), sharpened by
   the temperature (p^(1/T), normalised; T = 0: the most probable label), with a uniform fixed
   by (seed, item text) so a rerun draws the same label.

The label is never shown, so rejection sampling still keeps only the traces whose answer the
teacher reached on its own. What changes: no reply can fail to parse, so survival measures
agreement with the label only, not format-following; the survival summary names the format,
and the teacher's name gains ``+constrained``, so its attempts journal is never mixed with a
free run's.
"""

from __future__ import annotations

from labelrl.audit.judges import draw_label, item_uniform
from labelrl.data.prompts import ANSWER_PREFIX, ANSWER_SUFFIX, THINK_CLOSE, THINK_OPEN, render_prompt
from labelrl.types import LabelSpace

def sharpen(probs: list[float], temperature: float) -> list[float]:
    """p_k^(1/T) / Σ_j p_j^(1/T); at T = 0 all mass on the most probable label (first on a tie)."""
    if temperature <= 0:
        best = max(range(len(probs)), key=probs.__getitem__)
        return [1.0 if k == best else 0.0 for k in range(len(probs))]
    powered = [p ** (1.0 / temperature) for p in probs]
    total = sum(powered)
    return [p / total for p in powered]


class ConstrainedTeacher:
    """Wraps a ``LocalJudge``: ``generate`` returns a well-formed trace (module docstring)."""

    kind = "local"

    def __init__(self, teacher, labels: LabelSpace) -> None:
        if getattr(teacher, "kind", None) != "local":
            raise ValueError(f"--trace-format constrained: the teacher {teacher.name} is an endpoint, whose replies "
                             "labelrl cannot steer token by token; give a local teacher (a built-in model or a model "
                             "directory), or use --trace-format free")
        self.teacher = teacher
        self.labels = labels
        self.name = f"{teacher.name}+constrained"
        tokenizer = teacher.tokenizer
        closing = max((f"{THINK_CLOSE}{ANSWER_PREFIX}{label}{ANSWER_SUFFIX}" for label in labels.labels),
                      key=lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]))
        self.reserved = len(tokenizer(THINK_OPEN + closing, add_special_tokens=False)["input_ids"])

    def think_budget(self, max_new_tokens: int) -> int:
        budget = max_new_tokens - self.reserved
        if budget < 1:
            raise ValueError(f"--max-new-tokens {max_new_tokens}: a constrained trace spends {self.reserved} tokens on "
                             f"its tags and the longest label; set --max-new-tokens {self.reserved + 1} or more")
        return budget

    def generate(self, messages: list[dict[str, str]], *, max_new_tokens: int = 256, temperature: float = 0.0,
                 seed: int | None = None) -> str:
        from labelrl.evaluate.score import score_labels

        teacher, tokenizer = self.teacher, self.teacher.tokenizer
        opened = render_prompt(tokenizer, messages) + THINK_OPEN
        thought = self._reasoning(opened, self.think_budget(max_new_tokens), temperature, seed)
        ids = tokenizer(opened + thought + THINK_CLOSE, add_special_tokens=False)["input_ids"]
        probs = score_labels(teacher.model, tokenizer, [ids], self.labels, batch_size=1, dtype=teacher.dtype)[0].tolist()
        k = draw_label(sharpen(probs, temperature), item_uniform(seed or 0, messages[-1]["content"]))
        return f"{THINK_OPEN}{thought}{THINK_CLOSE}{ANSWER_PREFIX}{self.labels.labels[k]}{ANSWER_SUFFIX}"

    def _reasoning(self, prompt: str, budget: int, temperature: float, seed: int | None) -> str:
        """The teacher's sampled continuation of ``prompt``, cut before its first ``<``."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        from labelrl.models.precision import compute

        teacher, tokenizer = self.teacher, self.teacher.tokenizer
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
        start = ids["input_ids"].shape[1]

        class StopAtTag(StoppingCriteria):  # a tag would end the think block or break the trace
            def __call__(self, input_ids, scores, **kwargs):
                text = tokenizer.decode(input_ids[0, start:], skip_special_tokens=True)
                return torch.full((input_ids.shape[0],), "<" in text, dtype=torch.bool, device=input_ids.device)

        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.random.fork_rng(devices=[]), torch.inference_mode(), compute(teacher.model, teacher.dtype):
            if seed is not None:
                torch.manual_seed(seed)
            out = teacher.model.generate(**ids, max_new_tokens=budget, pad_token_id=tokenizer.pad_token_id,
                                         stopping_criteria=StoppingCriteriaList([StopAtTag()]), **sampling)
        text = tokenizer.decode(out[0, start:], skip_special_tokens=True)
        return text.split("<", 1)[0]
