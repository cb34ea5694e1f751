"""The quick lane trains nothing (``tests/quick_lane.py``): a command that would train fails there, naming the way
out. CI skips the full check's tests (``conftest.FULL_CHECK``) unless ``FT_FULL_CHECK=1`` asks for them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import quick_lane
from conftest import ROOT, tiny_sft
from ft_server import ForkServer


@pytest.mark.slow  # a fork server of its own: 9 s of imports the quick lane need not pay to check itself
def test_a_command_that_trains_fails_in_the_quick_lane(tmp_path, write_recipe):
    """A fork server of a quick-lane session (its environment has ``FT_TESTS_QUICK_LANE``) runs a tiny ``ft train``:
    the run fails with the quick lane's message before its first step; validating the same recipe still works."""
    recipe = write_recipe(tiny_sft(tmp_path / "out", max_steps=1))
    env = {**os.environ, quick_lane.ENV: "1", "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
    server = ForkServer(env)
    try:
        trained = server.run(["python", "-m", "ft", "train", str(recipe)], env, tmp_path, 300)
        validated = server.run(["python", "-m", "ft", "validate", str(recipe)], env, tmp_path, 300)
    finally:
        server.close()
    assert trained.returncode == 1 and "the quick lane (pytest -m 'not slow') trains nothing" in trained.stderr, \
        trained.stderr[-2000:]
    assert not (tmp_path / "out" / "final").exists()
    assert validated.returncode == 0, validated.stderr[-2000:]


@pytest.mark.parametrize("asked", [False, True])
def test_the_full_checks_tests_are_skipped_unless_it_is_asked_for(asked):
    """The three tests of test_benchmarks.py are marked ``full``: without FT_FULL_CHECK all are skipped, saying how to
    run them; with it their set-up is planned like any other test's (``--setup-plan`` runs nothing)."""
    env = {**os.environ, "FT_FULL_CHECK": "1" if asked else ""}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "--setup-plan",
                           "-rs", "tests/test_benchmarks.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    skipped = "SKIPPED [3] tests/test_benchmarks.py: in the full check only: FT_FULL_CHECK=1 python -m pytest -q"
    assert (skipped in done.stdout) is not asked and ("3 skipped" in done.stdout) is not asked, done.stdout[-2000:]
    assert done.returncode == 0 and ("no tests ran" in done.stdout) is asked, done.stdout[-2000:]
