"""What a run shows: summary.json as a contract (completed, stopped, failed), the plots and the data they draw, and
`ft report` on one run, on several side by side, and on a run still in progress."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import struct

import pytest
import yaml
from conftest import DATA, run_ft, start_ft, tiny_sft
from test_checkpoints import SLOW_STEPS, hold_at, signal_at_step

from ft.outputs import plots
from ft.outputs.checkpoints import complete_checkpoints, previous_run

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model

EXPLODE = """
from transformers import TrainerCallback


class Explode(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise RuntimeError("disk quota exceeded at step 2\\nsecond line of the message")
"""

PNG = b"\x89PNG\r\n\x1a\n"


def _recipe(folder, name: str, **train) -> dict:
    """tiny_sft logging every step, evaluating on 16 held-out rows (a fast evaluation)."""
    eval_rows = folder / "eval16.jsonl"
    if not eval_rows.exists():
        eval_rows.write_text("".join((DATA / "eval.jsonl").read_text().splitlines(keepends=True)[:16]))
    recipe = tiny_sft(folder / name, logging_steps=1, **train)
    recipe["data"]["eval"][0]["path"] = str(eval_rows)
    return recipe


def _write(folder, name: str, recipe: dict):
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two completed runs of 4 steps, evaluated at steps 2 and 4, that differ only in the learning rate."""
    folder = tmp_path_factory.mktemp("report")
    outs = []
    for name, lr in (("lr-3e-3", 3.0e-3), ("lr-1e-3", 1.0e-3)):
        recipe = _recipe(folder, name, eval_strategy="steps", eval_steps=2)
        recipe["optimizer"]["lr"] = lr
        result = run_ft("train", str(_write(folder, name, recipe)))
        assert result.returncode == 0, result.stderr[-3000:]
        outs.append(folder / name)
    return outs


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run stopped by SIGTERM (JIT checkpoint) a few steps in: (output dir, ft's stderr)."""
    folder = tmp_path_factory.mktemp("stopped")
    (folder / "slow_steps.py").write_text(SLOW_STEPS)
    recipe = _recipe(folder, "out", max_steps=300)
    recipe["callbacks"] = [{"cls": "slow_steps:SlowSteps"}]
    out = folder / "out"
    hold_at(out, 3)
    process = start_ft("train", str(_write(folder, "out", recipe)))
    signal_at_step(process, out, 3, signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 143, stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory):
    """A run whose callback raises at step 2: (output dir, the finished process)."""
    folder = tmp_path_factory.mktemp("failed")
    (folder / "exploding.py").write_text(EXPLODE)
    recipe = _recipe(folder, "out", max_steps=10)
    recipe["callbacks"] = [{"cls": "exploding:Explode"}]
    return folder / "out", run_ft("train", str(_write(folder, "out", recipe)))


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())


def _assert_contract(summary: dict) -> None:
    """The fields every summary.json has, whatever the status, and how they relate."""
    for key in ("status", "steps", "epochs", "first_train_loss", "last_train_loss", "min_train_loss", "eval_loss",
                "last_eval", "train_seconds", "tokens", "tokens_per_second", "samples", "samples_per_second",
                "padding_efficiency", "peak_memory_gb", "peak_memory_source", "phase_seconds", "wall_seconds",
                "versions", "device", "resumed_from", "failure", "plots", "world_size", "data"):
        assert key in summary, key
    assert summary["tokens"] > 0 and summary["train_seconds"] > 0 and summary["samples"] > 0
    # both rounded (0.1 token/s, 1 ms); and the samples likewise over the same clock
    assert math.isclose(summary["tokens_per_second"], summary["tokens"] / summary["train_seconds"], rel_tol=1e-3)
    assert math.isclose(summary["samples_per_second"], summary["samples"] / summary["train_seconds"], rel_tol=1e-3)
    assert 0 < summary["padding_efficiency"] <= 1
    assert summary["peak_memory_gb"] > 0 and summary["peak_memory_source"] == "process_max_rss"  # no GPU here
    assert summary["min_train_loss"] <= min(summary["first_train_loss"], summary["last_train_loss"])
    phases = summary["phase_seconds"]
    assert list(phases) == ["prepare_data", "load_model", "exact_match_before", "benchmarks_before", "train",
                            "evaluate", "save", "exact_match", "benchmarks"]
    assert phases["exact_match"] is None and phases["benchmarks"] is None  # the recipe asks for neither
    assert phases["prepare_data"] > 0 and phases["load_model"] > 0
    assert sum(value for value in phases.values() if value is not None) <= summary["wall_seconds"]
    assert set(summary["versions"]) == {"python", "ft", "torch", "transformers", "trl", "peft", "accelerate",
                                        "datasets"}
    assert all(isinstance(version, str) and version[0].isdigit() for version in summary["versions"].values())
    assert summary["device"] == "CPU (no CUDA device)"
    assert summary["plots"] and all(name.startswith("plots/") for name in summary["plots"])


def _assert_png(path) -> tuple[int, int]:
    """A valid, non-empty PNG (a drawn figure, not an empty canvas): its width and height."""
    data = path.read_bytes()
    assert data.startswith(PNG) and data[12:16] == b"IHDR" and len(data) > 5000, path
    return struct.unpack(">II", data[16:24])


def test_summary_of_a_completed_run(two_runs):
    out, _ = two_runs
    summary = _summary(out)
    _assert_contract(summary)
    assert summary["status"] == "completed" and summary["failure"] is None and summary["resumed_from"] is None
    assert summary["steps"] == 4 and summary["epochs"] > 0
    assert summary["phase_seconds"]["train"] == summary["train_seconds"]
    assert summary["phase_seconds"]["save"] > 0
    # the evaluation at the last step (eval_steps 2, step 4) is the final one: not run a second time, so no seconds
    assert summary["phase_seconds"]["evaluate"] == 0.0
    assert summary["final_eval"]["eval_loss"] == summary["eval_loss"] == summary["last_eval"]["eval_loss"]
    assert summary["last_eval"]["step"] == 4 and "eval_mean_token_accuracy" in summary["final_eval"]
    assert summary["samples"] == 4 * 8  # 4 steps of 8 rows


def test_summary_of_a_stopped_run(stopped_run):
    summary = _summary(stopped_run)
    _assert_contract(summary)
    assert summary["status"] == "stopped" and summary["stopped_by"] == "SIGTERM" and summary["failure"] is None
    assert summary["phase_seconds"]["train"] == summary["train_seconds"]
    assert summary["phase_seconds"]["evaluate"] is None and summary["phase_seconds"]["save"] is None
    for name in summary["plots"]:
        _assert_png(stopped_run / name)


def test_a_failed_run_writes_its_summary_and_plots_and_still_exits_1(failed_run):
    out, result = failed_run
    assert result.returncode == 1, result.stderr[-3000:]
    message = result.stderr.strip().splitlines()[-1]  # still the one paragraph of an unexpected failure
    assert "training failed with RuntimeError: disk quota exceeded at step 2" in message
    assert "Traceback" not in result.stderr and not (out / "final").exists()
    summary = _summary(out)
    _assert_contract(summary)
    assert summary["status"] == "failed" and summary["steps"] == 2
    assert summary["failure"] == {"type": "RuntimeError", "message": "disk quota exceeded at step 2",
                                  "traceback": str(out / "error.log")}
    assert "Traceback" in (out / "error.log").read_text()
    assert summary["phase_seconds"]["train"] is None  # training did not end
    assert summary["first_train_loss"] is not None  # step 1 was logged before the failure
    assert "plots/loss.png" in summary["plots"]
    for name in summary["plots"]:
        _assert_png(out / name)
    assert previous_run(out) == []  # `--resume never` starts afresh there: nothing of the failed run to mix with


def test_plots_are_pngs_of_the_log_history(two_runs):
    out, _ = two_runs
    summary = _summary(out)
    history = json.loads((out / "log_history.json").read_text())
    assert [entry["loss"] for entry in history if "loss" in entry][0] == summary["first_train_loss"]
    series = plots.plot_series(history)
    assert summary["plots"] == [f"plots/{name}.png" for name in series]
    assert {"loss", "learning_rate", "grad_norm", "tokens_per_second", "eval_mean_token_accuracy"} <= set(series)
    for name in series:
        assert _assert_png(out / "plots" / f"{name}.png") == (600, 350)
    # what each figure draws is the log history's values, step by step
    train_lines = [entry for entry in history if "loss" in entry]
    evals = [entry for entry in history if "eval_loss" in entry]
    assert series["loss"]["loss"] == [(entry["step"], entry["loss"]) for entry in train_lines]
    assert series["loss"]["eval_loss"] == [(entry["step"], entry["eval_loss"]) for entry in evals]
    assert series["tokens_per_second"]["tokens_per_second"] == [(entry["step"], entry["tokens_per_second"])
                                                                for entry in train_lines]
    assert [step for step, _ in series["tokens_per_second"]["tokens_per_second"]] == [1, 2, 3, 4]
    assert series["eval_mean_token_accuracy"]["eval_mean_token_accuracy"] == [
        (entry["step"], entry["eval_mean_token_accuracy"]) for entry in evals]
    assert [step for step, _ in series["loss"]["eval_loss"]] == [2, 4]  # the one at step 4 is the final evaluation


def test_plot_series_picks_eval_metrics_and_leaves_out_what_is_no_number():
    history = [{"loss": 2.0, "learning_rate": 1e-3, "tokens_per_second": 10.0, "step": 1},
               {"loss": float("nan"), "step": 2},
               {"eval_loss": 1.5, "eval_rewards/margins": 0.25, "eval_runtime": 3.0, "eval_num_tokens": 9.0, "step": 2},
               {"train_runtime": 4.0, "step": 2}]
    assert plots.plot_series(history) == {
        "loss": {"loss": [(1, 2.0)], "eval_loss": [(2, 1.5)]},
        "learning_rate": {"learning_rate": [(1, 1e-3)]},
        "tokens_per_second": {"tokens_per_second": [(1, 10.0)]},
        "eval_rewards_margins": {"eval_rewards/margins": [(2, 0.25)]},
    }


def test_report_shows_two_runs_side_by_side_with_the_recipe_key_that_differs(two_runs, tmp_path):
    first, second = two_runs
    result = run_ft("report", str(first), str(second), "--plots", str(tmp_path / "plots"))
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert rows["run"] == ["lr-3e-3", "lr-1e-3"]
    assert rows["status"] == ["completed", "completed"] and rows["steps"] == ["4", "4"]
    assert rows["optimizer.lr"] == ["0.003", "0.001"]
    assert "train.output_dir" not in result.stdout  # differs by design
    for row in ("train loss (first)", "train loss (last)", "train loss (min)", "eval loss", "tokens/s",
                "peak memory (GiB)", "wall time", "eval mean_token_accuracy", "headline token_accuracy"):
        assert row in rows, row
    first_summary = _summary(first)
    assert rows["eval loss"][0] == f"{first_summary['eval_loss']:.4g}"
    assert sorted(path.name for path in (tmp_path / "plots").iterdir()) == [
        "eval_loss.png", "learning_rate.png", "loss.png", "tokens_per_second.png"]
    for path in (tmp_path / "plots").iterdir():
        _assert_png(path)

    merged = json.loads(run_ft("report", str(first), str(second), "--json").stdout)
    assert merged["recipe_differences"] == {"optimizer.lr": {"lr-3e-3": 0.003, "lr-1e-3": 0.001}}
    assert [run["summary"] for run in merged["runs"]] == [first_summary, _summary(second)]


def _rows(table: str) -> dict[str, list[str]]:
    """``ft report``'s table: row name -> its cells, cut where the dashes under the header are."""
    lines = table.splitlines()
    spans = [match.span() for match in re.finditer(r"-+", lines[1])]
    cut = [(start, spans[i + 1][0] if i + 1 < len(spans) else None) for i, (start, _) in enumerate(spans)]
    rows = {}
    for line in lines[:1] + lines[2:]:
        cells = [line[start:end].strip() for start, end in cut]
        if cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def test_report_on_a_run_in_progress_reads_its_newest_checkpoint(stopped_run, tmp_path):
    running = tmp_path / "running"  # the stopped run as it was before it wrote its summary
    shutil.copytree(stopped_run, running, ignore=shutil.ignore_patterns("summary.json", "log_history.json", "plots"))
    (checkpoint,) = complete_checkpoints(running)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    result = run_ft("report", str(running), str(stopped_run), "--json")
    assert result.returncode == 0, result.stderr
    progress, stopped = json.loads(result.stdout)["runs"]
    assert progress["status"] == f"in progress (step {state['global_step']})" and progress["in_progress"]
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert progress["summary"]["first_train_loss"] == losses[0] and progress["summary"]["last_train_loss"] == losses[-1]
    assert stopped["status"] == "stopped" and stopped["label"] != progress["label"]

    table = run_ft("report", str(running)).stdout
    assert f"in progress (step {state['global_step']})" in table


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_report_on_a_missing_or_empty_directory_is_one_paragraph_and_exit_2(tmp_path, make):
    target = tmp_path / "run"
    if make == "empty":
        target.mkdir()
    result = run_ft("report", str(target))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and str(target) in result.stderr
    assert ("does not exist" if make == "missing" else "holds no ft run") in result.stderr
