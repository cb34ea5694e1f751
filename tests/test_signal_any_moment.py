"""A stop signal at any moment of a run: SIGTERM (and Ctrl-C's SIGINT) sent at a wall-clock moment a seeded generator
picks, not at a step end a callback chose. Whatever it lands in (loading the data or the model, the first step's
preflight, a forward or backward, GRPO's generation, an evaluation, a checkpoint being written, the end of the run),
the run must end in 143 (130 for SIGINT) with a complete checkpoint of the step it stopped at, or with the summary of
a stop before the first step, or in 0 when it finished first; and the same command then ends with the uninterrupted
run's weights, bit for bit.

Each method's run is long enough (about 7 s of steps in CI, 14 s in the moments check) that most moments fall before its
last steps: one process waits ``jit_kill_wait`` (3 s) after a signal before it saves, so a signal in the last 3 s lets
the run finish.

GRPO and RLOO also run on two processes (ft's launcher, gloo), where the launcher takes the signal and passes it on.
CI runs one seeded SIGTERM moment on one process (``FT_SIGNAL_MOMENTS`` unset), drawn from the first half of training,
for SFT and GRPO; ``FT_FULL_CHECK=1`` (conftest.FULL_CHECK) adds DPO's and RLOO's. The moments check spreads N SIGTERM
moments (and N/4 SIGINT ones) per method and per process count over the uninterrupted run's wall time (one in each
N-th of it, where in that slice a seeded generator says):

    FT_SIGNAL_MOMENTS=20 python -m pytest -q -p no:randomly tests/test_signal_any_moment.py

Each moment's outcome and the phase the signal landed in (read from the stopped run's own timeline of step, evaluation
and save events, on the clock this process signals by) are printed with ``-s`` and kept in the test's report."""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import ASSETS, DATA, assert_same_final_weights, run_ft, start_ft, tiny_sft

from ft.outputs.checkpoints import complete_checkpoints

pytestmark = pytest.mark.slow

MOMENTS = int(os.environ.get("FT_SIGNAL_MOMENTS", "1"))

TIMELINE = """
import json
import os
import time

from transformers import TrainerCallback


class Timeline(TrainerCallback):
    \"\"\"Appends each event of the run (train begin and end, step begin and end, evaluation, save) with the time on
    the system's monotonic clock: the test tells from it where its signal landed. It draws no random number.\"\"\"

    def __init__(self, path: str, begun: str = ""):
        self.path, self.begun = path, begun

    def _event(self, name, state):
        with open(self.path, "a") as file:
            file.write(json.dumps([name, state.global_step, time.monotonic()]) + "\\n")

    def on_train_begin(self, args, state, control, **kwargs):
        self._event("train_begin", state)
        try:  # the test waits on this pipe for training to begin; a run nobody waits for finds no reader there
            descriptor = os.open(self.begun, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return
        os.write(descriptor, b"begun\\n")
        os.close(descriptor)

    def on_step_begin(self, args, state, control, **kwargs):
        self._event("step_begin", state)

    def on_step_end(self, args, state, control, **kwargs):
        self._event("step_end", state)

    def on_evaluate(self, args, state, control, **kwargs):
        self._event("evaluate", state)

    def on_save(self, args, state, control, **kwargs):
        self._event("save", state)

    def on_train_end(self, args, state, control, **kwargs):
        self._event("train_end", state)
"""

LORA_WITH_DROPOUT = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.1}

# GRPO's and RLOO's reward: the completion's length in characters, which differs between any two samples of different
# tokens (a length in tokens does not: this random model writes all 6 of them nearly every time), so every group's
# advantages differ from 0 and every step trains
CHARACTERS = """
def characters(prompts, completions, **kwargs):
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 10 for c in completions]
"""


# the moments check's runs are twice as long (about 14 s of steps): a moment in a run's last kill_wait seconds lets it
# finish (exit 0), and more of them then stop the run and resume it
LENGTH = 2 if MOMENTS > 1 else 1


def _train(out: Path, steps: int, **more) -> dict:
    """About 7 s of steps (2 cores, one thread; ``LENGTH`` times that in the moments check), an evaluation and a
    checkpoint at each third of them."""
    steps *= LENGTH
    return {"output_dir": str(out), "max_steps": steps, "logging_steps": 5, "eval_strategy": "steps",
            "eval_steps": steps // 3, "save_strategy": "steps", "save_steps": steps // 3, "report_to": "none",
            "seed": 0, **more}


