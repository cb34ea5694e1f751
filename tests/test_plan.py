"""`ft plan`: the estimate's parts scale as the formulas say (LoRA's and 8-bit AdamW's state, checkpointing), the
activation formula equals what torch really saves for backward, a too-small GPU gets changes that each fit, a
missing model is one paragraph naming model.name, and the estimate matches the peak memory of a real CPU run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ASSETS, ROOT, run_ft

from ft.plan.memory import estimate, layer_bytes, setup_for
from ft.plan.report import parse_memory, plan
from ft.plan.shape import read_shape
from ft.plan.suggest import set_args
from ft.recipe import load_recipe
from ft.units import GiB, MiB

WIDE = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": False}


def _model(tmp_path: Path, name: str = "model", **config) -> Path:
    """A model directory with the tiny-llama tokenizer and a config of the given sizes (no weights: none needed)."""
    folder = tmp_path / name
    shutil.copytree(ASSETS, folder)
    base = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**base, **config}))
    return folder


def _recipe(tmp_path: Path, model_dir: Path, rows: Path | None = None, **sections) -> Path:
    recipe = {"method": "sft", "model": {"name": str(model_dir), "init": "random"},
              "data": {"train": [{"path": str(rows or tmp_path / "rows.jsonl"), "format": "text"}], "max_length": 256,
                       "train_on": "all"},
              "optimizer": {"name": "adamw_torch", "lr": 1e-4},
              "train": {"output_dir": str(tmp_path / "run"), "per_device_train_batch_size": 4}}
    for section, keys in sections.items():
        recipe[section] = {**recipe.get(section, {}), **keys} if isinstance(keys, dict) else keys
    path = tmp_path / f"recipe-{len(list(tmp_path.glob('recipe-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _estimate(path: Path, device: str = "cuda", overrides=()):
    recipe = load_recipe(path, overrides).recipe
    shape = read_shape(recipe)
    return estimate(shape, setup_for(recipe, shape, device=device))


def _part(est, prefix: str) -> float:
    return next(p.size for p in est.parts if p.name.startswith(prefix))


@pytest.fixture
def wide(tmp_path) -> Path:
    return _model(tmp_path, vocab_size=512, **WIDE)  # embeddings a small share: the state ratios show plainly


def test_lora_state_and_gradients_are_a_tiny_fraction_of_full_fine_tuning(tmp_path, wide):
    full = _estimate(_recipe(tmp_path, wide))
    lora = _estimate(_recipe(tmp_path, wide, adapter={"kind": "lora", "r": 16}))
    assert full.trainable == full.params
    assert _part(full, "optimizer state") == pytest.approx(8 * full.params)  # float32 AdamW: two states
    assert _part(full, "gradients") == pytest.approx(4 * full.params)
    assert lora.trainable / lora.params < 0.06  # r × (in + out) per projection: 16 × 1024 of 512 × 512
    assert _part(lora, "optimizer state") / _part(full, "optimizer state") < 0.06
    assert _part(lora, "gradients") / _part(full, "gradients") < 0.06
    assert lora.total < full.total


def test_8bit_adamw_keeps_a_quarter_of_adamw_state_and_lomo_none(tmp_path, wide):
    adamw = _part(_estimate(_recipe(tmp_path, wide)), "optimizer state")
    bnb = _part(_estimate(_recipe(tmp_path, wide, optimizer={"name": "adamw_8bit"})), "optimizer state")
    assert 0.25 <= bnb / adamw < 0.28  # 2 bytes + block scales; the (small) embedding keeps 32-bit state
    lomo = _estimate(_recipe(tmp_path, wide, optimizer={"name": "lomo"}, train={"max_grad_norm": 0}))
    assert not any(p.name.startswith("optimizer state") and p.size for p in lomo.parts)
    assert next(p for p in lomo.parts if p.name.startswith("gradients")).at_peak <= 4 * 512 * 1408  # one at a time
    galore = _estimate(_recipe(tmp_path, wide, optimizer={"name": "galore_adamw", "target_modules": [".*mlp.*"],
                                                           "args": {"rank": 64}}))
    assert _part(galore, "optimizer state") < adamw


def test_gradient_checkpointing_cuts_activations(tmp_path, wide):
    path = _recipe(tmp_path, wide, train={"gradient_checkpointing": False})
    plain = _estimate(path)
    checkpointed = _estimate(path, overrides=["train.gradient_checkpointing=true"])
    assert _part(checkpointed, "activations") < 0.1 * _part(plain, "activations")
    assert checkpointed.total < plain.total
    # on the GPU ft turns checkpointing on by default; a CPU run keeps it off
    assert _estimate(_recipe(tmp_path, wide)).setup.checkpointing
    assert not _estimate(_recipe(tmp_path, wide), device="cpu").setup.checkpointing


CASES = {  # recipe sections -> one decoder layer's saved tensors
    "full": {},
    "lora-dropout": {"adapter": {"kind": "lora", "r": 8, "dropout": 0.1}},
    "lora-qv": {"adapter": {"kind": "lora", "r": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}},
    "bf16-weights": {"model": {"dtype": "bfloat16"}},
    "bf16-autocast": {"train": {"bf16": True}},  # float32 weights: each projection keeps its own bf16 cast
}


@pytest.mark.parametrize("case", CASES)
def test_layer_formula_equals_what_torch_saves_for_backward(tmp_path, case):
    """One decoder layer's saved tensors, counted with saved_tensors_hooks (a 3-layer model minus a 2-layer one)."""
    from contextlib import nullcontext

    from transformers import AutoConfig, AutoModelForCausalLM

    sections = CASES[case]
    adapter = sections.get("adapter")
    sizes = {"hidden_size": 96, "intermediate_size": 224, "num_attention_heads": 3, "num_key_value_heads": 3,
             "head_dim": 32, "vocab_size": 512}
    batch, length = 2, 48
    saved = {}
    for layers in (2, 3):
        config = AutoConfig.from_pretrained(ASSETS, **sizes, num_hidden_layers=layers)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, sections.get("model", {}).get(
            "dtype", "float32")))
        if adapter:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=adapter["r"], lora_dropout=adapter["dropout"], task_type=
                                                     "CAUSAL_LM", target_modules=adapter.get("target_modules",
                                                                                             "all-linear")))
        model.train()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        storages = {}

        def keep(t, storages=storages):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        ids = torch.randint(0, 512, (batch, length))
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if "train" in sections else nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), autocast:
            model(input_ids=ids, labels=ids)
        saved[layers] = sum(n for ptr, n in storages.items() if ptr not in params)
    model_dir = _model(tmp_path, **sizes, num_hidden_layers=3)
    recipe = load_recipe(_recipe(tmp_path, model_dir, data={"max_length": length}, **sections)).recipe
    shape = read_shape(recipe)
    setup = setup_for(recipe, shape, device="cpu")
    copies = 2 * sum(lin.fan_in * lin.fan_out for lin in shape.layer_linears(1)) if setup.mixed else 0
    assert saved[3] - saved[2] == layer_bytes(shape, setup, 1) * batch * length + copies


