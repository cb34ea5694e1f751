"""Device-aware defaults: TRL's bf16/activation checkpointing are off on CPU unless the recipe asks; and the one
precedence rule of every TRL config ft builds: the recipe's values win, defaults fill only what it left unset."""

from __future__ import annotations

import pytest
import yaml
from conftest import ASSETS, CPU, ROOT, built_trainer, run_ft, tiny_sft
from trl import SFTConfig

from ft.machine import hardware
from ft.machine.hardware import Hardware
from ft.recipe import load_recipe
from ft.trainers.build import trl_config

AMPERE = Hardware(cuda=True, bf16=True, devices=1, name="NVIDIA A100")
TURING = Hardware(cuda=True, bf16=False, devices=1, name="Tesla T4")


def _recipe(write_recipe, tmp_path, **train):
    return load_recipe(write_recipe(tiny_sft(tmp_path / "out", **train))).recipe


def test_trl_defaults_would_be_slow_on_cpu():
    # the reason this module exists: TRL's own defaults turn both on everywhere
    config = SFTConfig(output_dir="unused", use_cpu=True)
    assert config.bf16 is True and config.gradient_checkpointing is True


def test_cpu_defaults_turn_off_mixed_precision_and_checkpointing(write_recipe, tmp_path):
    defaults = hardware.device_defaults(_recipe(write_recipe, tmp_path), CPU)
    assert defaults == {"bf16": False, "activation_checkpointing": False, "dataloader_pin_memory": False,
                        "use_cpu": True}


@pytest.mark.parametrize("gpu, bf16", [(AMPERE, True), (TURING, False)])
def test_cuda_defaults_use_bf16_where_supported(write_recipe, tmp_path, gpu, bf16):
    defaults = hardware.device_defaults(_recipe(write_recipe, tmp_path), gpu)
    assert defaults["bf16"] is bf16


@pytest.mark.parametrize("explicit", [{"gradient_checkpointing": True}, {"fp16": True}])
def test_a_default_gives_way_to_its_alias_or_rival(write_recipe, tmp_path, explicit):
    defaults = hardware.device_defaults(_recipe(write_recipe, tmp_path, **explicit), CPU)
    rival = {"gradient_checkpointing": "activation_checkpointing", "fp16": "bf16"}[next(iter(explicit))]
    assert rival not in defaults


def test_recipe_values_win_and_defaults_fill_only_what_the_recipe_left_unset(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out", bf16=False, logging_steps=7)
    recipe["optimizer"] = {"lr": 0.25}
    recipe["data"]["max_length"] = 48
    loaded = load_recipe(write_recipe(recipe)).recipe
    defaults = {"bf16": True, "learning_rate": 1.0, "max_length": 99, "logging_steps": 99, "seed": 1234,
                "use_cpu": True}
    config = trl_config(SFTConfig, loaded, defaults, max_length=loaded.data.max_length)
    assert config.bf16 is False and config.logging_steps == 7  # train: over a default
    assert config.learning_rate == 0.25  # a section (optimizer.lr) over a default
    assert config.max_length == 48  # a method's own mapping (data.max_length) over a default
    assert config.seed == 1234  # unset in the recipe: the default fills it
    plain = trl_config(SFTConfig, loaded, {"use_cpu": True})
    assert plain.seed == SFTConfig(output_dir="x", use_cpu=True).seed  # no default from ft: TRL's own


def test_train_section_wins_where_it_meets_a_mapped_section(write_recipe, tmp_path):
    loaded = load_recipe(write_recipe(tiny_sft(tmp_path / "out", remove_unused_columns=True, use_cpu=True))).recipe
    assert trl_config(SFTConfig, loaded, {}, remove_unused_columns=False).remove_unused_columns is True


def test_built_trainer_carries_the_defaults_and_the_explicit_value(write_recipe, tmp_path):
    trainer, _ = built_trainer(write_recipe(tiny_sft(tmp_path / "out", activation_checkpointing=True)))
    assert trainer.args.bf16 is False and trainer.args.use_cpu is True  # ft's CPU defaults
    assert trainer.args.enable_jit_checkpoint is True  # ft's default
    assert trainer.args.activation_checkpointing is True  # the recipe's explicit value over ft's CPU default
    assert trainer.args.learning_rate == pytest.approx(3e-3)  # optimizer.lr reached the config


def test_hardware_rules_on_cpu(write_recipe, tmp_path):
    quantized = tiny_sft(tmp_path / "out", fp16=True, use_liger_kernel=True)
    quantized["model"]["quantization"] = {"bits": 4}  # the installed bitsandbytes runs 4-bit on the CPU
    quantized["adapter"] = {"kind": "lora"}
    recipe = load_recipe(write_recipe(quantized)).recipe
    problems = {p.path: p.message for p in hardware.check_hardware(recipe, CPU)}
    assert set(problems) == {"train.fp16", "train.use_liger_kernel"}
    assert all("CUDA" in message for message in problems.values())
    assert hardware.check_hardware(recipe, AMPERE) == []


def test_quantization_is_allowed_where_bitsandbytes_supports_the_device(monkeypatch, write_recipe, tmp_path):
    import bitsandbytes

    recipe = tiny_sft(tmp_path / "out")
    recipe["model"]["quantization"] = {"bits": 4}
    recipe["adapter"] = {"kind": "lora"}
    loaded = load_recipe(write_recipe(recipe)).recipe
    assert "cpu" in bitsandbytes.supported_torch_devices and hardware.check_hardware(loaded, CPU) == []
    monkeypatch.setattr(bitsandbytes, "supported_torch_devices", {"cuda"})  # as a CUDA-only release would say
    (problem,) = hardware.check_hardware(loaded, CPU)
    assert problem.path == "model.quantization" and "cannot load 4/8-bit weights on this machine's cpu" in \
        problem.message


def test_train_refuses_cuda_only_settings_before_loading(write_recipe, tmp_path):
    path = write_recipe(tiny_sft(tmp_path / "out", fp16=True))
    result = run_ft("train", str(path))
    assert result.returncode == 2
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("  fp16:"))
    assert f"{path}:{line}: train.fp16:" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written or loaded
    assert yaml.safe_load(path.read_text())  # the recipe itself is fine; only this machine can't run it


