"""The quick lane trains nothing (``tests/quick_lane.py``): a command that would train fails there, naming the way
out."""

from __future__ import annotations

import os

import pytest
import quick_lane
from conftest import tiny_sft
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
