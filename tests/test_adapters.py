"""Adapters trained for real: LoRA, DoRA, rsLoRA and QLoRA (4- and 8-bit, on the CPU) train, their loss falls, and
the saved adapter reloads with PEFT to the same logits; an adapter continues from a saved one; tokenizer fix-ups
are said and the rows they add are saved with the adapter."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import ASSETS, tiny_sft
from safetensors.torch import load_file

from ft.model import loading
from ft.recipe import load_recipe
from ft.run.train import train

PROBE = torch.tensor([[1, 17, 42, 99, 7, 250, 3, 64]])  # token ids the logits are compared on


class KeepModel:
    """A TrainerCallback (built lazily) that keeps the trained model, and the adapter weights it started from."""

    def __new__(cls):
        from transformers import TrainerCallback

        class _Keep(TrainerCallback):
            model, start = None, {}

            def on_train_begin(self, args, state, control, model=None, **kwargs):
                self.start = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}

            def on_train_end(self, args, state, control, model=None, **kwargs):
                self.model = model

        return _Keep()


def _lora_run(write_recipe, tmp_path, adapter: dict, quantization: dict | None = None, steps: int = 8, say=None):
    recipe = tiny_sft(tmp_path / "out", max_steps=steps, logging_steps=1)
    recipe["data"]["eval"] = []
    recipe["optimizer"]["lr"] = 1e-2
    recipe["adapter"] = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.0, **adapter}
    if quantization:
        recipe["model"]["quantization"] = quantization
    loaded = load_recipe(write_recipe(recipe))
    keep = KeepModel()
    result = train(loaded, resume="never", say=say or (lambda _: None), callbacks=[keep])
    return loaded.recipe, result, keep


def _logits(model) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=PROBE).logits.float()


def _reloaded(recipe, adapter_dir):
    """The base rebuilt as the run built it (its config and seed, quantized the same way), plus the saved adapter."""
    from peft import PeftModel

    return PeftModel.from_pretrained(loading.load_model(recipe, seed=recipe.train_args.get("seed", 42)), adapter_dir)


@pytest.mark.parametrize("adapter, tolerance", [
    ({"target_modules": ["q_proj", "v_proj"]}, 1e-5),
    ({"target_modules": "all-linear", "use_dora": True}, 1e-5),
    ({"target_modules": r".*\.(q|v)_proj", "use_rslora": True}, 1e-5),
], ids=["lora", "dora", "rslora-regex"])
@pytest.mark.slow
def test_an_adapter_trains_and_its_saved_form_reloads_to_the_same_logits(write_recipe, tmp_path, adapter, tolerance):
    recipe, result, keep = _lora_run(write_recipe, tmp_path, adapter)
    summary, final = result.summary, result.output_dir / "final"
    assert summary["last_train_loss"] < summary["first_train_loss"]
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in final.iterdir()}
    assert not (final / "model.safetensors").exists()  # the adapter only, not a copy of the base
    assert summary["base_model"] == {"name": str(ASSETS), "revision": None, "init": "random", "dtype": "auto",
                                     "seed": 42, "quantization": None}
    config = json.loads((final / "adapter_config.json").read_text())
    saved = load_file(final / "adapter_model.safetensors")
    assert config["use_dora"] is adapter.get("use_dora", False)
    assert config["use_rslora"] is adapter.get("use_rslora", False)
    if adapter.get("use_dora"):
        assert any("lora_magnitude_vector" in name for name in saved)
    adapted = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in saved if ".lora_" in name}
    assert adapted == ({"q_proj", "v_proj"} if adapter["target_modules"] != "all-linear" else
                       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    torch.testing.assert_close(_logits(_reloaded(recipe, final)), _logits(keep.model), rtol=0, atol=tolerance)


@pytest.mark.slow
@pytest.mark.parametrize("bits", [4, 8])
def test_qlora_trains_on_the_cpu_and_its_adapter_reloads(write_recipe, tmp_path, bits):
    import bitsandbytes as bnb

    quantization = {"bits": bits, "compute_dtype": "float32"}
    recipe, result, keep = _lora_run(write_recipe, tmp_path, {"target_modules": "all-linear"}, quantization)
    layer = {4: bnb.nn.Linear4bit, 8: bnb.nn.Linear8bitLt}[bits]
    assert any(isinstance(module, layer) for module in keep.model.modules())  # the base really is quantized
    assert result.summary["last_train_loss"] < result.summary["first_train_loss"]
    assert result.summary["base_model"]["quantization"]["bits"] == bits
    config = json.loads((result.output_dir / "final" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(ASSETS)  # not the folder the random base was quantized through
    # TRL keeps a quantized model's adapter in bfloat16 (the QLoRA paper's choice); reloaded, PEFT computes in float32
    torch.testing.assert_close(_logits(_reloaded(recipe, result.output_dir / "final")), _logits(keep.model),
                               rtol=0, atol=2e-2)


@pytest.mark.slow
def test_an_adapter_continues_from_a_saved_one(write_recipe, tmp_path):
    _, first, _ = _lora_run(write_recipe, tmp_path / "a", {"target_modules": ["q_proj", "v_proj"]})
    saved = load_file(first.output_dir / "final" / "adapter_model.safetensors")
    recipe = tiny_sft(tmp_path / "b" / "out", max_steps=4)
    recipe["data"]["eval"] = []
    recipe["adapter"] = {"path": str(first.output_dir / "final")}
    keep = KeepModel()
    result = train(load_recipe(write_recipe(recipe, name="continue.yaml")), resume="never", say=lambda _: None,
                   callbacks=[keep])
    start = {name.replace(".default", ""): tensor for name, tensor in keep.start.items()}
    assert {name.removeprefix("base_model.model."): tensor for name, tensor in start.items()}.keys() == \
        {name.removeprefix("base_model.model.") for name in saved}
    assert all(torch.equal(start[name], saved[name]) for name in saved)  # it started from the saved adapter
    continued = load_file(result.output_dir / "final" / "adapter_model.safetensors")
    assert any(not torch.equal(continued[name], saved[name]) for name in saved)  # and trained it further


def test_continuing_an_adapter_keeps_its_saved_shape(write_recipe, tmp_path):
    from ft.recipe import RecipeError

    recipe = tiny_sft(tmp_path / "out")
    recipe["adapter"] = {"path": str(tmp_path), "r": 4}
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(recipe))
    assert any(p.path == "adapter.r" and "adapter_config.json" in p.message for p in info.value.problems)


@pytest.mark.slow
def test_tokenizer_fixups_are_said_and_new_rows_are_saved_with_the_adapter(write_recipe, tmp_path):
    from transformers import AutoTokenizer

    model_dir = tmp_path / "model"
    shutil.copytree(ASSETS, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})  # one token more than the embeddings
    tokenizer.pad_token = None
    tokenizer.save_pretrained(model_dir)
    said = []
    recipe = tiny_sft(tmp_path / "out", max_steps=3)
    recipe["model"]["name"] = str(model_dir)
    recipe["data"]["eval"] = []
    recipe["adapter"] = {"kind": "lora", "r": 8, "target_modules": ["q_proj", "v_proj"]}
    result = train(load_recipe(write_recipe(recipe)), resume="never", say=said.append)
    assert any("no pad token" in line for line in said), said
    assert any("resized to 513" in line for line in said), said
    saved = load_file(result.output_dir / "final" / "adapter_model.safetensors")
    rows = [tensor for name, tensor in saved.items() if "trainable_tokens" in name]
    assert rows and rows[0].shape[0] == 1  # the new row travels with the adapter


@pytest.mark.slow
def test_a_quantized_base_trains_a_full_copy_beside_its_adapter_without_mixed_precision(write_recipe, tmp_path):
    """An Axolotl 8-bit LoRA config with `lora_modules_to_save: [embed_tokens, lm_head]`, rehearsed on the CPU (no
    bf16): TRL casts the trainable weights of a quantized model to bfloat16 for autocast to meet, and without autocast
    the lm_head copy met float32 activations and failed at the first step. They train in float32 here."""
    quantization = {"bits": 8, "compute_dtype": "float32"}
    adapter = {"target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]}
    recipe, result, keep = _lora_run(write_recipe, tmp_path, adapter, quantization)
    assert result.summary["last_train_loss"] < result.summary["first_train_loss"]
    trained = {name: param.dtype for name, param in keep.model.named_parameters() if param.requires_grad}
    assert any("modules_to_save" in name for name in trained) and set(trained.values()) == {torch.float32}
    saved = load_file(result.output_dir / "final" / "adapter_model.safetensors")
    assert any("lm_head" in name for name in saved)  # the trained copy is saved with the adapter