def test_a_busy_cpu_is_said_with_the_thread_count_that_helps():
    """Other processes keeping the cores busy make torch's threads wait on each other (issue 47, item 12): said at
    the start, with the OMP_NUM_THREADS that fits the idle cores; nothing on an idle machine or with one thread."""
    busy = hardware.busy_cpu_notice(load=2.6, cores=2, threads=2)
    assert busy and "load average 2.6 on 2 cores" in busy and "OMP_NUM_THREADS=1" in busy
    assert "OMP_NUM_THREADS=4" in hardware.busy_cpu_notice(load=4.0, cores=8, threads=8)
    assert hardware.busy_cpu_notice(load=0.3, cores=2, threads=2) is None  # idle
    assert hardware.busy_cpu_notice(load=1.2, cores=8, threads=6) is None  # six cores idle for six threads
    assert hardware.busy_cpu_notice(load=3.0, cores=2, threads=1) is None  # one thread already


@pytest.mark.slow
def test_omp_num_threads_is_the_runs_thread_count(write_recipe, tmp_path):
    """The documented setting the notice gives is honoured: torch runs the threads OMP_NUM_THREADS says, and
    summary.json records how many."""
    import json

    out = tmp_path / "out"
    result = run_ft("train", str(write_recipe(tiny_sft(out, max_steps=1))), env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["torch_threads"] == 1


SAPPHIRE_RAPIDS = Hardware(cuda=False, bf16=True, devices=0, name="cpu")  # a CPU with AMX: bfloat16 is native


def test_bfloat16_asked_for_on_a_cpu_that_emulates_it_is_said_with_its_keys(write_recipe, tmp_path):
    """Measured on this machine's CPU (AVX2, no AVX512-BF16 or AMX): bfloat16 generation 0.33x and reward scoring 0.13x
    float32's speed (benchmarks/README.md, generation_options). Every key that asks for it is named; a CPU with the
    units, a GPU and a recipe without bfloat16 get no notice."""
    recipe = tiny_sft(tmp_path / "out", bf16=True)
    recipe["model"]["dtype"] = "bfloat16"
    asked = load_recipe(write_recipe(recipe)).recipe
    notice = hardware.slow_bf16_notice(asked, CPU)
    assert notice.startswith("ft: notice: model.dtype, train.bf16 ask for bfloat16, and this CPU has no bfloat16")
    assert "3-7x slower than float32" in notice and "Remove them" in notice
    assert hardware.slow_bf16_notice(asked, SAPPHIRE_RAPIDS) is None
    assert hardware.slow_bf16_notice(asked, AMPERE) is None
    assert hardware.slow_bf16_notice(_recipe(write_recipe, tmp_path), CPU) is None
    scored = yaml.safe_load((ROOT / "recipes" / "quickstart-grpo-rm.yaml").read_text())
    scored["model"]["name"] = str(ASSETS)
    path = tmp_path / "rm.yaml"
    path.write_text(yaml.safe_dump(scored))
    notice = hardware.slow_bf16_notice(load_recipe(path).recipe, CPU)
    assert notice and notice.startswith("ft: notice: grpo.rewards.0.dtype asks for bfloat16") and "Remove it" in notice


@pytest.mark.parametrize(("flags", "native"), [("fpu avx2 avx512f", False), ("avx2 avx512_bf16", True),
                                                ("amx_bf16 amx_tile", True)])
def test_the_cpus_bfloat16_units_are_read_from_its_flags(tmp_path, flags, native):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: {flags}\n")
    assert hardware.cpu_has_bf16(cpuinfo) is native
    assert hardware.cpu_has_bf16(tmp_path / "none") is True  # unreadable (not Linux): no notice rather than a wrong one


@pytest.mark.slow
def test_ft_train_says_it_before_loading_where_the_cpu_emulates_bfloat16(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out", max_steps=1, bf16=True)
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-2000:]
    said = "ft: notice: train.bf16 asks for bfloat16, and this CPU has no bfloat16 matrix units" in result.stderr
    assert said is not hardware.cpu_has_bf16()  # this machine's own flags decide (CI's CPU may have AMX)
    if said:
        lines = result.stderr.splitlines()  # at the start, beside the line naming the device, before anything loads
        assert lines[0].startswith("ft: sft on CPU") and lines[1].startswith("ft: notice: train.bf16"), lines[:3]
