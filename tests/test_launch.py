"""`ft train --num-processes 2` on CPU: ft starts both ranks itself; Ctrl-C to ft stops both at one checkpoint with ft
exiting 130 and no rank left (SIGTERM, exit 143 and the printed command resuming: tests/test_nodes.py, where one
node's launcher is stopped); a SIGKILL of ft leaves no rank behind either; a rank killed is named by the other. (A
whole run, its data prepared once before the ranks start: tests/test_run_lock.py, which holds one mid-run.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, alive, run_ft, tiny_sft
from test_checkpoints import SLOW_STEPS, STEP_LOG, hold_at, signal_at_step
from test_nodes import NODE_STEPS

from ft.outputs.checkpoints import complete_checkpoints
from ft.run.launch import rank_argv

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model

ENV = {**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}


def _ft(recipe: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ft", "train", str(recipe), "--num-processes", "2", *extra]


def _slow_recipe(write_recipe, tmp_path, max_steps: int = 60) -> tuple[Path, Path]:
    (tmp_path / "slow_steps.py").write_text(SLOW_STEPS)
    (tmp_path / "step_log.py").write_text(STEP_LOG)
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=max_steps, logging_steps=10)
    recipe["callbacks"] = [{"cls": "slow_steps:SlowSteps"}, {"cls": "step_log:StepLog"}]
    return write_recipe(recipe), out


def _rank_pids(out: Path) -> set[int]:
    return {int(line.split()[0]) for log in out.glob("steps-rank*.log") for line in log.read_text().splitlines()}


def test_ctrl_c_to_ft_stops_both_ranks_with_exit_130(write_recipe, tmp_path):
    path, out = _slow_recipe(write_recipe, tmp_path)
    hold_at(out, 5)
    ft = subprocess.Popen(_ft(path), cwd=ROOT, env=ENV, stderr=subprocess.PIPE, text=True)
    signal_at_step(ft, out, 5, signal.SIGINT)
    _, stderr = ft.communicate(timeout=300)
    assert ft.returncode == 130, stderr[-3000:]
    assert len(complete_checkpoints(out)) == 1
    assert not [pid for pid in _rank_pids(out) if alive(pid)]


def test_no_rank_outlives_ft_killed_with_sigkill(write_recipe, tmp_path):
    path, out = _slow_recipe(write_recipe, tmp_path, max_steps=2000)
    hold_at(out, 5)
    ft = subprocess.Popen(_ft(path), cwd=ROOT, env=ENV, stderr=subprocess.DEVNULL, start_new_session=True)
    signal_at_step(ft, out, 5, signal.SIGKILL)
    ft.wait(timeout=60)
    ranks = _rank_pids(out)
    assert len(ranks) == 2
    deadline = time.monotonic() + 120  # the kernel sends each rank SIGTERM: they save and end
    while any(alive(pid) for pid in ranks):
        assert time.monotonic() < deadline, "ranks kept running after ft was killed"
        time.sleep(0.2)


def test_a_rank_killed_is_named_by_the_other_with_its_step_and_the_checkpoint(write_recipe, tmp_path):
    """SIGKILL of one rank's process (the kernel's OOM killer does this) after step 3, checkpoint-2 saved: the other
    rank's next all-reduce fails, its roll call finds rank 1's heartbeat stopped, and ft exits 1 naming rank 1, the
    step and the checkpoint to resume from; no rank is left."""
    (tmp_path / "node_steps.py").write_text(NODE_STEPS)
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=6, save_strategy="steps", save_steps=2)
    path = write_recipe({**recipe, "callbacks": [{"cls": "node_steps:HoldForStop"}]})
    out.mkdir(parents=True)
    (out / "lose-at").write_text("3 1")  # rank 1 waits after step 3; rank 0 goes on into step 4's all-reduce
    ft = subprocess.Popen(_ft(path), cwd=ROOT, env=ENV, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "held-1").exists():
            assert ft.poll() is None and time.monotonic() < deadline, ft.communicate()[1][-3000:]
            time.sleep(0.05)
        ranks = dict(reversed(line.split()) for line in (out / "ranks.log").read_text().splitlines())
        os.kill(int(ranks["1"]), signal.SIGKILL)
        _, stderr = ft.communicate(timeout=120)
    finally:
        if ft.poll() is None:
            os.killpg(ft.pid, signal.SIGKILL)
    assert ft.returncode == 1, stderr[-3000:]
    assert "rank 1 (node 0) was lost after step 3 of 6" in stderr, stderr[-3000:]
    assert f"The newest complete checkpoint is {out / 'checkpoint-2'}" in stderr and "Traceback" not in stderr
    assert not [pid for pid in map(int, ranks.values()) if alive(pid)]


def test_launch_settings_are_checked_before_any_rank_starts(write_recipe, tmp_path):
    path = write_recipe(tiny_sft(tmp_path / "out"))
    bad_count = run_ft("train", str(path), "--num-processes", "two")
    assert bad_count.returncode == 2 and "--num-processes" in bad_count.stderr
    bad_rank = run_ft("train", str(path), "--num-processes", "2", "--nnodes", "2", "--node-rank", "2",
                      "--master-addr", "10.0.0.1")
    assert bad_rank.returncode == 2 and "launch.node_rank" in bad_rank.stderr, bad_rank.stderr[-2000:]
    lonely = run_ft("train", str(path), "--nnodes", "2")
    assert lonely.returncode == 2 and "launch.master_addr" in lonely.stderr
    assert not (tmp_path / "out").exists()


def test_the_ranks_get_the_command_without_the_launch_flags():
    argv = ["train", "r.yaml", "--num-processes", "2", "--set", "train.max_steps=3", "--nnodes=1", "--node-rank", "0",
            "--master-addr", "h", "--master-port", "1", "--rdzv-endpoint", "h:2", "--resume", "never"]
    assert rank_argv(argv) == ["train", "r.yaml", "--set", "train.max_steps=3", "--resume", "never"]


def test_other_processes_wait_for_the_main_ones_prepared_data_without_a_timeout(write_recipe, tmp_path):
    from ft import data
    from ft.model import loading
    from ft.recipe import load_recipe

    recipe_dict = tiny_sft(tmp_path / "out")
    recipe_dict["data"]["prepared_path"] = str(tmp_path / "prepared")
    recipe = load_recipe(write_recipe(recipe_dict)).recipe
    tokenizer = loading.load_tokenizer(recipe.model)
    template = data.chat_template_for(recipe, tokenizer)
    waited: dict = {}
    waiting = threading.Event()  # set when the other process says it waits (before its first look at the cache)

    def said(message: str) -> None:
        if "waiting for the main process" in message:
            waiting.set()

    def other_process():
        waited["prepared"] = data.prepare_data(recipe, tokenizer, template, said, builder=False)

    waiter = threading.Thread(target=other_process)
    waiter.start()
    assert waiting.wait(timeout=120)
    assert waiter.is_alive() and not (tmp_path / "prepared").exists()  # waiting, and never writing it itself
    built = data.prepare_data(recipe, tokenizer, template, lambda message: None)  # the main process
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert waited["prepared"].stats["prepared"] == f"reused {tmp_path / 'prepared'}"
    assert waited["prepared"].train["input_ids"] == built.train["input_ids"]


def test_a_rank_ignores_launch_flags(monkeypatch):
    """Inside a rank (WORLD_SIZE set by the launcher) ft trains as that rank and never launches again."""
    from ft.run import launch

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not launch.several_processes_wanted(None, {"num_processes": 2, "nnodes": None})
