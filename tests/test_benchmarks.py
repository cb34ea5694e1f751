"""Benchmarks run end to end in their ``--quick`` mode: benchmarks/vision_step.py (ft and a plain TRL SFTTrainer
script on a random LLaVA, in lockstep), benchmarks/vision_prep_memory.py (``ft preprocess`` of a vision model's rows at
1x and 4x) and benchmarks/mixture_scale.py (ft's weighted mixture against datasets' draw alone, at 1x and 4x rows).
They print figures, not verdicts, and a busy machine moves the figures: these tests check that each benchmark runs,
prints its ratio lines, and measures what it says it does (ft and TRL trained on the same input_ids and labels at
every step; every row prepared at both sizes; the mixture drew the same rows as the floor), never a timing or a
memory figure."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.full]  # the full check (conftest.FULL_CHECK): benchmarks, not ft


def _quick(name: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "TQDM_DISABLE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "failed" not in done.stdout, done.stderr[-3000:]
    return done.stdout


def test_vision_step_trains_ft_and_trl_on_the_same_batches_and_prints_the_ratio():
    out = _quick("vision_step.py")
    assert "same input_ids and labels in 7 of 7 steps" in out, out
    assert re.search(r"^ft / TRL SFTTrainer \(vision\) = \d+\.\d\d \(target <= 1\.05\)$", out, re.MULTILINE), out


def test_vision_prep_memory_prepares_every_row_at_both_sizes_and_prints_the_ratio():
    out = _quick("vision_prep_memory.py")  # it stops with an error when a size keeps fewer rows than it wrote
    assert re.search(r"^1×\s+50\s", out, re.MULTILINE) and re.search(r"^4×\s+200\s", out, re.MULTILINE), out
    assert re.search(r"^peak RSS 4× / 1× = \d\.\d{3} \(target <= 1\.1\)$", out, re.MULTILINE), out


def test_mixture_scale_draws_the_floors_rows_at_both_sizes_and_prints_the_ratios():
    out = _quick("mixture_scale.py")  # it stops with an error when ft's mixture drew other rows than the floor
    assert re.search(r"^\| 1000 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", out, re.MULTILINE), out
    assert re.search(r"^\| 4000 \| ", out, re.MULTILINE), out
    assert re.search(r"^weighted / floor = \d+\.\d\d at worst \(target <= 1\.30\)$", out, re.MULTILINE), out
    assert re.search(r"^weighted at 4x / at 1x = \d+\.\d\d \(target <= 4\.40\)$", out, re.MULTILINE), out
