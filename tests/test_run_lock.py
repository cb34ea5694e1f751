"""One run per output directory at a time (``ft.outputs.lock``): a second ``ft train`` into a directory a run holds is
refused with exit 2, naming the holder's process, host and start time; so are ``ft train --smoke`` into a smoke
directory and ``ft preprocess`` into a ``data.prepared_path`` being written. The lock is the kernel's (``flock``): a
holder killed by SIGKILL leaves its lock file behind, and it blocks nobody. An output directory that cannot be written
is refused the same way, before the data is prepared.

Synchronisation is by pipes: a holder says on stdout or stderr that it holds, and waits on its stdin or a FIFO until
the test lets it go."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_ft, tiny_sft

from ft.outputs import lock

# holds ``lock.output_dir(argv[1])`` (or, with argv[2] == "prepared", the lock of a data.prepared_path) until its stdin
# closes; says "held" on stdout once it holds
HOLDER = """
import sys
from pathlib import Path

from ft.outputs import lock

path = Path(sys.argv[1])
held = lock.prepared_path(path) if sys.argv[2:] == ["prepared"] else lock.output_dir(path)
with held:
    print("held", flush=True)
    sys.stdin.read()
"""


def _holder(path: Path, *extra: str) -> subprocess.Popen:
    """A process holding ``path``'s lock; returns once it says it holds it."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), *extra], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "held\n"
    return process


def _let_go(process: subprocess.Popen) -> None:
    process.stdin.close()
    assert process.wait(timeout=60) == 0


def test_a_held_output_dir_is_refused_naming_its_holder_and_a_dead_holders_lock_blocks_nobody(tmp_path):
    out = tmp_path / "run"
    holder = _holder(out)
    try:
        content = json.loads((out / lock.LOCK_NAME).read_text())
        assert content["pid"] == holder.pid and content["host"] == socket.gethostname() and content["started"]
        with pytest.raises(lock.Busy) as refused:
            with lock.output_dir(out):
                pass
        message = refused.value.render()
        assert f"process {holder.pid} on {socket.gethostname()}, started {content['started']}" in message
        assert "train.output_dir" in message and f"kill {holder.pid}" in message
        assert (out / lock.LOCK_NAME).exists()  # a refusal leaves the holder's lock alone
    finally:
        holder.kill()  # SIGKILL: nothing of the holder runs, its lock file stays
        holder.wait(timeout=60)
    assert json.loads((out / lock.LOCK_NAME).read_text())["pid"] == holder.pid  # stale, from a dead process
    with lock.output_dir(out):  # the kernel released the lock with the process: the stale file does not block
        assert json.loads((out / lock.LOCK_NAME).read_text())["pid"] == os.getpid()
        with lock.output_dir(out):  # held again by the same process (--smoke runs ft train inside its own hold)
            pass
        assert (out / lock.LOCK_NAME).exists()  # still held by the outer hold
    assert list(out.iterdir()) == []  # the lock file goes with the hold (the folder was the dead holder's)
    fresh = tmp_path / "new" / "run"
    with lock.output_dir(fresh):
        assert (fresh / lock.LOCK_NAME).exists()
    assert not (tmp_path / "new").exists()  # the folders a hold made go with it when left empty (a refused run)


