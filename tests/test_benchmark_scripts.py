"""The benchmark scripts run and print what their docs promise (a smoke run on tiny-random: the
figures themselves are measured on real models, never asserted in tests)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_sft_step_prints_the_cpu_every_arm_and_ends_with_their_ratios():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sft_step.py"), "--model", "tiny-random",
                          "--runs", "2", "--threads", "1"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("CPU: ") and "memory read" in lines[1]
    assert any(line.strip().startswith("module step") for line in lines)
    assert any(line.strip().startswith("apart  step") for line in lines)  # the lean pass, prompt and answer apart
    assert any(line.strip().startswith("lean   step") for line in lines)
    assert re.fullmatch(r"joined vs apart: \d+\.\d\d×", lines[-2])
    assert re.fullmatch(r"lean vs module: \d+\.\d\d×", lines[-1])


@pytest.mark.parametrize("size", [["--kind", "sft", "--steps", "2"], ["--kind", "eval", "--items", "16"]])
def test_side_by_side_prints_the_cpu_both_arms_and_ends_with_their_ratio(size):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "side_by_side.py"), "--model", "tiny-random",
                          *size, "--runs", "1"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("CPU: ")
    assert any(line.strip().startswith("one after another:") for line in lines)
    assert any(line.strip().startswith("side by side:") for line in lines)
    assert re.fullmatch(r"side by side vs one after another: \d+\.\d\d×", lines[-1])
