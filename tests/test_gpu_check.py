"""scripts/gpu_check.py and scripts/gpu-check.sh on a CPU machine: the dry run lists every step the GPU check must
cover (each shipped recipe's smoke test, each GPU optimizer), every command it would run is a valid ft command whose
recipe a GPU machine accepts (the machine rules checked with a pretended GPU, as tests/test_rules.py does), the
deadline skips instead of overrunning, and without CUDA both entry points exit 3 at once with the reason."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ft.machine.hardware import Hardware

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
WRAPPER = ROOT / "scripts" / "gpu-check.sh"
GPU = Hardware(cuda=True, bf16=True, devices=1, name="NVIDIA H200")
GPU_OPTIMIZERS = ["adamw_torch_fused", "adamw_8bit", "paged_adamw_8bit", "adalomo", "galore_adamw_8bit", "lomo"]


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


gpu_check = _module()


def _dry_run(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--json", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> dict:
    """The dry run's steps, with the throughput step's files written where its command reads them."""
    work = tmp_path_factory.mktemp("gpu-check")
    gpu_check.prepare_throughput(str(work), rows=20)
    for processes in (1, 2):
        gpu_check.prepare_jit(str(work), processes)
    return _dry_run("--workdir", str(work))


def _sets(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]


def test_the_dry_run_lists_every_shipped_recipe_and_every_gpu_path(plan):
    steps = {step["name"]: step for step in plan["steps"]}
    for recipe in sorted((ROOT / "recipes").glob("*.yaml")):
        smoke = steps[f"smoke-{recipe.stem}"]
        assert smoke["argv"][:4] == ["ft", "train", f"recipes/{recipe.name}", "--smoke"]
    optimizers = {s for step in plan["steps"] for s in _sets(step["argv"]) if s.startswith("optimizer.name=")}
    assert {f"optimizer.name={name}" for name in GPU_OPTIMIZERS} <= optimizers
    assert "train.use_liger_kernel=true" in _sets(steps["optim-liger"]["argv"])
    assert "train.bf16=true" in _sets(steps["bf16"]["argv"])
    assert {"model.quantization.bits=4", "adapter.kind=lora"} <= set(_sets(steps["qlora-4bit"]["argv"]))
    assert "model.quantization.bits=8" in _sets(steps["qlora-8bit"]["argv"])
    assert steps["merge"]["argv"][:2] == ["ft", "merge"] and steps["merge"]["needs"] == ["qlora-4bit"]
    assert steps["generate-merged"]["needs"] == ["merge"]
    assert "--throughput-worker" in steps["throughput"]["argv"]
    assert "--jit-worker" in steps["jit"]["argv"] and steps["jit-2"]["argv"][-2:] == ["--processes", "2"]
    assert all(step["budget_s"] <= 180 for step in plan["steps"])
    # the human listing names the same steps and prints each command
    text = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT).stdout
    assert all(name in text for name in steps) and "ft train recipes/quickstart.yaml --smoke" in text


def test_every_command_is_a_valid_ft_command_a_gpu_machine_accepts(plan):
    import typer.main

    from ft.cli import app
    from ft.machine import hardware
    from ft.recipe import load_recipe

    cli = typer.main.get_command(app)
    checked = 0
    for step in plan["steps"]:
        argv = step["argv"]
        if argv[0] == "ft":
            command = cli.commands[argv[1]]
            command.make_context(argv[1], list(argv[2:]))  # raises on an unknown option or a bad value
            if argv[1] != "train":
                continue
            recipe_path, sets = ROOT / argv[2], _sets(argv)
        else:  # the throughput and JIT workers: ft.run.train, or ft train, of the recipe they name
            assert argv[:2] == ["python", "scripts/gpu_check.py"]
            assert argv[2] in ("--throughput-worker", "--jit-worker")
            recipe_path, sets = Path(argv[3]), []
        loaded = load_recipe(recipe_path, sets)
        problems = hardware.check_hardware(loaded.recipe, GPU)
        assert not problems, (step["name"], [p.render() for p in problems])
        if not step["argv"][3:4] == ["--smoke"]:
            assert not loaded.warnings, (step["name"], [w.render() for w in loaded.warnings])
        checked += 1
    assert checked == sum(1 for s in plan["steps"] if s["argv"][:2] == ["ft", "train"]) + 3


@pytest.mark.slow
@pytest.mark.full  # the full check (conftest.FULL_CHECK): scripts/gpu-check.sh's step, rehearsed on the CPU
def test_the_jit_step_stops_a_run_by_sigterm_and_resumes_it(tmp_path, monkeypatch):
    """The JIT step's worker and check on the CPU (the CUDA RNG state is what the GPU adds): the run is held at its
    step until SIGTERM lands, exits 143 with a complete checkpoint and no final/, and the same command resumes from
    that checkpoint to the last step. A run that ignores the signal fails the check."""
    monkeypatch.setattr(gpu_check, "JIT", {"max_steps": 120, "hold_at": 10})
    step = gpu_check.jit_step(1)
    step.prepare(str(tmp_path))
    argv = gpu_check.real_argv(step.command(str(tmp_path)))
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    proc = gpu_check.Proc(argv, done.returncode, done.stdout, done.stderr, 0.0)
    result, note, found = gpu_check.check_jit(1, on_gpu=False)(str(tmp_path), proc)
    assert result == gpu_check.PASS, (note, done.stderr[-2000:])
    assert found["first_exit"] == 143 and not found["final_after_stop"]
    assert 10 < int(found["checkpoint"].split("-")[1]) < 120 and found["rng_files"] == 1
    assert found["final_steps"] == 120 and found["resumed_from"].endswith(found["checkpoint"])
    assert found["stop_seconds"] >= 3  # ft waits transformers' kill_wait after the signal before it saves
    broken = {**found, "first_exit": 0, "checkpoint": None}
    (tmp_path / "jit" / "result.json").write_text(json.dumps(broken))
    assert gpu_check.check_jit(1, on_gpu=False)(str(tmp_path), proc)[0] == gpu_check.FAIL


def test_only_runs_the_named_steps_and_what_they_need():
    names = [step["name"] for step in _dry_run("--only", "generate-merged,smoke-quickstart")["steps"]]
    assert names == ["qlora-4bit", "merge", "generate-merged", "smoke-quickstart"]
    assert {s["name"] for s in _dry_run("--only", "optim")["steps"]} == {f"optim-{n}" for n in GPU_OPTIMIZERS} | {
        "optim-liger"}
    bad = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--only", "nope"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "names no step" in bad.stderr


def _sleeper(name: str, seconds: float, budget: int, **kwargs):
    return gpu_check.Step(name, budget, "sleeps", lambda work: ["python", "-c", f"import time; time.sleep({seconds})"],
                          lambda work, proc: (gpu_check.PASS, "slept"), **kwargs)


def test_the_deadline_skips_steps_instead_of_overrunning(tmp_path, monkeypatch):
    steps = [_sleeper("quick", 0, 5), _sleeper("over-budget", 30, 1),
             _sleeper("needs-failed", 0, 5, needs=("over-budget",)),
             _sleeper("missing-module", 0, 5, requires=("no_such_module_here",)),
             _sleeper("too-late", 0, 100)]  # 8 s left at most: under both its budget and MIN_START
    runner = gpu_check.Runner(steps, str(tmp_path), time.monotonic() + 8, jobs=1, say=lambda _: None)
    results = {r.name: r for r in runner.run()}
    assert results["quick"].result == "PASS"
    assert results["over-budget"].result == "FAIL" and "timeout" in results["over-budget"].note
    assert results["needs-failed"].result == "SKIP" and "over-budget" in results["needs-failed"].note
    assert results["missing-module"].result == "SKIP" and "no_such_module_here" in results["missing-module"].note
    assert results["too-late"].result == "SKIP" and results["too-late"].note.startswith("deadline")
    assert (tmp_path / "logs" / "quick.log").is_file()
    # a step whose budget the deadline cut, stopped at the deadline: SKIP (deadline), not a failure of the step
    monkeypatch.setattr(gpu_check, "MIN_START", 0)
    started = time.monotonic()
    cut = gpu_check.Runner([_sleeper("cut", 30, 60, parallel=True), _sleeper("cut2", 30, 60, parallel=True)],
                           str(tmp_path), time.monotonic() + 1.5, jobs=2, say=lambda _: None).run()
    assert time.monotonic() - started < 10
    assert [r.result for r in cut] == ["SKIP", "SKIP"] and "budget of 60 s was cut" in cut[0].note


def test_the_report_table_and_mfu():
    results = [gpu_check.Result("bf16", "PASS", 12.34, "loss 6.2 → 3.1"),
               gpu_check.Result("optim-lomo", "FAIL", 3.0, "exit 1: a | b", "ft train …", "Traceback …")]
    env = {"cuda": True, "gpu": "NVIDIA H200", "devices": 1, "capability": "9.0", "memory_gb": 139.8, "bf16": True,
           "torch": "2.13.0+cu128", "transformers": "5.24.0"}
    meta = {"date": "2026-12-01 00:00 UTC", "command": "scripts/gpu_check.py", "deadline": 450, "jobs": 4,
            "wall": 100}
    text = gpu_check.report(results, env, meta)
    assert "| step | result | seconds | note |" in text and "| bf16 | PASS | 12.3 | loss 6.2 → 3.1 |" in text
    assert "a \\| b" in text and "NVIDIA H200" in text and "torch 2.13.0+cu128" in text
    assert "bitsandbytes not installed" in text and "1 PASS, 1 FAIL, 0 SKIP" in text and "Traceback" in text
    assert gpu_check.peak_flops("NVIDIA H200") == gpu_check.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert gpu_check.peak_flops("NVIDIA H100 PCIe") == 756e12 and gpu_check.peak_flops("NVIDIA L4") == 121e12
    assert gpu_check.peak_flops("NVIDIA L40S") == 362e12 and gpu_check.peak_flops("Tesla T4") is None
    assert gpu_check.peak_flops("Tesla T4", 65) == 65e12
    assert gpu_check.mfu(400e6, 100_000, 989e12) == pytest.approx(6 * 400e6 * 100_000 / 989e12)
    assert gpu_check.mfu(400e6, 100_000, None) is None


def test_the_throughput_model_is_about_half_a_billion_parameters():
    c = gpu_check.THROUGHPUT_CONFIG
    h, layers, inter, vocab = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    blocks = layers * (4 * h * h + 3 * h * inter + 2 * h)  # q, k, v, o; gate, up, down; two norms
    assert 0.4e9 < blocks + 2 * vocab * h < 0.6e9


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_without_cuda_both_entry_points_exit_3_with_the_reason():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    env = {**os.environ, "FT_PYTHON": sys.executable}
    started = time.monotonic()
    wrapper = subprocess.run(["bash", str(WRAPPER)], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert wrapper.returncode == 3, wrapper.stderr
    assert "no CUDA" in wrapper.stderr and "sees no CUDA device" in wrapper.stderr and sys.executable in wrapper.stderr
    assert "--dry-run" in wrapper.stderr
    direct = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env={**os.environ, "OUT": ""})
    assert direct.returncode == 3 and "no CUDA device" in direct.stderr
    assert time.monotonic() - started < 60
    # --dry-run goes through the wrapper without CUDA
    listed = subprocess.run(["bash", str(WRAPPER), "--dry-run", "--only", "bf16"], capture_output=True, text=True,
                            timeout=60, env=env, cwd=ROOT)
    assert listed.returncode == 0 and "train.bf16=true" in listed.stdout


def test_a_recipe_on_a_gguf_file_is_smoke_tested_only_where_the_file_is(tmp_path):
    """A GPU machine without the real model's file (assets/smollm2/ is ignored by git) skips its smoke step, saying
    which command puts it there, instead of failing the check."""
    import dataclasses

    step = gpu_check.smoke_step(gpu_check.ROOT / "recipes" / "smollm2-sft.yaml")
    assert step.files == (str(gpu_check.ROOT / "assets" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"),)
    assert gpu_check.smoke_step(gpu_check.ROOT / "recipes" / "quickstart.yaml").files == ()
    gguf = tmp_path / "m.gguf"
    elsewhere = dataclasses.replace(step, files=(str(gguf),))
    runner = gpu_check.Runner([elsewhere], str(tmp_path / "work"), deadline=time.monotonic() + 60, jobs=1,
                              say=lambda _: None)
    assert "scripts/get_smollm2.py" in runner.skip_reason(elsewhere)
    gguf.write_bytes(b"GGUF")
    assert runner.skip_reason(elsewhere) is None
