"""Resume resolution (`auto` takes the newest *complete* checkpoint; a bad path is a clear exit-2 error) and
preemption: SIGTERM saves a JIT checkpoint, exits 143, and the same command resumes to completion."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ASSETS, assert_same_final_weights, run_ft, start_ft, tiny_sft

from ft.outputs.checkpoints import INCOMPLETE_MARKER, ResumeError, complete_checkpoints, resolve_resume


def _checkpoint(out, step: int, complete: bool = True, state: str = '{"global_step": 1}'):
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(state)
    if not complete:
        (path / INCOMPLETE_MARKER).write_text("in progress")
    return path


def test_auto_skips_incomplete_and_orders_numerically(tmp_path):
    _checkpoint(tmp_path, 9)
    newest_complete = _checkpoint(tmp_path, 10)
    _checkpoint(tmp_path, 12, complete=False)  # a JIT save still running (or killed)
    _checkpoint(tmp_path, 14, state='{"global_step": 14, "log_hi')  # killed while writing its state file
    (tmp_path / "checkpoint-16").mkdir()  # killed before the state file
    resume = resolve_resume("auto", tmp_path)
    assert resume.path == str(newest_complete)
    assert [(Path(item.checkpoint).name, item.file) for item in resume.passed_over] == [
        ("checkpoint-14", "trainer_state.json")]  # a state file cut short is named; unfinished saves are not
    with pytest.raises(ResumeError, match="holds another run"):  # a fresh run would mix with these
        resolve_resume("never", tmp_path)
    assert resolve_resume("auto", tmp_path / "empty").path is None


def test_the_incomplete_marker_is_the_file_transformers_keeps_in_a_jit_checkpoint_while_saving(tmp_path):
    """ft skips a checkpoint holding INCOMPLETE_MARKER, so it must be the name transformers gives that file (a literal
    in ``CheckpointManager.execute_jit_checkpoint``, not a constant to import). Watched from inside a real JIT save:
    the files in the folder midway, less those left at the end, are that marker alone."""
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import ExportableState
    from transformers.trainer_jit_checkpoint import CheckpointManager

    class ListFolderMidSave(TrainerCallback, ExportableState):
        """The Trainer asks stateful callbacks for their state while it writes a checkpoint (after the weights,
        optimizer and RNG states, before trainer_state.json)."""

        def __init__(self):
            self.folder, self.seen = None, []

        def state(self) -> dict:
            if self.folder is not None and self.folder.is_dir():
                self.seen.append({path.name for path in self.folder.iterdir()})
            return {"args": {}, "attributes": {}}

    watch = ListFolderMidSave()
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ASSETS))
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = Trainer(model=model, args=args, callbacks=[watch])
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    watch.folder = tmp_path / "checkpoint-0"
    CheckpointManager(trainer).execute_jit_checkpoint()

    (midway,) = watch.seen
    left = {path.name for path in watch.folder.iterdir()}
    assert midway - left == {INCOMPLETE_MARKER}
    assert complete_checkpoints(tmp_path) == [watch.folder]


def test_explicit_path_must_be_a_complete_checkpoint(tmp_path):
    assert resolve_resume(str(_checkpoint(tmp_path, 3)), tmp_path).path == str(tmp_path / "checkpoint-3")
    with pytest.raises(ResumeError, match="not a complete checkpoint"):
        resolve_resume(str(tmp_path / "nope"), tmp_path)


def test_bad_resume_path_exits_2(write_recipe, tmp_path):
    result = run_ft("train", str(write_recipe(tiny_sft(tmp_path / "out"))), "--resume", str(tmp_path / "nope"))
    assert result.returncode == 2 and "--resume" in result.stderr and "Traceback" not in result.stderr


SLOW_STEPS = """
import signal
import time
from pathlib import Path

from transformers import TrainerCallback


def _stop_seen() -> bool:
    \"\"\"Whether this process got its stop signal: ft's StopWatch (the SIGTERM handler's owner) noted it.\"\"\"
    watch = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return getattr(watch, "received", None) is not None


