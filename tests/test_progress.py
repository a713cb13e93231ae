"""No silent minutes: a count with an ETA, as a bar on a terminal and as plain lines elsewhere."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

from labelrl import progress
from labelrl.progress import Counter, clock, hosting

sys.path.insert(0, str(Path(__file__).resolve().parent))
from numerics import assert_values_within, label_probability_bound  # noqa: E402


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake_time(monkeypatch):
    clock_ = FakeClock()
    monkeypatch.setattr(progress.time, "monotonic", clock_)
    return clock_


def test_plain_lines_give_the_count_the_elapsed_time_and_an_eta(fake_time):
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=False)
    with Counter(400, "scoring val", console=console) as count:
        fake_time.now += 12
        count.advance(64)  # 12 s after the start line: a line (at least every PLAIN_EVERY = 10 s)
        fake_time.now += 3
        count.advance(16)  # 3 s later: no line
        fake_time.now += 60
        count.advance(320)
    lines = stream.getvalue().splitlines()
    # 64 done in 12 s → 336 left at 0.1875 s each = 63 s
    assert lines == [
        "scoring val: 0/400 items, 0:00:00 elapsed",
        "scoring val: 64/400 items, 0:00:12 elapsed, eta 0:01:03",
        "scoring val: 400/400 items, 0:01:15 elapsed",
    ]


def test_with_work_the_eta_follows_the_work_and_the_count_stays_in_items(fake_time):
    """Scoring takes its prompts shortest first: 16 short items done are 1/10 of the tokens, so
    what is left takes 9 times as long, not 14/16 of the time so far."""
    stream = io.StringIO()
    with Counter(30, "scoring val", console=Console(file=stream, force_terminal=False), work=10_000) as count:
        fake_time.now += 14
        count.advance(16, work=1_000)
        fake_time.now += 126
        count.advance(14, work=9_000)
    assert stream.getvalue().splitlines() == [
        "scoring val: 0/30 items, 0:00:00 elapsed",
        "scoring val: 16/30 items, 0:00:14 elapsed, eta 0:02:06",  # 14 s per 1,000 tokens × 9,000 left
        "scoring val: 30/30 items, 0:02:20 elapsed",
    ]
    statuses: list[str] = []
    with hosting(statuses.append):
        with Counter(4, "x", work=40) as count:
            fake_time.now += 10
            count.advance(1, work=30)
    assert statuses[1] == "x 1/4, eta 0:00:03"  # 30 of 40 tokens in 10 s


def test_work_is_given_at_every_advance_or_never():
    with pytest.raises(ValueError, match=r"give each advance's cost exactly when the counter has a total work"):
        with Counter(2, "x", quiet=True, work=10) as count:
            count.advance(1)
    with pytest.raises(ValueError, match=r"give each advance's cost"):
        with Counter(2, "x", quiet=True) as count:
            count.advance(1, work=5)
    with pytest.raises(ValueError, match=r"work=0: the total cost must be positive"):
        Counter(2, "x", work=0)


def test_a_terminal_bar_with_work_shows_the_items():
    stream = io.StringIO()
    with Counter(8, "scoring holdout", console=Console(file=stream, force_terminal=True, width=120), work=800) as count:
        count.advance(3, work=100)
        count.advance(5, work=700)
    shown = stream.getvalue()
    assert "8/8 items" in shown and "800" not in shown


def test_the_end_line_is_printed_once(fake_time):
    stream = io.StringIO()
    with Counter(2, "x", console=Console(file=stream, force_terminal=False)) as count:
        fake_time.now += 11
        count.advance(2)  # this line already says 2/2
    assert stream.getvalue().count("2/2") == 1


def test_a_terminal_gets_a_bar_with_the_count_and_eta():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=120)
    with Counter(8, "scoring holdout", console=console) as count:
        count.advance(3)
        count.advance(5)
    shown = stream.getvalue()
    assert "scoring holdout" in shown and "8/8" in shown and "eta" in shown
    assert "elapsed" not in shown  # the bar, not the plain lines


def test_inside_a_live_display_the_count_goes_to_its_status(fake_time):
    statuses: list[str] = []
    stream = io.StringIO()
    with hosting(statuses.append):
        with Counter(200, "scoring val", console=Console(file=stream, force_terminal=True)) as count:
            fake_time.now += 10
            count.advance(50)
    assert stream.getvalue() == ""  # no second display
    assert statuses == ["scoring val 0/200", "scoring val 50/200, eta 0:00:30", "", ""]


def test_quiet_shows_nothing_and_plain_forces_lines_on_a_terminal(fake_time):
    stream = io.StringIO()
    with Counter(3, "x", quiet=True, console=Console(file=stream, force_terminal=True)) as count:
        count.advance(3)
    assert stream.getvalue() == "" and count.done == 3
    with Counter(3, "y", plain=True, console=Console(file=stream, force_terminal=True)) as count:
        count.advance(3)
    assert re.findall(r"y: \d/3 items", stream.getvalue()) == ["y: 0/3 items", "y: 3/3 items"]


def test_scoring_batches_long_prompts_a_few_at_a_time_and_returns_rows_in_order(monkeypatch, fake_time):
    """Short prompts keep whole batches; long ones go a few at a time (at most
    SCORE_BATCH_POSITIONS padded positions), one that alone exceeds it goes alone; every prompt
    is scored once and its row comes back where it was."""
    import torch

    from labelrl.evaluate import predict, score
    from labelrl.types import LabelSpace

    chunks: list[list[int]] = []

    def fake_score(model, tokenizer, chunk, labels, *, batch_size, dtype, fast, past):
        assert past is None  # the module pass: no packed weights, no split prefix
        chunks.append([len(p) for p in chunk])
        return torch.tensor([[float(len(p)), 0.0] for p in chunk])

    monkeypatch.setattr(score, "score_labels", fake_score)
    monkeypatch.setattr(score, "scoring_weights", lambda model, dtype: None)  # the module pass's batches
    budget = predict.SCORE_BATCH_POSITIONS
    lengths = [3000, 20, 9000, 25, 2500, 30, 3100, 10, 2900] + [40] * 20
    prompts = [[1] * n for n in lengths]
    probs = predict.score_counted(None, None, prompts, LabelSpace(("a", "b"), "binary"), batch_size=16,
                                  description="scoring val", plain=True)
    assert probs[:, 0].tolist() == [float(n) for n in lengths]  # each row where its prompt was
    assert sorted(n for chunk in chunks for n in chunk) == sorted(lengths)
    assert all(len(chunk) <= 16 for chunk in chunks)
    assert all(len(chunk) * max(chunk) <= budget or len(chunk) == 1 for chunk in chunks)
    assert chunks[0] == [10, 20, 25, 30] + [40] * 12  # short prompts: a whole batch
    assert [9000] in chunks and [2500, 2900] in chunks and [3000, 3100] in chunks


def test_clock():
    assert clock(0) == "0:00:00" and clock(75.4) == "0:01:15" and clock(3723) == "1:02:03"


@pytest.mark.numerics
def test_scoring_a_split_counts_every_item(tmp_path, capsys):
    """``score_counted`` equals ``score_labels`` in one call and says how far it got.

    The two batch the prompts differently (shortest first, longest first), so they pad to
    other widths and run other kernels: the probabilities agree to the rounding bound of a
    softmax over label log-probs (tests/numerics.py, ``label_probability_bound``)."""
    from labelrl.data.prompts import ANSWER_PREFIX
    from labelrl.evaluate.predict import score_counted
    from labelrl.evaluate.score import score_labels
    from labelrl.models import load_model
    from labelrl.types import LabelSpace

    model, tokenizer = load_model("tiny-random")
    labels = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
    prompts = [tokenizer(f"message number {i} " * (1 + i % 4))["input_ids"] for i in range(11)]
    counted = score_counted(model, tokenizer, prompts, labels, batch_size=4, description="scoring val", plain=True)
    at_once = score_labels(model, tokenizer, prompts, labels, batch_size=4)
    longest = max(map(len, prompts)) + len(tokenizer(ANSWER_PREFIX, add_special_tokens=False)["input_ids"])
    assert_values_within(counted, at_once, label_probability_bound(model, longest, at_once), "label probabilities")
    err = capsys.readouterr().err
    assert "scoring val: 0/11 items" in err and "scoring val: 11/11 items" in err