def _sft(out: Path) -> dict:
    recipe = tiny_sft(out)
    recipe["data"]["eval"][0]["fraction"] = 0.2
    return {**recipe, "adapter": LORA_WITH_DROPOUT, "train": _train(out, 150, per_device_train_batch_size=8)}


def _dpo(out: Path) -> dict:
    data = {"train": [{"path": str(DATA / "preference.jsonl"), "format": "preference"}],
            "eval": [{"path": str(DATA / "preference-eval.jsonl"), "format": "preference", "fraction": 0.2}],
            "max_length": 48}
    return {"method": "dpo", "model": {"name": str(ASSETS), "init": "random"}, "data": data,
            "adapter": LORA_WITH_DROPOUT, "optimizer": {"lr": 3.0e-3},
            "train": _train(out, 48, per_device_train_batch_size=8, disable_dropout=False)}


def _sampling(method: str, steps: int):
    def recipe(out: Path) -> dict:
        data = {"train": [{"path": str(DATA / "prompts.jsonl"), "format": "prompt"}],
                "eval": [{"path": str(DATA / "prompts-eval.jsonl"), "format": "prompt", "fraction": 0.1}]}
        section = {"num_generations": 4, "max_completion_length": 6, "steps_per_generation": 4, "temperature": 1.0,
                   "rewards": [{"fn": "characters:characters"}]}
        return {"method": method, "model": {"name": str(ASSETS), "init": "random"}, "data": data,
                "optimizer": {"lr": 1.0e-3}, method: section,
                # a log at each round's end: a stop is taken at one, so a round logged after it is always resumed
                "train": _train(out, steps, per_device_train_batch_size=8, logging_steps=4)}
    return recipe


def _two_processes(build):
    """The run on two processes (``launch.num_processes``: ft's launcher, gloo): the signal goes to the launcher, which
    passes it on; the ranks agree on the step they stop at, and each one's random state is in the checkpoint."""
    def recipe(out: Path) -> dict:
        return {**build(out), "launch": {"num_processes": 2}}
    return recipe


METHODS = {"sft-lora-dropout": _sft, "dpo-lora-dropout": _dpo, "grpo-4-steps-per-generation": _sampling("grpo", 132),
           "rloo-4-steps-per-generation": _sampling("rloo", 96),
           "grpo-two-processes": _two_processes(_sampling("grpo", 132)),
           "rloo-two-processes": _two_processes(_sampling("rloo", 96))}


def _count(name: str) -> int:
    """Moments per method: FT_SIGNAL_MOMENTS for SIGTERM, a quarter as many for SIGINT (Ctrl-C takes SIGTERM's path
    after its first handler)."""
    return MOMENTS if name == "SIGTERM" else max(1, MOMENTS // 4)


SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}
# CI: one SIGTERM moment for SFT (an evaluation, dropout) and GRPO (generation) on one process; FT_FULL_CHECK=1 adds
# DPO's and RLOO's (conftest.FULL_CHECK); FT_SIGNAL_MOMENTS adds SIGINT and the two-process runs
CI_METHODS = ("sft-lora-dropout", "grpo-4-steps-per-generation")
CASES = [pytest.param(method, name, index, id=f"{method}-{name}-{index}",
                      marks=() if MOMENTS > 1 or method in CI_METHODS else pytest.mark.full)
         for method in METHODS for name in SIGNALS for index in range(_count(name))
         if MOMENTS > 1 or (name == "SIGTERM" and "two-processes" not in method)]


def _plugins(folder: Path) -> None:
    """The code the recipes in ``folder`` name: the timeline callback and the reward."""
    (folder / "timeline.py").write_text(TIMELINE)
    (folder / "characters.py").write_text(CHARACTERS)