class SlowSteps(TrainerCallback):
    \"\"\"Makes each step last at least 50 ms and tells the test how far training is: the last step in `progress`, and
    `training-started` from step 5 on. At the step `hold-at` names (written by `hold_at` before the run starts), the
    run waits until the process has received its stop signal: however fast the machine, the run cannot end before
    the signal the test sends at that step lands.\"\"\"

    held = False

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.05)
        out = Path(args.output_dir)
        if args.process_index == 0:  # one writer: several processes would race on the temporary file
            (out / "progress.tmp").write_text(str(state.global_step))
            (out / "progress.tmp").replace(out / "progress")
        if state.global_step == 5:
            (out / "training-started").write_text("")
        hold = out / "hold-at"
        if not self.held and hold.exists() and state.global_step >= int(hold.read_text()):
            self.held = True
            deadline = time.monotonic() + 300
            while not _stop_seen() and time.monotonic() < deadline:
                time.sleep(0.01)
"""


def hold_at(out, step: int) -> None:
    """Before a run starts: SlowSteps holds its step ``step`` until the process has received a stop signal."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "hold-at").write_text(str(step))


def sigterm_once_started(process: subprocess.Popen, out) -> None:
    """Send SIGTERM to ``process`` once SlowSteps says training is under way (its 5th step)."""
    signal_at_step(process, out, 5, signal.SIGTERM)


def signal_at_step(process: subprocess.Popen, out, step: int, signum: int = signal.SIGTERM) -> None:
    """Send ``signum`` to ``process`` once SlowSteps reports ``step`` (or a later one)."""
    deadline = time.monotonic() + 300
    while _progress(out) < step:
        assert process.poll() is None and time.monotonic() < deadline, f"training never reached step {step}"
        time.sleep(0.05)
    process.send_signal(signum)


def _progress(out) -> int:
    try:
        return int((out / "progress").read_text())
    except (OSError, ValueError):
        return 0


STEP_LOG = """
import os
from pathlib import Path

from transformers import TrainerCallback


class StepLog(TrainerCallback):
    \"\"\"Appends "<process id> <step>" to steps-rank<N>.log at the end of each optimizer step a process takes.\"\"\"

    def on_step_end(self, args, state, control, **kwargs):
        with (Path(args.output_dir) / f"steps-rank{args.process_index}.log").open("a") as log:
            log.write(f"{os.getpid()} {state.global_step}\\n")
"""


def steps_by_run(log) -> list[list[int]]:
    """The steps a StepLog file records, one list per process that took them, in the order they ran."""
    runs: dict[str, list[int]] = {}
    for line in log.read_text().splitlines():
        pid, step = line.split()
        runs.setdefault(pid, []).append(int(step))
    return list(runs.values())


def _stop(args, out, at_step: int, signum=signal.SIGTERM) -> tuple[subprocess.Popen, str]:
    hold_at(out, at_step)
    process = start_ft(*args)
    signal_at_step(process, out, at_step, signum)
    _, stderr = process.communicate(timeout=300)
    return process, stderr


