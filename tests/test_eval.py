"""``ft eval``: models scored on lm-eval tasks through the real CLI, against the ``lm_eval`` command itself on the same
model and task files, and against ft's own exact match of the run; what cannot run is refused before a model loads.

The model is the quickstart shortened (the ``sft_model`` fixture: about half of the held-out sums right), so a score
that ignored the model, or the chat template it was trained with, would not match."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_ft, tiny_sft, without_module

TASKS = ROOT / "tasks" / "arithmetic"
SUMS, CHOICE = TASKS / "sums.yaml", TASKS / "choice.yaml"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _scored(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def _lm_eval_cli(model: Path, out: Path, *tasks: str) -> dict:
    """The ``lm_eval`` command on ``model`` as its docs run a local model, in the task files' folder (it reads their
    data files from the working directory), with the chat template as ft eval applies it."""
    result = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={model}",
                             "--tasks", ",".join(tasks), "--device", "cpu", "--batch_size", "8",
                             "--apply_chat_template", "--log_samples", "--output_path", str(out)],
                            cwd=TASKS, capture_output=True, text=True, timeout=600, env=_env(OFFLINE))
    assert result.returncode == 0, result.stderr[-3000:]
    (written,) = out.rglob("results_*.json")
    return json.loads(written.read_text())


def _env(changes: dict) -> dict:
    import os

    return {**os.environ, **changes}


@pytest.fixture(scope="module")
def scored_run(sft_model) -> tuple[Path, dict]:
    """ft eval of the run (its final/) on both shipped tasks: (the run, its JSON)."""
    run = sft_model.parent
    (item,) = _scored(run_ft("eval", str(run), "--tasks", f"{SUMS},{CHOICE}", "--json"))
    return run, item


def test_ft_eval_agrees_with_the_lm_eval_command_and_writes_its_results_into_the_run(scored_run, sft_model, tmp_path):
    run, item = scored_run
    cli = _lm_eval_cli(sft_model, tmp_path / "cli", "sums.yaml", "choice.yaml")
    ours = item["results"]
    for task, metric in (("arithmetic_sums", "exact_match,none"), ("arithmetic_choice", "acc,none"),
                         ("arithmetic_choice", "acc_norm,none")):
        assert ours["results"][task][metric] == cli["results"][task][metric], (task, metric)
    assert ours["task_hashes"] == cli["task_hashes"]  # the same rows, prompts and targets, hashed by lm-eval
    assert ours["n-samples"]["arithmetic_sums"]["effective"] == 200
    # the model is half trained: neither task is at the floor or the ceiling, so the comparison says something
    assert 0.2 < ours["results"]["arithmetic_sums"]["exact_match,none"] < 0.95
    assert ours["results"]["arithmetic_choice"]["acc,none"] > 0.4  # chance is 0.25

    written = Path(item["written"])
    assert written.parent == run / "eval" and written.name.startswith("results_")
    saved = json.loads(written.read_text())
    assert saved["results"] == ours["results"] and saved["task_hashes"] == ours["task_hashes"]
    assert saved["lm_eval_version"] and saved["transformers_version"]


def test_the_sums_task_scores_what_the_runs_own_exact_match_scored(scored_run):
    """The quickstart's held-out sums, asked through lm-eval with the chat template, get the score ft train's
    ``data.eval_exact_match`` gave the same model on the same 200 questions."""
    run, item = scored_run
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exact_match"]["n"] == 200
    assert item["results"]["results"]["arithmetic_sums"]["exact_match,none"] == summary["exact_match"]["exact_match"]


def test_two_models_side_by_side_and_the_chat_template_matters(sft_model, random_lora_run):
    """A table with a column per model: the tuned run answers sums the random-init adapter run cannot; without the
    chat template the tuned model, trained on chats alone, loses most of them."""
    result = run_ft("eval", str(sft_model), str(random_lora_run), "--tasks", str(SUMS), "--limit", "40")
    assert result.returncode == 0, result.stderr[-3000:]
    header, row = result.stdout.strip().splitlines()
    assert header.split()[:3] == ["task", "metric", "n"] and str(random_lora_run) in header
    task, metric, n, tuned, _, _, untrained, *_ = row.split()
    assert (task, metric, n) == ("arithmetic_sums", "exact_match", "40")
    assert float(tuned) > 0.2 and float(untrained) == 0.0

    (plain,) = _scored(run_ft("eval", str(sft_model), "--tasks", str(SUMS), "--limit", "40", "--no-chat-template",
                              "--json"))
    assert plain["results"]["results"]["arithmetic_sums"]["exact_match,none"] < float(tuned)
    assert plain["written"] and Path(plain["written"]).parent == sft_model.parent / "eval"


def test_an_adapter_run_is_scored_on_its_base(lora_run):
    """A LoRA run is loaded as ft generate loads it (the base its run recorded, the adapter through PEFT)."""
    (item,) = _scored(run_ft("eval", str(lora_run), "--tasks", str(CHOICE), "--limit", "20", "--json"))
    assert item["results"]["n-samples"]["arithmetic_choice"]["effective"] == 20
    assert 0.0 <= item["results"]["results"]["arithmetic_choice"]["acc,none"] <= 1.0
    assert Path(item["written"]).parent == lora_run / "eval"


# --- refused before any model loads ---------------------------------------------------------------------------------


@pytest.mark.slow  # it trains nothing, but lm-eval indexes its registry (15k task files) to know a name: 13 s
def test_unknown_names_and_hub_tasks_offline_are_refused_by_name(tmp_path):
    result = run_ft("eval", str(tmp_path / "no-model-needed"), "--tasks", "gsm8k,arithmetic_sum", env=OFFLINE)
    assert result.returncode == 2
    assert "does not exist" in result.stderr  # the model argument is checked first, before the registry is read
    result = run_ft("eval", "org/some-model", "--tasks", "gsm8k,arithmetik", env=OFFLINE)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "`gsm8k`: its data is the Hub dataset `openai/gsm8k`" in result.stderr
    assert "HF_HUB_OFFLINE" in result.stderr
    assert "`arithmetik` is not a task" in result.stderr and "Did you mean 'arithmetic'" in result.stderr
    assert "Traceback" not in result.stderr


def test_task_files_that_cannot_run_are_named(tmp_path):
    missing = run_ft("eval", "org/some-model", "--tasks", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml: no such task file" in missing.stderr
    nameless = tmp_path / "nameless.yaml"
    nameless.write_text("dataset_path: json\noutput_type: generate_until\n")
    result = run_ft("eval", "org/some-model", "--tasks", str(nameless))
    assert result.returncode == 2 and "names no `task:`" in result.stderr
    lost = tmp_path / "lost.yaml"  # its data file beside it, as the shipped tasks keep theirs, is not there
    lost.write_text(SUMS.read_text().replace("../../data/arithmetic/prompts-eval.jsonl", "held-out.jsonl"))
    result = run_ft("eval", "org/some-model", "--tasks", str(lost))
    assert result.returncode == 2 and f"its data file {tmp_path / 'held-out.jsonl'} does not exist" in result.stderr
    hub = tmp_path / "hub.yaml"
    hub.write_text("task: from_hub\ndataset_path: someone/dataset\noutput_type: generate_until\n")
    result = run_ft("eval", "org/some-model", "--tasks", str(hub), env=OFFLINE)
    assert result.returncode == 2 and "the Hub dataset `someone/dataset`" in result.stderr
    assert "Traceback" not in missing.stderr + result.stderr


def test_without_lm_eval_the_install_line_is_given(tmp_path):
    blocked = without_module(tmp_path, "lm_eval")
    result = run_ft("eval", "org/some-model", "--tasks", str(SUMS), env={"PYTHONPATH": str(blocked)})
    assert result.returncode == 2
    assert "pip install 'ft[eval]'" in result.stderr and "Traceback" not in result.stderr


# --- a recipe's benchmarks, scored in the run ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_runs_own_scores_are_what_ft_eval_gives_its_checkpoint_and_final(write_recipe, tmp_path):
    """``benchmarks:`` scores the model before training, as checkpoint-15 is written and at the end, in process; ft
    eval of checkpoint-15 and of final/ afterwards gives the same numbers. summary.json, ft report and the plots carry
    them."""
    out = tmp_path / "run"
    recipe = tiny_sft(out, max_steps=30, save_strategy="steps", save_steps=15)
    recipe["benchmarks"] = {"tasks": [str(SUMS), str(CHOICE)], "when": ["before", "each_save", "end"], "limit": 20}
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "benchmarks before training: arithmetic_sums exact_match" in result.stderr
    benchmarks = json.loads((out / "summary.json").read_text())["benchmarks"]
    assert set(benchmarks["steps"]) == {"15"}  # step 30 ends training: its score is the end's
    assert benchmarks["before"] != benchmarks["end"]

    def scores(model: Path) -> dict:
        (item,) = _scored(run_ft("eval", str(model), "--tasks", f"{SUMS},{CHOICE}", "--limit", "20", "--json"))
        return {task: {metric.split(",")[0]: value for metric, value in values.items()
                       if "," in metric and "_stderr" not in metric}
                for task, values in item["results"]["results"].items()}

    assert scores(out / "checkpoint-15") == benchmarks["steps"]["15"]
    assert scores(out) == benchmarks["end"]
    assert len(list((out / "eval").glob("*.json"))) == 5  # before, step-15, end; then ft eval's two
    assert (out / "plots" / "benchmark_arithmetic_choice_acc.png").is_file()
    report = run_ft("report", str(out))
    before, end = benchmarks["before"]["arithmetic_choice"]["acc"], benchmarks["end"]["arithmetic_choice"]["acc"]
    (row,) = [line for line in report.stdout.splitlines() if line.startswith("arithmetic_choice acc ")]
    assert row.split()[2:] == [f"{before:.4g}", "→", f"{end:.4g}"], row


def test_a_recipes_benchmarks_are_checked_before_anything_loads(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "run", save_strategy="no")
    recipe["benchmarks"] = {"tasks": [str(tmp_path / "missing.yaml"), "gsm8k"], "when": ["each_save"]}
    result = run_ft("validate", str(write_recipe(recipe)))
    assert result.returncode == 2
    assert "benchmarks.tasks.0" in result.stderr and "missing.yaml: no such task file" in result.stderr
    assert "benchmarks.when" in result.stderr and "`train.save_strategy` is `no`" in result.stderr

    hub = tmp_path / "hub.yaml"  # a task file on Hub data: checked as a registry name is, without indexing them all
    hub.write_text("task: from_hub\ndataset_path: someone/dataset\noutput_type: generate_until\n")
    recipe["benchmarks"] = {"tasks": [str(hub)]}
    result = run_ft("train", str(write_recipe(recipe)), env=OFFLINE)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"benchmarks.tasks: {hub}: its data is the Hub dataset `someone/dataset`" in result.stderr
    assert not (tmp_path / "run").exists()  # refused before the run's folder was made


def test_task_files_are_read_relative_to_the_recipe_that_names_them(tmp_path):
    """A task file in a base recipe (``extends:``) is found next to the base, as its data files are."""
    base_dir, task = tmp_path / "base", tmp_path / "base" / "tasks" / "mine.yaml"
    task.parent.mkdir(parents=True)
    task.write_text(SUMS.read_text().replace("../../data", str(ROOT / "data")))
    base = tiny_sft(tmp_path / "run")
    base["benchmarks"] = {"tasks": ["tasks/mine.yaml", "arc_easy"]}
    (base_dir / "base.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "child.yaml").write_text("extends: base/base.yaml\n")
    result = run_ft("validate", str(tmp_path / "child.yaml"))
    assert result.returncode == 0, result.stderr[-2000:]
    resolved = yaml.safe_load(result.stdout)
    assert resolved["benchmarks"]["tasks"] == [str(task), "arc_easy"]