@pytest.mark.slow
def test_too_small_gpu_gets_changes_that_each_fit(tmp_path, wide):
    path = _recipe(tmp_path, wide)
    needed = _estimate(path).total
    budget = f"{needed * 0.8 / MiB:.0f}MiB"
    result = run_ft("plan", str(path), "--gpu-memory", budget)
    assert result.returncode == 0, result.stderr
    assert "does not fit" in result.stdout and "Changes that make it fit, each on its own" in result.stdout
    assert re.search(r"^peak \(in the \w+", result.stdout, re.M)
    found = plan(load_recipe(path).recipe, str(path), gpu_memory=budget)
    assert found.fits is False and len(found.suggestions) >= 4
    shown = {key for x in found.suggestions for key in x.changes}
    assert {"optimizer.name", "adapter", "model.quantization"} <= shown
    assert "--set " + set_args(found.suggestions[0].changes)[0] in result.stdout
    for suggestion in found.suggestions:  # each, written as --set arguments, gives a recipe that fits
        again = plan(load_recipe(path, set_args(suggestion.changes)).recipe, str(path), gpu_memory=budget)
        assert again.fits, suggestion.changes
        assert again.estimate.total == pytest.approx(suggestion.estimate.total)


@pytest.mark.slow
def test_json_output_and_no_gpu_here(tmp_path, wide):
    path = _recipe(tmp_path, wide)
    shown = run_ft("plan", str(path), "--json", "--gpus", "2", "--gpu-memory", "80GiB")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["peak_bytes"] == pytest.approx(sum(c["at_peak_bytes"] for c in data["components"]), abs=16)
    assert data["fits"] is True and data["gpu_memory_bytes"] == 80 * GiB and data["setup"]["gpus"] == 2
    assert any(c["name"] == "DDP gradient buckets" for c in data["components"])  # DDP's second copy of the gradients
    if not torch.cuda.is_available():
        plain = run_ft("plan", str(path))
        assert plain.returncode == 0 and "--gpu-memory" in plain.stdout