def test_a_hold_keeps_a_directory_it_found_and_a_launcher_holds_for_its_ranks(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    holder = _holder(out)
    try:
        with lock.output_dir(out, held_by=holder.pid):  # a rank of the run the holder (its launcher) started
            pass
        with pytest.raises(lock.Busy):  # any other pid is another run
            with lock.output_dir(out, held_by=holder.pid + 1):
                pass
    finally:
        _let_go(holder)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_second_ft_train_smoke_or_preprocess_into_what_another_writes_exits_2(write_recipe, tmp_path):
    out, prepared = tmp_path / "run", tmp_path / "prepared"
    recipe = tiny_sft(out)
    recipe["data"]["prepared_path"] = str(prepared)
    path = write_recipe(recipe)
    for command, held, extra in ((["train", str(path)], out, ()), (["train", str(path), "--smoke"],
                                                                     tmp_path / "run-smoke", ()),
                                 (["preprocess", str(path)], prepared, ("prepared",))):
        holder = _holder(held, *extra)
        try:
            refused = run_ft(*command)
            content = json.loads(lock.lock_file(held, prepared=bool(extra)).read_text())
        finally:
            _let_go(holder)
        assert refused.returncode == 2, (command, refused.stderr[-3000:])
        assert f"process {holder.pid} on {socket.gethostname()}, started {content['started']}" in refused.stderr
        assert "Traceback" not in refused.stderr and "not a recipe error" not in refused.stderr
        key = "data.prepared_path" if extra else "train.output_dir"
        assert key in refused.stderr, refused.stderr
    # nothing was written by the refused commands: no recipe.yaml, no smoke inputs, no prepared data
    assert not out.exists() and not (tmp_path / "run-smoke").exists() and not prepared.exists()


def test_an_output_dir_that_cannot_be_a_directory_is_refused_before_the_data_is_prepared(write_recipe, tmp_path):
    """Run as root, chmod stops no write: a read-only filesystem is tested in test_disk_full.py. Here the output
    directory is an existing file, or a folder inside one."""
    taken = tmp_path / "taken"
    taken.write_text("a file of mine")
    for out in (taken, taken / "run"):
        recipe = tiny_sft(out)
        recipe["data"]["prepared_path"] = str(tmp_path / "prepared")
        result = run_ft("train", str(write_recipe(recipe)))
        assert result.returncode == 2, result.stderr[-3000:]
        assert "train.output_dir" in result.stderr and f"{taken} is a file" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and "not a recipe error" not in result.stderr
        assert not (tmp_path / "prepared").exists()  # refused before the data was prepared
        assert taken.read_text() == "a file of mine"


HOLD_AT_STEP = """
import os
import sys

from transformers import TrainerCallback


class HoldAtStep(TrainerCallback):
    \"\"\"At the end of optimizer step `step`, the main process says `HOLDING <pid>` on stderr and waits for the test to
    write to the FIFO `fifo` (a blocking read: the test lets it go).\"\"\"

    def __init__(self, step: int, fifo: str):
        self.step, self.fifo = step, fifo

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and args.process_index == 0:
            print(f"HOLDING {os.getpid()}", file=sys.stderr, flush=True)
            with open(self.fifo) as fifo:
                fifo.read()
"""


def _held_run(tmp_path: Path, out: Path, *extra: str, seed: int = 0,
              prepared: Path | None = None) -> tuple[subprocess.Popen, Path, Path, str]:
    """``ft train`` (seed ``seed``; its data prepared first into ``prepared`` when given) started and held at the end
    of its step 2, until ``_release``; and what it said until then."""
    (tmp_path / "hold_at_step.py").write_text(HOLD_AT_STEP)
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    recipe = tiny_sft(out, max_steps=4, seed=seed, save_strategy="steps", save_steps=2)
    recipe["callbacks"] = [{"cls": "hold_at_step:HoldAtStep", "kwargs": {"step": 2, "fifo": str(fifo)}}]
    if prepared is not None:
        recipe["data"]["prepared_path"] = str(prepared)
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    process = subprocess.Popen([sys.executable, "-m", "ft", "train", str(path), *extra], cwd=ROOT, text=True,
                               stderr=subprocess.PIPE, env={**os.environ, "TQDM_DISABLE": "1",
                                                            "PYTHONUNBUFFERED": "1"})
    said = []
    for line in process.stderr:  # the pipe: read until the run says it holds at step 2
        said.append(line)
        if line.startswith("HOLDING "):
            return process, path, fifo, "".join(said)
    raise AssertionError(f"the run ended before step 2 (exit {process.wait()})")


def _release(fifo: Path) -> None:
    with open(fifo, "w") as release:
        release.write("go")


@pytest.mark.slow
def test_two_runs_into_one_output_dir_the_second_is_refused_while_the_first_trains(write_recipe, tmp_path):
    out = tmp_path / "out"
    first, _, fifo, _ = _held_run(tmp_path, out, seed=0)
    try:
        second = run_ft("train", str(write_recipe(tiny_sft(out, max_steps=4, seed=1), name="b.yaml")))
        _release(fifo)
        _, rest = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2, second.stderr[-3000:]
    assert f"process {first.pid} on {socket.gethostname()}, started" in second.stderr
    assert "train.output_dir" in second.stderr and "Traceback" not in second.stderr
    assert first.returncode == 0, rest[-3000:]
    # everything in the directory is the first run's
    assert yaml.safe_load((out / "recipe.yaml").read_text())["train"]["seed"] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4 and summary["resumed_from"] is None
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert not (out / lock.LOCK_NAME).exists()  # released at the end


@pytest.mark.slow
def test_the_launcher_of_two_ranks_holds_the_output_dir_for_them(tmp_path):
    """``ft train --num-processes 2``: ft prepares the data once, before the ranks start (both reuse it), holds the
    output directory for both (a second run into it is refused, naming ft), and the two ranks write one run."""
    out = tmp_path / "out"
    first, path, fifo, said = _held_run(tmp_path, out, "--num-processes", "2", prepared=tmp_path / "prepared")
    try:
        content = json.loads((out / lock.LOCK_NAME).read_text())
        second = run_ft("train", str(path))  # the same command, one process: it would resume from checkpoint-2
        _release(fifo)
        _, rest = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
    assert content["pid"] == first.pid  # ft, the launcher: not a rank
    assert second.returncode == 2 and f"process {first.pid} on" in second.stderr, second.stderr[-3000:]
    assert first.returncode == 0, rest[-3000:]
    stderr = said + rest
    assert "starting 2 processes" in stderr and "× 2 processes" in stderr and stderr.count("ft: done") == 1
    # ft tokenized once, in the launching process, before the ranks started; both ranks then reused it
    assert stderr.index("preparing the data once") < stderr.index("× 2 processes")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["resumed_from"] is None
    assert summary["steps"] == 4 and summary["data"]["prepared"].startswith("reused")
    assert (out / "final" / "model.safetensors").is_file()