def _recipe(folder: Path, method: str, out: Path, timeline: Path, begun: Path | None = None) -> Path:
    recipe = METHODS[method](out)
    recipe["callbacks"] = [{"cls": "timeline:Timeline", "kwargs": {"path": str(timeline), "begun": str(begun or "")}}]
    path = folder / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each method's uninterrupted run, trained once for the module: its output directory, and where in time a stopped
    run's moments are drawn from. The moments check (``FT_SIGNAL_MOMENTS`` > 1) trains it again, its data then read from
    the cache the first run filled as the stopped runs read it, and draws from the whole of that run's wall time; it
    must end with the same weights (the runs are deterministic, so a difference after a stop is the stop's). CI's
    single moment is drawn from the first half of the first run's training time, counted from the stopped run's own
    start of training: a stop is then taken before the run ends."""
    runs: dict[str, tuple[Path, tuple[float, float]]] = {}

    def run(method: str) -> tuple[Path, tuple[float, float]]:
        if method not in runs:
            for name in ("out", "again")[:2 if MOMENTS > 1 else 1]:
                folder = tmp_path_factory.mktemp(f"uninterrupted-{method}")
                _plugins(folder)
                path = _recipe(folder, method, folder / name, folder / "events.jsonl")
                started = time.monotonic()
                result = run_ft("train", str(path))
                wall = time.monotonic() - started
                assert result.returncode == 0, result.stderr[-3000:]
                times = {event: at for event, _, at in _events(folder / "events.jsonl")}
                window = (0.0, wall) if MOMENTS > 1 else (0.0, times["train_end"] - times["train_begin"])
                phases = json.loads((folder / name / "summary.json").read_text())["phase_seconds"]
                print(f"{method}: uninterrupted in {wall:.2f} s: {phases}")
                runs.setdefault(method, (folder / name, window))
                if name == "again":
                    assert_same_final_weights(folder / name, runs[method][0])
                    runs[method] = (runs[method][0], window)
        return runs[method]
    return run


def _events(path: Path) -> list[tuple[str, int, float]]:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()] if path.exists() else []


def landed_in(events: list[tuple[str, int, float]], at: float, generation_every: int | None) -> str:
    """Where a signal sent at ``at`` landed, from the run's events around it."""
    before = [event for event in events if event[2] <= at]
    after = [event for event in events if event[2] > at]
    if not before:
        return "before the first step (machine checks, data, model)"
    (name, step, _), following = before[-1], (after[0][0] if after else None)
    if name == "train_begin" or (name == "step_begin" and step == 0):
        return "the first step (its preflight, then the step)"
    if name == "step_begin":
        if generation_every and step % generation_every == 0:
            return f"step {step + 1}, which generates its round's completions"
        return f"step {step + 1} (forward, backward, optimizer)"
    if name in ("step_end", "evaluate") and following == "evaluate":
        return f"the evaluation at step {step}"
    if name in ("step_end", "evaluate") and following == "save":
        return f"the checkpoint save at step {step}"
    if name == "train_end" or following is None:
        return "the end of the run (final evaluation, final/, summary)"
    return f"between steps, after step {step}"


def _moment(method: str, name: str, index: int, window: tuple[float, float]) -> float:
    """Seconds after the start: in the moments check, in the index-th of the case's equal slices of the window, where a
    generator seeded by the case's name says; in CI, in the first half of the window."""
    count = _count(name)
    fraction = random.Random(f"{method}/{name}/{index}/{count}").random()
    start, end = window
    share = (index + fraction) / count if MOMENTS > 1 else fraction / 2
    return start + (end - start) * share


@pytest.mark.parametrize(("method", "name", "index"), CASES)
def test_a_signal_at_any_moment_ends_in_a_checkpoint_the_run_resumes_from_bit_for_bit(uninterrupted, tmp_path, method,
                                                                                      name, index, record_property):
    reference, window = uninterrupted(method)
    _plugins(tmp_path)
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    path = _recipe(tmp_path, method, out, events)
    delay = _moment(method, name, index, window)

    begun = None
    if MOMENTS > 1:  # from the start of the command
        deadline = time.monotonic() + delay
        process = start_ft("train", str(path))
    else:  # from the start of training, which the run's timeline says through a pipe
        os.mkfifo(begun := tmp_path / "begun")
        pipe = os.open(begun, os.O_RDONLY | os.O_NONBLOCK)
        path = _recipe(tmp_path, method, out, events, begun)
        process = start_ft("train", str(path))
        assert select.select([pipe], [], [], 300)[0], "training did not begin within 300 s"
        deadline = time.monotonic() + delay
        os.close(pipe)
    while (left := deadline - time.monotonic()) > 0 and process.poll() is None:
        try:
            process.wait(timeout=left)
        except subprocess.TimeoutExpired:  # the moment came first
            pass
    sent_at = time.monotonic()
    process.send_signal(SIGNALS[name])
    _, stderr = process.communicate(timeout=600)
    generation_every = 4 if "grpo" in method or "rloo" in method else None
    where = landed_in(_events(events), sent_at, generation_every)
    code = process.returncode
    since = "the start" if MOMENTS > 1 else "training's start"
    report = (f"{method} {name} {delay:.2f} s after {since} (drawn from {window[0]:.2f}-{window[1]:.2f} s): {where}; "
              f"exit {code}")
    record_property("moment", report)
    print(report)

    stop_code = 128 + SIGNALS[name]
    interrupted = name == "SIGINT" and code in (1, -signal.SIGINT) and "KeyboardInterrupt" in stderr  # Python's own
    killed = code == -SIGNALS[name] or interrupted or (code == stop_code and not (out / "summary.json").exists())
    if killed:  # ended by it before ft took the signals over (Python's start; on two processes, the ranks')
        assert not (out / "summary.json").exists() and not complete_checkpoints(out), (report, stderr[-3000:])
        assert where.startswith("before the first step"), (report, stderr[-3000:])
        resumed = run_ft("train", str(path))
        assert resumed.returncode == 0, (report, resumed.stderr[-3000:])
        assert_same_final_weights(out, reference)
        return
    assert code in (0, stop_code), (report, stderr[-3000:])
    summary = json.loads((out / "summary.json").read_text())
    if code == stop_code:
        assert summary["status"] == "stopped" and summary["stopped_by"] == name, (report, summary)
        if summary.get("stopped_in"):  # before the first step: nothing to keep
            assert summary["checkpoint"] is None and not complete_checkpoints(out), report
        else:
            saved = complete_checkpoints(out)
            assert saved and summary["checkpoint"] == str(saved[-1]), (report, summary)
            assert saved[-1].name == f"checkpoint-{summary['steps']}", (report, saved)
            if generation_every:  # at the end of a generation round: the next step generates anew
                assert summary["steps"] % generation_every == 0, (report, summary["steps"])
        events.unlink(missing_ok=True)
        control = generation_every and not summary.get("stopped_in") and index == 0
        if control:  # the same run resumed without the checkpoint's random state (below)
            shutil.copytree(out, tmp_path / "without-rng" / "out")
            for state in (tmp_path / "without-rng" / "out" / saved[-1].name).glob("rng_state*.pth"):
                state.unlink()  # every process's
        resumed = run_ft("train", str(path))
        assert resumed.returncode == 0, (report, resumed.stderr[-3000:])
        last = yaml.safe_load(path.read_text())["train"]["max_steps"]
        if generation_every and not summary.get("stopped_in") and summary["steps"] < last:  # steps were resumed
            _assert_trained_after(out, summary["steps"], report)
        if control:
            _assert_differs_without_random_state(tmp_path, method, reference, begun, report)
    else:
        assert summary["status"] == "completed", (report, summary)
    assert_same_final_weights(out, reference)


def _assert_trained_after(out: Path, step: int, report: str) -> None:
    """The resumed steps of a GRPO or RLOO run moved the weights: every logged step after the checkpoint had a
    gradient (the samples of each group earned different rewards). Equal weights after them then say the same samples
    were drawn."""
    history = json.loads((out / "log_history.json").read_text())
    norms = [entry["grad_norm"] for entry in history if "grad_norm" in entry and entry["step"] > step]
    assert norms and all(norm > 0 for norm in norms), (report, norms)


def _assert_differs_without_random_state(tmp_path: Path, method: str, reference: Path, begun: Path | None,
                                         report: str) -> None:
    """The control: resumed from the same checkpoint with its random state removed (rng_state.pth, or one per
    process; transformers then warns and goes on with the generators as seeded), the run samples other completions
    and ends with other weights, so the check above can tell a resume that put the random state back from one that
    did not."""
    folder = tmp_path / "without-rng"
    _plugins(folder)
    path = _recipe(folder, method, folder / "out", tmp_path / "events.jsonl", begun)  # callbacks as the run's
    resumed = run_ft("train", str(path))
    assert resumed.returncode == 0, (report, resumed.stderr[-3000:])
    with pytest.raises(AssertionError, match="tensors differ from the uninterrupted run"):
        assert_same_final_weights(folder / "out", reference)


SIGTERM_AT_EVALUATE = """
import os
import signal

from transformers import TrainerCallback


class SigtermAtEvaluate(TrainerCallback):
    \"\"\"SIGTERM to this process as an evaluation ends: with ``eval_strategy: no``, the final evaluation, after
    training and before final/ and the scores.\"\"\"

    def on_evaluate(self, args, state, control, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
"""


def test_a_signal_after_the_last_step_saves_final_and_skips_the_scoring(write_recipe, tmp_path):
    """A signal after the last step (the random moments above land there at times) leaves the run completed: final/
    is written, and what only scores it (here exact match) is skipped and named, so that a preempted machine's grace
    period goes to final/. Before, the stop watch closed as training returned and the signal's default action killed
    the run there, without final/ or a summary."""
    (tmp_path / "sigterm_at_evaluate.py").write_text(SIGTERM_AT_EVALUATE)
    recipe = tiny_sft(tmp_path / "out", max_steps=3, eval_strategy="no")
    recipe["data"]["eval_exact_match"] = {"n": 4}
    recipe["callbacks"] = [{"cls": "sigterm_at_evaluate:SigtermAtEvaluate"}]
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["exact_match"] is None, summary
    assert summary["late_signal"] == {"signal": "SIGTERM", "skipped": ["exact match"]}, summary
    assert summary["final_eval"] is not None and summary["phase_seconds"]["exact_match"] is None
    assert (tmp_path / "out" / "final" / "model.safetensors").is_file()
    assert "SIGTERM came after the last step: the run is complete and final/ is saved; skipped so that it ends now: " \
           "exact match." in " ".join(result.stderr.split())


SIGTERM_AT_EXIT = """
import atexit
import os
import signal

from transformers import TrainerCallback

atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))  # as the process exits, after the run has ended


class Nothing(TrainerCallback):
    pass
"""


def test_a_signal_as_the_process_exits_leaves_a_completed_run_completed(write_recipe, tmp_path):
    """A SIGTERM while ``ft train`` exits, after the run has ended and said how (summary.json; here from an atexit
    handler): the completed run still exits 0, where the signal killed it (143 to the shell, which a scheduler takes
    for a stop to resume, and the rerun then refuses the completed run)."""
    (tmp_path / "sigterm_at_exit.py").write_text(SIGTERM_AT_EXIT)
    recipe = tiny_sft(tmp_path / "out", max_steps=2, eval_strategy="no")
    recipe["callbacks"] = [{"cls": "sigterm_at_exit:Nothing"}]
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "completed"


SIGTERM_TO_THE_LAUNCHER_AT_EVALUATE = """
import os
import signal

from transformers import TrainerCallback


class SigtermToTheLauncherAtEvaluate(TrainerCallback):
    \"\"\"Rank 0 sends SIGTERM to ft's launcher (its parent) as the final evaluation ends, after the last step; the
    launcher passes it on to both ranks.\"\"\"

    def on_evaluate(self, args, state, control, **kwargs):
        if os.environ.get("RANK") == "0":
            os.kill(os.getppid(), signal.SIGTERM)
"""


def test_a_signal_after_the_last_step_on_two_processes_leaves_the_run_completed_and_exits_0(write_recipe, tmp_path):
    """On two processes the launcher takes the signal and passes it on; when it comes after the last step the ranks
    complete the run as one process does (final/ saved, the summary completed with ``late_signal``) and end 0, and so
    must ft: it ended 143, which a scheduler takes for a stop to resume (found by the moments check: RLOO on two
    processes, a SIGTERM in the run's last seconds)."""
    (tmp_path / "sigterm_to_the_launcher.py").write_text(SIGTERM_TO_THE_LAUNCHER_AT_EVALUATE)
    recipe = tiny_sft(tmp_path / "out", max_steps=2, eval_strategy="no")
    recipe["launch"] = {"num_processes": 2}
    recipe["callbacks"] = [{"cls": "sigterm_to_the_launcher:SigtermToTheLauncherAtEvaluate"}]
    result = run_ft("train", str(write_recipe(recipe)))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["late_signal"]["signal"] == "SIGTERM", summary
    assert (tmp_path / "out" / "final" / "model.safetensors").is_file()
    assert result.returncode == 0, result.stderr[-3000:]