@pytest.mark.slow
def test_a_missing_model_is_one_paragraph_naming_model_name(tmp_path):
    path = _recipe(tmp_path, tmp_path / "no-such-model")
    result = run_ft("plan", str(path), "--gpu-memory", "24GB", env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2
    assert "model.name" in result.stderr and "config.json" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    bad = run_ft("plan", str(_recipe(tmp_path, ASSETS)), "--gpu-memory", "lots")
    assert bad.returncode == 2 and "--gpu-memory" in bad.stderr


def _measured_peak(path: Path) -> float:
    """The peak RSS above the imported libraries of a run of the recipe, measured by benchmarks/plan_accuracy.py's
    child."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plan_accuracy.py"), "--child", str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    line = next((x for x in done.stdout.splitlines() if x.startswith("PLAN_ACCURACY_RESULT ")), None)
    assert line, done.stderr[-3000:]
    return json.loads(line.split(" ", 1)[1])["measured"]


def _words(start: int, count: int) -> str:
    return " ".join(f"word{i % 97} {i}" for i in range(start, start + count))


SMALL_WIDE = {"hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000, "tie_word_embeddings": False}
RUN = {"max_steps": 2, "save_strategy": "no", "report_to": "none", "eval_strategy": "no",
       "enable_jit_checkpoint": False, "gradient_checkpointing": False}


@pytest.mark.slow
def test_estimate_matches_the_peak_memory_of_a_real_cpu_run(tmp_path):
    """Two SFT steps of an 18M-parameter Llama (vocabulary 32000: the logits dominate, as in small models)."""
    model = _model(tmp_path, **SMALL_WIDE)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": _words(0, 300)}) + "\n" for _ in range(16)))
    path = _recipe(tmp_path, model, rows, data={"max_length": 128}, train=RUN)
    est, measured = _estimate(path, device="cpu"), _measured_peak(path)
    assert 0.85 <= est.total / measured <= 1.15, (est.total / MiB, measured / MiB)


@pytest.mark.slow
def test_a_reward_models_estimate_has_a_score_head_and_matches_a_real_cpu_run(tmp_path):
    """A reward model: a score per position instead of 32000 logits, so the peak is a fraction of SFT's (it is in the
    optimizer step), and the estimate follows it (it once counted the LM head's logits). The model is four layers of
    hidden 512 (29M parameters): the process's own ~25 MiB outside the model (tokenizer, data, allocator), which the
    estimate does not count, would be a sixth of SMALL_WIDE's 9.8M-parameter peak and only a twentieth of this one."""
    from transformers import AutoTokenizer

    model = _model(tmp_path, **{**SMALL_WIDE, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
                                "num_attention_heads": 8, "num_key_value_heads": 8})
    tokenizer = AutoTokenizer.from_pretrained(model)
    pair = {"prompt": _words(0, 10), "chosen": " " + _words(10, 10), "rejected": " " + _words(20, 10)}
    assert 110 < len(tokenizer(pair["prompt"] + pair["chosen"])["input_ids"]) < 127  # near max_length, kept
    rows = tmp_path / "pairs.jsonl"
    rows.write_text("".join(json.dumps(pair) + "\n" for _ in range(16)))
    sft = _estimate(_recipe(tmp_path, model, rows, data={"max_length": 128}), device="cpu")
    path = _recipe(tmp_path, model, rows, method="reward", train=RUN)
    recipe = yaml.safe_load(path.read_text())
    recipe["data"] = {"train": [{"path": str(rows), "format": "preference"}], "max_length": 128}
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    est = _estimate(path, device="cpu")
    assert _part(est, "scores and loss") < 2 * MiB < 100 * MiB < _part(sft, "logits and loss")
    assert not any(p.name.startswith("logits") for p in est.parts)
    measured = _measured_peak(path)
    assert 0.85 <= est.total / measured <= 1.15, (est.total / MiB, measured / MiB)


def test_vllm_colocated_with_training_takes_its_share_of_the_gpu(tmp_path, wide):
    """GRPO with ``train.use_vllm`` in TRL's colocate mode (its default): vLLM reserves
    ``vllm_gpu_memory_utilization`` of each GPU (TRL's default 0.3) beside training, so a GPU the training step fits in
    with room to spare no longer fits once vLLM's share is counted; in server mode vLLM runs on other GPUs and nothing
    is counted. The suggestions then fit what is left."""
    prompts = ROOT / "data" / "arithmetic" / "prompts.jsonl"
    path = _recipe(tmp_path, wide, method="grpo", grpo={"rewards": [{"name": "numeric_match"}], "num_generations": 4},
                   data={"train": [{"path": str(prompts), "format": "prompt"}], "max_length": 256})
    needed = _estimate(path).total
    budget = needed / 0.7  # training alone: 70% of the GPU, under the 90% that fits
    gpu = f"{budget / MiB:.0f}MiB"
    alone = plan(load_recipe(path).recipe, str(path), gpu_memory=gpu)
    assert alone.fits and alone.vllm_bytes == 0.0
    server = plan(load_recipe(path, ["train.use_vllm=true", "train.vllm_mode=server"]).recipe, str(path),
                  gpu_memory=gpu)
    assert server.fits and server.vllm_bytes == 0.0
    colocated = plan(load_recipe(path, ["train.use_vllm=true"]).recipe, str(path), gpu_memory=gpu)
    assert colocated.estimate.total == pytest.approx(needed)  # training's own share is unchanged
    assert colocated.vllm_bytes == pytest.approx(0.3 * parse_memory(gpu)) and colocated.fits is False
    assert colocated.suggestions
    for suggestion in colocated.suggestions:  # each leaves training under 90% - 30% of the GPU
        assert suggestion.estimate.total <= 0.6 * parse_memory(gpu)
    shown = plan(load_recipe(path, ["train.use_vllm=true", "train.vllm_gpu_memory_utilization=0.25"]).recipe,
                 str(path), gpu_memory=gpu).render()
    assert "vLLM (train.use_vllm, colocate mode) holds train.vllm_gpu_memory_utilization 0.25 of each GPU" in shown
    assert re.search(r"per GPU: too tight .*, 95\.\d% of it", shown), shown  # 70% + 25%