@pytest.mark.slow
def test_sigterm_twice_then_resume_ends_where_an_uninterrupted_run_ends(write_recipe, tmp_path):
    (tmp_path / "slow_steps.py").write_text(SLOW_STEPS)
    (tmp_path / "step_log.py").write_text(STEP_LOG)
    out, total = tmp_path / "out", 150
    # save_strategy "no": no periodic checkpoints. ft saves the checkpoint at the first step end 3 s after the signal:
    # steps of >= 50 ms (SlowSteps) at most 60 steps later, so both stops come well before step 150
    recipe = tiny_sft(out, max_steps=total)
    recipe["callbacks"] = [{"cls": "slow_steps:SlowSteps"}, {"cls": "step_log:StepLog"}]
    recipe["data"]["eval_exact_match"] = {"n": 8}  # scored by the first part alone (greedy: it draws no numbers)
    path = write_recipe(recipe)
    args = ["train", str(path), "--set", "train.logging_steps=10"]
    resume = shlex.join(["ft", *args])

    stops, parts = [], []
    for at_step in (5, None):  # the second stop comes 10 steps after the first
        process, stderr = _stop(args, out, at_step or stops[-1] + 10)
        assert process.returncode == 143, stderr[-3000:]
        checkpoint = complete_checkpoints(out)[-1]
        stops.append(int(checkpoint.name.split("-")[1]))
        assert not (out / "final").exists() and "Traceback" not in stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "stopped" and summary["checkpoint"] == str(checkpoint)
        assert summary["stopped_by"] == "SIGTERM" and summary["resume_command"] == resume
        assert summary["steps"] == stops[-1]  # saved at the step end it stopped at
        parts.append(summary)
        # the resume command is the one that was run, --set included, and the wait before the save is explained
        assert "stopped by SIGTERM" in stderr and resume in stderr and "waits 3 s after the signal" in stderr
    assert 5 <= stops[0] < stops[1] < total

    (out / "hold-at").unlink()  # this run is not stopped: nothing to hold for
    resumed = run_ft(*args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {out / f'checkpoint-{stops[1]}'}" in resumed.stderr
    assert "missing keys" not in resumed.stderr  # the tied lm_head.weight, stored once, is no news (notices.py)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == total
    assert summary["resumed_from"] == str(out / f"checkpoint-{stops[1]}")
    # what the stopped parts measured is kept: the baseline exact match the first part scored (a resume cannot: its
    # weights are not the start) with its answers, and each part's steps and times, which ft report sums (issue 47)
    baseline = parts[0]["exact_match_before"]
    assert summary["exact_match_before"] == parts[1]["exact_match_before"] == baseline and baseline["n"] == 8
    lines = [json.loads(line) for line in (out / "exact_match.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and all({"before", "after"} <= set(line) for line in lines)
    assert [(part["steps"], part["train_seconds"], part["stopped_by"]) for part in summary["earlier_parts"]] == [
        (part["steps"], part["train_seconds"], "SIGTERM") for part in parts]
    report = run_ft("report", str(out)).stdout
    assert re.search(r"status +completed, in 3 parts", report), report
    assert re.search(r"exact match before +[\d.]+ \(n=8, ended [\d.]+\)", report), report
    # each run took up at the step after the checkpoint's (a fresh start would have taken steps 1-150) ...
    first, second, third = steps_by_run(out / "steps-rank0.log")
    assert second[0] == stops[0] + 1 and third == list(range(stops[1] + 1, total + 1))
    # ... with the checkpoint's weights, optimizer, scheduler and place in the data: it ends where an uninterrupted
    # run of the same recipe and seed ends, tensor for tensor (SlowSteps and StepLog only sleep and write files)
    uninterrupted = tiny_sft(tmp_path / "uninterrupted", max_steps=total, logging_steps=10)
    reference = run_ft("train", str(write_recipe(uninterrupted, name="uninterrupted.yaml")))
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert_same_final_weights(out, tmp_path / "uninterrupted")

    again = run_ft(*args)
    assert again.returncode == 2 and "already holds a completed run" in again.stderr
    assert "add `--resume never --overwrite`" in again.stderr  # the one command that retrains it (not two refusals)


HOLD_AFTER_STOP = """
import time
from pathlib import Path

from slow_steps import _stop_seen
from transformers import TrainerCallback


class HoldAfterStop(TrainerCallback):
    \"\"\"Once `hold-after-stop` is in the output directory: at the first step end after the process has received its
    stop signal, writes `stop-seen` and holds that step end (at most 30 s). The run cannot reach the later step end
    where its stop would be saved, so only a second Ctrl-C ends it before then.\"\"\"

    held = False

    def on_step_end(self, args, state, control, **kwargs):
        out = Path(args.output_dir)
        if not self.held and _stop_seen() and (out / "hold-after-stop").exists():
            self.held = True
            (out / "stop-seen").write_text("")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.01)
"""


@pytest.mark.slow
def test_first_ctrl_c_saves_and_exits_130_a_second_exits_at_once(write_recipe, tmp_path):
    (tmp_path / "slow_steps.py").write_text(SLOW_STEPS)
    (tmp_path / "hold_after_stop.py").write_text(HOLD_AFTER_STOP)
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=150)
    recipe["callbacks"] = [{"cls": "slow_steps:SlowSteps"}, {"cls": "hold_after_stop:HoldAfterStop"}]
    args = ["train", str(write_recipe(recipe))]

    process, stderr = _stop(args, out, 5, signal.SIGINT)  # one Ctrl-C: a JIT checkpoint, as for SIGTERM
    assert process.returncode == 130, stderr[-3000:]
    (checkpoint,) = complete_checkpoints(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGINT" and summary["checkpoint"] == str(checkpoint)
    assert "stopped by SIGINT" in stderr and "Traceback" not in stderr and not (out / "final").exists()

    # resumed, then Ctrl-C twice: the second ends the process at once, where the first alone would save. The second
    # is sent once the first has been handled (`stop-seen`: two signals sent before the first is taken would be one),
    # and while HoldAfterStop holds the run short of the step end where the first's checkpoint would be saved
    at = _progress(out) + 3
    hold_at(out, at)
    (out / "hold-after-stop").write_text("")
    process = start_ft(*args)
    signal_at_step(process, out, at, signal.SIGINT)
    deadline = time.monotonic() + 60
    while not (out / "stop-seen").exists():
        assert process.poll() is None and time.monotonic() < deadline, "the first Ctrl-C was never seen"
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr[-3000:]
    assert "stopped at once" in stderr and "Traceback" not in stderr
    assert complete_checkpoints(out) == [checkpoint]  # nothing new was written as complete
    assert json.loads((out / "summary.json").read_text())["checkpoint"] == str(checkpoint)


@pytest.mark.slow
def test_sigterm_with_jit_checkpointing_off_still_ends_the_run(write_recipe, tmp_path):
    """ft's SIGTERM watch passes the signal on: with nothing to save, the process ends at once, as without ft."""
    (tmp_path / "slow_steps.py").write_text(SLOW_STEPS)
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=200, enable_jit_checkpoint=False)
    recipe["callbacks"] = [{"cls": "slow_steps:SlowSteps"}]
    hold_at(out, 5)
    process = start_ft("train", str(write_recipe(recipe)))
    sigterm_once_started(process, out)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGTERM, stderr[-3000:]
    assert not (out / "summary.json").exists() and not list(out.glob("checkpoint-*"))


# --- a damaged checkpoint -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A 4-step run with checkpoints at steps 2 and 4 (weights, optimizer, scheduler, RNG state, trainer state)."""
    out = tmp_path_factory.mktemp("saved") / "run"
    recipe = tmp_path_factory.mktemp("recipe") / "recipe.yaml"
    recipe.write_text(json.dumps(tiny_sft(out, max_steps=4, save_strategy="steps", save_steps=2)))
    result = run_ft("train", str(recipe))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _cut(path) -> None:
    """The file cut to half its length, as a copy or a disk fault that stopped short leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
                                  "trainer_state.json"])
def test_each_file_resuming_reads_is_checked_to_read_back(saved_run, tmp_path, name):
    from ft.outputs.checkpoints import unreadable_files

    checkpoint = tmp_path / "checkpoint-4"
    shutil.copytree(saved_run / "checkpoint-4", checkpoint)
    assert name in {p.name for p in checkpoint.iterdir()} and unreadable_files(checkpoint) == []
    _cut(checkpoint / name)
    (damaged,) = unreadable_files(checkpoint)
    assert damaged[0] == name and damaged[1], damaged


def test_a_flipped_byte_in_a_torch_archive_fails_its_checksum(saved_run, tmp_path):
    from ft.outputs.checkpoints import unreadable_files

    checkpoint = tmp_path / "checkpoint-4"
    shutil.copytree(saved_run / "checkpoint-4", checkpoint)
    data = bytearray((checkpoint / "optimizer.pt").read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside a stored tensor: the archive's structure is intact
    (checkpoint / "optimizer.pt").write_bytes(bytes(data))
    assert [name for name, _ in unreadable_files(checkpoint)] == ["optimizer.pt"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json"])
def test_a_damaged_newest_checkpoint_is_named_and_the_run_resumes_from_the_one_before(saved_run, tmp_path, name):
    """Each kind of file a resume reads, cut short in the newest checkpoint: the run names it, resumes from the
    checkpoint before, and ends with the uninterrupted run's weights (``saved_run``'s final/), bit for bit."""
    out = tmp_path / "run"
    shutil.copytree(saved_run, out)
    for stale in ("summary.json", "final"):  # as a run stopped after its step-4 checkpoint would leave it
        shutil.rmtree(out / stale) if (out / stale).is_dir() else (out / stale).unlink()
    _cut(out / "checkpoint-4" / name)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps(tiny_sft(out, max_steps=4, save_strategy="steps", save_steps=2)))

    resumed = run_ft("train", str(recipe))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{out / 'checkpoint-4' / name}: " in resumed.stderr, resumed.stderr[-3000:]
    assert f"resuming from {out / 'checkpoint-2'}" in resumed.stderr and "Traceback" not in resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"] == str(out / "checkpoint-2")
    assert [(Path(u["checkpoint"]).name, u["file"]) for u in summary["unreadable_checkpoints"]] == [
        ("checkpoint-4", name)]
    assert_same_final_weights(out, saved_run)
    if name != "model.safetensors":
        return

    # none reads back: exit 2, naming each damaged file and the ways on
    for name in ("summary.json", "final"):
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
    for checkpoint in complete_checkpoints(out):
        _cut(checkpoint / "optimizer.pt")
    refused = run_ft("train", str(recipe))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "no checkpoint" in refused.stderr and "reads back" in refused.stderr and "--resume never --overwrite" in \
        refused.stderr and f"{out / 'checkpoint-2' / 'optimizer.pt'}" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_trainer_is_built_without_transformers_own_stop_on_sigterm(write_recipe, tmp_path):
    """ft stops at a step end itself (ft.trainers.preemption): the Trainer's JIT callback, whose checkpoint can hold
    the random state of a step it has not finished, is gone, and so is the SIGTERM handler it installed; the recipe's
    setting still reads as set."""
    from conftest import built_trainer
    from transformers.trainer_jit_checkpoint import JITCheckpointCallback

    before = signal.getsignal(signal.SIGTERM)
    trainer, _ = built_trainer(write_recipe(tiny_sft(tmp_path / "out")))
    assert trainer.args.enable_jit_checkpoint is True
    assert not [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, JITCheckpointCallback)]
    assert signal.getsignal(signal.SIGTERM) == before


# --- a completed step is never trained again ------------------------------------------------------------------------


def _weights(path) -> dict:
    from safetensors.torch import load_file

    return load_file(path)


@pytest.mark.slow
def test_a_run_killed_after_its_last_checkpoint_writes_final_from_it_without_training(saved_run, tmp_path):
    """Killed after checkpoint-4 of 4 (or its final/ write failed on a full disk, which ft's message says to resume
    from): the same command writes final/ from checkpoint-4, the uninterrupted run's final/, and trains no step 5."""
    out = tmp_path / "run"
    shutil.copytree(saved_run, out)
    for name in ("summary.json", "final"):
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps(tiny_sft(out, max_steps=4, save_strategy="steps", save_steps=2)))

    resumed = run_ft("train", str(recipe), "--set", "train.logging_steps=1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step 5/4" not in resumed.stderr and "nothing is left to train" in resumed.stderr, resumed.stderr[-3000:]
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-2", "checkpoint-4"]
    assert_same_final_weights(out, saved_run)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4
    assert summary["resumed_from"] == str(out / "checkpoint-4")


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["cut", "missing"])
def test_a_completed_runs_final_that_does_not_read_back_is_written_again(saved_run, tmp_path, damage):
    out = tmp_path / "run"
    shutil.copytree(saved_run, out)
    weights = out / "final" / "model.safetensors"
    _cut(weights) if damage == "cut" else weights.unlink()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps(tiny_sft(out, max_steps=4, save_strategy="steps", save_steps=2)))

    again = run_ft("train", str(recipe))
    assert again.returncode == 0, again.stderr[-3000:]
    named = "final/model.safetensors does not read back" if damage == "cut" else "final/ holds no weights file"
    assert f"{out}/{named}" in again.stderr and "writing it again from" in again.stderr, again.stderr
    assert "nothing is left to train" in again.stderr
    assert_same_final_weights(out, saved_run)
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-2", "checkpoint-4"]
    # whole again: the run is complete, and --resume auto says so
    refused = run_ft("train", str(recipe))
    assert refused.returncode == 2 and "already holds a completed run" in refused.stderr
    flags = re.search(r"add `(--resume never --overwrite)`", refused.stderr).group(1).split()
    if damage == "cut":  # the command the refusal gives retrains, at the first try
        retrained = run_ft("train", str(recipe), *flags)
        assert retrained.returncode == 0, retrained.stderr[-3000:]
        assert_same_final_weights(out, saved_run)


