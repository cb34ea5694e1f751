"""Device-aware defaults: TRL's bf16/activation checkpointing are off on CPU unless the recipe asks."""

from __future__ import annotations

import pytest
import yaml
from conftest import run_ft, tiny_sft
from trl import SFTConfig

from ft import data, hardware, models
from ft.hardware import Hardware
from ft.recipe import load_recipe
from ft.trainers import build_trainer

CPU = Hardware(cuda=False, bf16=False, devices=0, name="cpu")
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


@pytest.mark.parametrize("explicit", [{"bf16": True}, {"activation_checkpointing": True},
                                      {"gradient_checkpointing": True}, {"fp16": True}])
def test_recipe_value_always_wins(write_recipe, tmp_path, explicit):
    defaults = hardware.device_defaults(_recipe(write_recipe, tmp_path, **explicit), CPU)
    assert not set(explicit) & set(defaults)
    if "gradient_checkpointing" in explicit:
        assert "activation_checkpointing" not in defaults
    if "fp16" in explicit:
        assert "bf16" not in defaults


def test_built_trainer_carries_the_defaults_and_the_explicit_value(write_recipe, tmp_path):
    recipe = _recipe(write_recipe, tmp_path, activation_checkpointing=True)
    tokenizer = models.load_tokenizer(recipe.model)
    trainer = build_trainer(
        recipe, model=models.load_model(recipe, seed=0), tokenizer=tokenizer,
        train_dataset=data.prepare_data(recipe, tokenizer, lambda _: None).train, eval_dataset=None,
        defaults=hardware.device_defaults(recipe, CPU),
    )
    assert trainer.args.bf16 is False
    assert trainer.args.activation_checkpointing is True  # the recipe's explicit value
    assert trainer.args.learning_rate == pytest.approx(3e-3)  # optimizer.lr reached the config


def test_hardware_rules_on_cpu(write_recipe, tmp_path):
    quantized = tiny_sft(tmp_path / "out", fp16=True)
    quantized["model"]["quantization"] = {"bits": 4}
    quantized["adapter"] = {"kind": "lora"}
    recipe = load_recipe(write_recipe(quantized)).recipe
    problems = {p.path: p.message for p in hardware.check_hardware(recipe, CPU)}
    assert set(problems) == {"model.quantization", "train.fp16"}
    assert "CUDA" in problems["model.quantization"]
    assert hardware.check_hardware(recipe, AMPERE) == []


def test_train_refuses_cuda_only_settings_before_loading(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    recipe["model"]["quantization"] = {"bits": 4}
    recipe["adapter"] = {"kind": "lora"}
    path = write_recipe(recipe)
    result = run_ft("train", str(path))
    assert result.returncode == 2
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("  quantization:"))
    assert f"{path}:{line}: model.quantization:" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written or loaded
    assert yaml.safe_load(path.read_text())  # the recipe itself is fine; only this machine can't run it