def test_a_final_dir_is_judged_by_the_weights_it_holds(saved_run, tmp_path):
    from ft.outputs.checkpoints import final_problem

    final = tmp_path / "final"
    assert final_problem(final) == "is missing"
    shutil.copytree(saved_run / "final", final)
    assert final_problem(final) is None
    _cut(final / "model.safetensors")
    assert final_problem(final).startswith("model.safetensors does not read back")
    (final / "model.safetensors").unlink()
    assert final_problem(final).startswith("holds no weights")


HELD_IMPORT = """
import os
import time
from pathlib import Path

from transformers import TrainerCallback

HERE = Path(__file__).parent
if (HERE / "hold").exists():  # imported while ft prepares the run: say so, then stay until a signal ends the run
    (HERE / "held").write_text(str(os.getpid()))
    while True:
        time.sleep(0.01)


class Quiet(TrainerCallback):
    pass
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_before_the_first_step_says_where_and_the_rerun_starts_over(write_recipe, tmp_path, signum):
    """A stop while the run is being prepared (here: importing the recipe's code, which a callback module holds) once
    ended ft with a bare 143 and no summary (issue 47, item 11). Now: one line naming the signal and the phase, a
    summary.json ``stopped`` with ``stopped_in``, exit 128 + the signal, no traceback; the same command then says
    it starts over, and trains."""
    (tmp_path / "held_import.py").write_text(HELD_IMPORT)
    (tmp_path / "hold").write_text("")
    out = tmp_path / "out"
    recipe = tiny_sft(out)
    recipe["callbacks"] = [{"cls": "held_import:Quiet"}]
    args = ["train", str(write_recipe(recipe))]
    process = start_ft(*args)
    deadline = time.monotonic() + 300
    while not (tmp_path / "held").exists():
        assert process.poll() is None and time.monotonic() < deadline, "the run never imported the callback"
        time.sleep(0.05)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=300)
    name = signal.Signals(signum).name
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert f"ft: stopped by {name} while importing the recipe's code, before the first step" in stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["stopped_by"] == name and summary["steps"] == 0
    assert summary["stopped_in"] == "importing the recipe's code" and summary["checkpoint"] is None

    (tmp_path / "hold").unlink()
    again = run_ft(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"was stopped by {name} while importing the recipe's code, before its first step; it left no " \
        "checkpoint, so this run starts over" in again.stderr
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


SIGNAL_IN_A_DEL = """
import os
import signal

from transformers import TrainerCallback


class Collected:
    def __del__(self):  # as a garbage collection during an import runs one: the handler's raise happens in here
        os.kill(os.getpid(), signal.SIGTERM)


Collected()  # collected at once, while ft imports the recipe's code; Python prints "Exception ignored" and goes on


class Quiet(TrainerCallback):
    pass
"""


@pytest.mark.slow
def test_a_stop_whose_raise_python_lost_in_a_del_still_stops_the_run_before_training(write_recipe, tmp_path):
    """A SIGTERM handled inside a ``__del__`` (found by the moments check: regex's ``SetBase.__del__`` during a
    collection while the ranks imported the recipe's code): Python prints the handler's ``StoppedBeforeTraining`` as
    "Exception ignored" and goes on, and the run trained to the end as if never signalled. The stop is noted as well
    as raised, and the next phase's check ends the run there: exit 143, stopped in the phase it came in."""
    (tmp_path / "signal_in_a_del.py").write_text(SIGNAL_IN_A_DEL)
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=2)
    recipe["callbacks"] = [{"cls": "signal_in_a_del:Quiet"}]
    result = run_ft("train", str(write_recipe(recipe)))
    assert "Exception ignored" in result.stderr, result.stderr[-3000:]  # Python lost the raise, as in the run found
    assert result.returncode == 143, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["stopped_in"] == "importing the recipe's code", summary
    assert summary["steps"] == 0 and summary["checkpoint"] is None and not (out / "final").exists()
