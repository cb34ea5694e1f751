"""``launch:`` and ``distributed:``: what each setting becomes in TrainingArguments (and that transformers/accelerate
accept it), the rules that involve processes, and drift of these keys on resume. FSDP does not run on CPU processes
(accelerate has no FSDP for them: see docs/distributed.md), so FSDP and DeepSpeed are tested as configuration; DDP's
choice of find_unused_parameters is also tested on two CPU processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml
from conftest import ASSETS, CPU, DATA, ROOT, run_ft, tiny_sft
from test_rules import GPU, _with

from ft.machine import hardware
from ft.recipe import RecipeError, load_recipe
from ft.recipe.processes import Processes, process_count
from ft.recipe.resolved import resolved_recipe_yaml
from ft.run.drift import DriftError, check_drift
from ft.trainers import distributed
from ft.trainers.build import trl_config


@pytest.fixture(autouse=True)
def _one_process(monkeypatch):
    """Each test decides the process count itself (a test run under torchrun would see its WORLD_SIZE)."""
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _load(write_recipe, tmp_path, changes: dict, base=None, processes=None):
    return load_recipe(write_recipe(_with(base or tiny_sft(tmp_path / "out"), changes)), processes=processes)


def _recipe(write_recipe, tmp_path, changes: dict, base=None):
    return _load(write_recipe, tmp_path, changes, base).recipe


def _errors(write_recipe, tmp_path, changes: dict, base=None) -> dict[str, str]:
    with pytest.raises(RecipeError) as info:
        _load(write_recipe, tmp_path, changes, base)
    return {p.path: p.message for p in info.value.problems if p.level == "error"}


def _warnings(write_recipe, tmp_path, changes: dict, base=None, processes=None) -> dict[str, str]:
    return {p.path: p.message for p in _load(write_recipe, tmp_path, changes, base, processes).warnings}


def _training_arguments(tmp_path, args: dict):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(tmp_path / "args"), use_cpu=True, report_to="none", **args)


# --- DDP ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("changes", [{}, {"adapter": {"kind": "lora"}}], ids=["full", "lora"])
def test_ddp_skips_the_unused_parameter_search_for_full_and_lora_fine_tunes(write_recipe, tmp_path, changes):
    recipe = _recipe(write_recipe, tmp_path, changes)
    args = distributed.training_args(recipe, 2, model=SimpleNamespace(config=SimpleNamespace(hidden_size=64)))
    assert args == {"ddp_find_unused_parameters": False}
    # transformers' own default would have been True here (no activation checkpointing, or a PEFT model)
    assert _training_arguments(tmp_path, args).ddp_find_unused_parameters is False


def test_ddp_searches_unused_parameters_where_a_multimodal_tower_gets_no_gradient(write_recipe, tmp_path):
    recipe = _recipe(write_recipe, tmp_path, {})
    gemma3 = SimpleNamespace(config=SimpleNamespace(vision_config={"hidden_size": 32}, text_config={}))
    assert distributed.training_args(recipe, 2, model=gemma3) == {"ddp_find_unused_parameters": True}


def test_an_explicit_find_unused_parameters_wins(write_recipe, tmp_path):
    recipe = _recipe(write_recipe, tmp_path, {"distributed": {"find_unused_parameters": True}})
    assert distributed.training_args(recipe, 2) == {"ddp_find_unused_parameters": True}
    # train: wins over what distributed: maps to (ft's defaults fill only what the recipe left unset)
    from trl import SFTConfig

    recipe = _recipe(write_recipe, tmp_path, {"train.ddp_find_unused_parameters": True})
    config = trl_config(SFTConfig, recipe, {"use_cpu": True, **distributed.training_args(recipe, 2)})
    assert config.ddp_find_unused_parameters is True
    errors = _errors(write_recipe, tmp_path, {"train.ddp_find_unused_parameters": True,
                                              "distributed": {"find_unused_parameters": False}})
    assert "distributed.find_unused_parameters" in errors["train.ddp_find_unused_parameters"]


def test_launch_collective_timeout_is_the_process_groups_timeout(write_recipe, tmp_path):
    """launch.collective_timeout becomes TrainingArguments' ddp_timeout (what init_process_group waits in a collective,
    for every distributed: kind); unset, transformers' own 1800 s; train.ddp_timeout saying otherwise is refused,
    naming both, and wins as any train: key does when it agrees."""
    from trl import SFTConfig

    recipe = _recipe(write_recipe, tmp_path, {"launch": {"collective_timeout": 45}})
    assert distributed.collective_timeout(recipe) == {"ddp_timeout": 45}
    config = trl_config(SFTConfig, recipe, {"use_cpu": True, **distributed.collective_timeout(recipe)})
    assert config.ddp_timeout == 45 and config.ddp_timeout_delta.total_seconds() == 45
    assert distributed.collective_timeout(_recipe(write_recipe, tmp_path, {})) == {"ddp_timeout": 1800}
    errors = _errors(write_recipe, tmp_path, {"launch": {"collective_timeout": 45}, "train.ddp_timeout": 60})
    assert "launch.collective_timeout" in errors["train.ddp_timeout"]
    _recipe(write_recipe, tmp_path, {"launch": {"collective_timeout": 45}, "train.ddp_timeout": 45})


EVERY_METHOD = """
import json, sys, torch
from ft.recipe import load_recipe
from ft.run import ranks
from ft.run.train import train

done = {}
for path in sys.argv[1:]:  # one method after another in the same two processes: torch and TRL imported once
    loaded = load_recipe(path)
    result = train(loaded, resume="never", say=lambda _: None)
    out = loaded.recipe.train_args["output_dir"]
    args = torch.load(f"{out}/final/training_args.bin", weights_only=False) if ranks.is_main() else None
    done[loaded.recipe.method] = [result.status, args and args.world_size, args and args.ddp_find_unused_parameters]
if ranks.is_main():
    print("DONE " + json.dumps(done))
# ended as ft train's ranks end: a plain exit right after gloo collectives may abort with "terminate called without an
# active exception" (a gloo thread freeing the last work as Python finalizes: ft.run.ranks.exit_without_finalizing;
# it ended this script's rank 1 in two of the CI runs of 2026-12-07)
ranks.exit_without_finalizing(0)
"""
FILES = {"chat": "train.jsonl", "preference": "preference.jsonl", "prompt": "prompts.jsonl"}


@pytest.mark.slow
def test_every_method_trains_on_two_processes_without_the_unused_parameter_search(write_recipe, tmp_path):
    """Each method in METHODS trains two steps on two DDP processes, with find_unused_parameters=False. DPO has a
    LoRA adapter: its reference pass runs through the DDP-wrapped model with the adapter off, where an unused
    parameter would show. GRPO and RLOO start from a random model, so their reference is a snapshot each process
    saves and TRL loads (transformers' save_pretrained writes from rank 0 alone: the other process found an empty
    folder before)."""
    from ft.recipe.methods import METHODS

    paths = []
    for method, entry in METHODS.items():
        recipe = tiny_sft(tmp_path / method, max_steps=2, per_device_train_batch_size=4, eval_strategy="no")
        recipe["method"] = method
        fmt = entry.formats[0]
        recipe["data"] = {"train": [{"path": str(DATA / FILES[fmt]), "format": fmt}], "max_length": 48}
        if entry.generates:
            recipe[method] = {"num_generations": 4, "rewards": [{"name": "numeric_match"}], "max_completion_length": 8}
        if method == "dpo":
            recipe["adapter"] = {"kind": "lora", "r": 4}
        paths.append(str(write_recipe(recipe, name=f"{method}.yaml")))
    script = tmp_path / "every_method.py"
    script.write_text(EVERY_METHOD)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
               *paths]
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, "TQDM_DISABLE": "1"}, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = [line for line in result.stdout.splitlines() if line.startswith("DONE ")]
    assert json.loads(line.removeprefix("DONE ")) == {method: ["completed", 2, False] for method in METHODS}


# --- FSDP ---------------------------------------------------------------------------------------------------------


FSDP_CASES = {
    "defaults": ({}, {"reshard_after_forward": True, "state_dict_type": "SHARDED_STATE_DICT", "cpu_offload": False,
                      "activation_checkpointing": False}),
    "shard_grad_op": ({"sharding": "shard_grad_op"}, {"reshard_after_forward": False}),
    "full state dict": ({"state_dict": "full"}, {"state_dict_type": "FULL_STATE_DICT"}),
    "cpu offload": ({"cpu_offload": True}, {"cpu_offload": True}),
    "activation checkpointing": ({"activation_checkpointing": True}, {"activation_checkpointing": True}),
    "wrap by name": ({"wrap": ["LlamaDecoderLayer"]}, {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}),
}


@pytest.mark.parametrize("settings, expected", FSDP_CASES.values(), ids=FSDP_CASES.keys())
def test_fsdp_settings_become_fsdp2_config_that_transformers_and_accelerate_take(write_recipe, tmp_path, settings,
                                                                                  expected):
    from accelerate.utils import FullyShardedDataParallelPlugin

    recipe = _recipe(write_recipe, tmp_path, {"distributed": {"kind": "fsdp", "fsdp": settings}})
    args = distributed.training_args(recipe, 2)
    assert args["fsdp"] is True
    config = args["fsdp_config"]
    assert config["version"] == 2 and config["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert {key: config[key] for key in expected} == expected
    assert ("activation_checkpointing" in args) is bool(settings.get("activation_checkpointing"))

    training = _training_arguments(tmp_path, args)
    plugin_args = training.fsdp_plugin_args  # what transformers hands accelerate
    assert plugin_args["fsdp_version"] == 2
    assert plugin_args["reshard_after_forward"] is config["reshard_after_forward"]
    assert plugin_args["state_dict_type"] == config["state_dict_type"]
    assert plugin_args.get("cpu_offload", False) is config["cpu_offload"]
    assert plugin_args["activation_checkpointing"] is config["activation_checkpointing"]
    if "transformer_layer_cls_to_wrap" in expected:
        assert plugin_args["transformer_cls_names_to_wrap"] == "LlamaDecoderLayer"
    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    assert plugin.fsdp_version == 2 and config["state_dict_type"] in str(plugin.state_dict_type)


def test_fsdp_with_one_process_trains_plainly(write_recipe, tmp_path):
    """transformers' Trainer refuses fsdp outside a distributed launch; one process has nothing to shard anyway."""
    recipe = _recipe(write_recipe, tmp_path, {"distributed": {"kind": "fsdp"}})
    assert distributed.training_args(recipe, 1, cuda=True) == {}
    checkpointing = {"distributed": {"kind": "fsdp", "fsdp": {"activation_checkpointing": True}}}
    recipe = _recipe(write_recipe, tmp_path, checkpointing)
    assert distributed.training_args(recipe, 1) == {"activation_checkpointing": True}  # the Trainer's, then


def test_fsdp_takes_over_activation_checkpointing_on_cuda(write_recipe, tmp_path):
    recipe = _recipe(write_recipe, tmp_path, {"distributed": {"kind": "fsdp"}})
    on_gpu = distributed.training_args(recipe, 2, cuda=True)
    # ft's CUDA default moves to FSDP's own, and the Trainer's (which transformers refuses beside it) is turned off
    assert on_gpu["fsdp_config"]["activation_checkpointing"] is True and on_gpu["activation_checkpointing"] is False
    defaults = {**hardware.device_defaults(recipe, GPU), **on_gpu}
    assert defaults["activation_checkpointing"] is False
    # the Trainer's, written in train:, wins: FSDP's own stays off (and transformers advises against it: a warning)
    recipe = _load(write_recipe, tmp_path, {"distributed": {"kind": "fsdp"}, "train.activation_checkpointing": True})
    assert "all-gather" in {p.path: p.message for p in recipe.warnings}["train.activation_checkpointing"]
    args = distributed.training_args(recipe.recipe, 2, cuda=True)
    assert args["fsdp_config"]["activation_checkpointing"] is False and "activation_checkpointing" not in args


def test_hybrid_sharding_shards_within_machines_and_replicates_across(write_recipe, tmp_path):
    recipe = _recipe(write_recipe, tmp_path, {"distributed": {"kind": "fsdp", "fsdp": {"sharding": "hybrid"}}})
    args = distributed.training_args(recipe, 4, local_world_size=2)
    parallelism = args["parallelism_config"]
    assert (parallelism.dp_replicate_size, parallelism.dp_shard_size) == (2, 2)
    assert _training_arguments(tmp_path, args).parallelism_config is parallelism
    assert "parallelism_config" not in distributed.training_args(recipe, 2, local_world_size=2)  # one machine: full


def test_final_save_gathers_a_full_state_dict_under_sharded_fsdp():
    """transformers' save_model writes nothing under FSDP unless the plugin's state dict type is FULL_STATE_DICT."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    trainer = SimpleNamespace(is_fsdp_enabled=True, accelerator=SimpleNamespace(state=SimpleNamespace(
        fsdp_plugin=plugin)))
    assert distributed.full_state_dict_for_final(trainer) is True
    assert "FULL_STATE_DICT" in str(plugin.state_dict_type)  # the very test Trainer.save_model makes
    assert distributed.full_state_dict_for_final(trainer) is False  # already full
    assert distributed.full_state_dict_for_final(SimpleNamespace(is_fsdp_enabled=False)) is False


@pytest.mark.slow
def test_ft_train_asks_for_the_full_state_dict_right_before_it_saves_final(write_recipe, tmp_path, monkeypatch):
    """The helper above is called by `ft train` itself, with the run's trainer, once training is over and before
    final/ is written (FSDP itself runs on GPUs only: the GPU check, scripts/gpu_check.py, trains it for real)."""
    from ft.run.train import train

    calls, helper = [], distributed.full_state_dict_for_final

    def seen(trainer):
        calls.append((trainer.state.global_step, (tmp_path / "out" / "final").exists()))
        return helper(trainer)

    monkeypatch.setattr(distributed, "full_state_dict_for_final", seen)
    train(load_recipe(write_recipe(tiny_sft(tmp_path / "out", eval_strategy="no"))), resume="never",
          say=lambda _: None)
    assert calls == [(4, False)]  # once, after the last of the 4 steps, before final/ exists
    assert (tmp_path / "out" / "final" / "model.safetensors").is_file()


FSDP_ERRORS = {
    "no_shard is DDP": ({"distributed": {"kind": "fsdp", "fsdp": {"sharding": "no_shard"}}},
                        "distributed.fsdp.sharding", "kind: ddp"),
    "fsdp settings with ddp": ({"distributed": {"fsdp": {"cpu_offload": True}}}, "distributed.fsdp", "kind: fsdp"),
    "train.fsdp with deepspeed": ({"distributed": {"kind": "deepspeed"}, "train.fsdp": "full_shard"}, "train.fsdp",
                                  "distributed.kind"),
    "train.fsdp_config beside distributed.fsdp": (
        {"distributed": {"kind": "fsdp", "fsdp": {"cpu_offload": True}}, "train.fsdp_config": {"version": 2}},
        "train.fsdp_config", "distributed.fsdp"),
    "two activation checkpointings": (
        {"distributed": {"kind": "fsdp", "fsdp": {"activation_checkpointing": True}},
         "train.gradient_checkpointing": True}, "train.gradient_checkpointing", "distributed.fsdp.activation_"),
    "save_only_model with sharded": ({"distributed": {"kind": "fsdp"}, "train.save_only_model": True},
                                     "train.save_only_model", "distributed.fsdp.state_dict"),
}


@pytest.mark.parametrize("changes, key, words", FSDP_ERRORS.values(), ids=FSDP_ERRORS.keys())
def test_fsdp_contradictions_are_refused_naming_both_keys(write_recipe, tmp_path, changes, key, words):
    errors = _errors(write_recipe, tmp_path, changes)
    assert key in errors and words in errors[key], errors


def test_fsdp_is_refused_on_cpu_processes_and_allowed_on_gpus(write_recipe, tmp_path):
    recipe = _recipe(write_recipe, tmp_path, {"distributed": {"kind": "fsdp"}})
    problems = {p.path: p.message for p in hardware.check_hardware(recipe, CPU, processes=2)}
    assert "plain DDP" in problems["distributed.kind"]
    assert "distributed.kind" not in {p.path for p in hardware.check_hardware(recipe, GPU, processes=2)}


FSDP_ON_CPU = """
import os, sys, tempfile
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1]))
args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to="none", fsdp=True,
                         fsdp_config={"version": 2})
trainer = Trainer(model=model, args=args)
with open(os.path.join(sys.argv[2], "rank-" + os.environ["RANK"]), "w") as out:
    out.write(f"{trainer.accelerator.distributed_type} {trainer.is_fsdp_enabled}")
"""


@pytest.mark.slow
def test_accelerate_drops_fsdp_for_cpu_processes(tmp_path):
    """Why ft refuses FSDP on CPU processes: accelerate gives them MULTI_CPU and no FSDP plugin, so the Trainer
    would train plain DDP. If a later accelerate shards CPU processes, this fails: lift the refusal then."""
    script = tmp_path / "fsdp_on_cpu.py"
    script.write_text(FSDP_ON_CPU)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(script), str(ASSETS), str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):  # distributed type, and whether the Trainer has FSDP
        assert (tmp_path / f"rank-{rank}").read_text() == "DistributedType.MULTI_CPU False"


def test_four_bit_weights_are_stored_in_the_compute_dtype_under_fsdp(write_recipe, tmp_path):
    import torch

    from ft.model.loading import bnb_config

    changes = {"model.quantization": {"bits": 4, "compute_dtype": "bfloat16"}, "adapter": {"kind": "lora"}}
    plain = _recipe(write_recipe, tmp_path, changes)
    assert bnb_config(plain.model.quantization).bnb_4bit_quant_storage == torch.uint8
    assert bnb_config(plain.model.quantization, fsdp=True).bnb_4bit_quant_storage == torch.bfloat16


# --- DeepSpeed ----------------------------------------------------------------------------------------------------


DEEPSPEED_CASES = {
    "stage 1": ({"stage": 1}, {"stage": 1}),
    "stage 2 (default)": ({}, {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                                "reduce_bucket_size": "auto"}),
    "stage 2, optimizer on cpu": ({"stage": 2, "offload_optimizer": "cpu"},
                                  {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}),
    "stage 3": ({"stage": 3}, {"stage": 3, "stage3_prefetch_bucket_size": "auto",
                               "stage3_param_persistence_threshold": "auto",
                               "stage3_gather_16bit_weights_on_model_save": True}),
    "stage 3, everything on nvme": (
        {"stage": 3, "offload_optimizer": "nvme", "offload_params": "nvme", "nvme_path": "/local_nvme"},
        {"offload_optimizer": {"device": "nvme", "pin_memory": True, "nvme_path": "/local_nvme"},
         "offload_param": {"device": "nvme", "pin_memory": True, "nvme_path": "/local_nvme"}}),
}


@pytest.mark.parametrize("settings, zero", DEEPSPEED_CASES.values(), ids=DEEPSPEED_CASES.keys())
def test_deepspeed_config_is_generated_with_auto_values_transformers_fills(write_recipe, tmp_path, settings, zero):
    import transformers.integrations.deepspeed as hf_deepspeed

    recipe = _recipe(write_recipe, tmp_path, {"distributed": {"kind": "deepspeed", "deepspeed": settings}})
    config = distributed.training_args(recipe, 2)["deepspeed"]
    assert {key: config["zero_optimization"][key] for key in zero} == zero
    assert config["train_micro_batch_size_per_gpu"] == config["gradient_accumulation_steps"] == "auto"
    offloaded = settings.get("offload_optimizer", "none") != "none"
    assert ("optimizer" in config) is offloaded  # DeepSpeed's CPU AdamW for ZeRO-Offload, else the Trainer's
    assert "scheduler" not in config  # the Trainer's schedule (scheduler:) in every case

    # transformers' own processing of the config: every "auto" is one it fills from TrainingArguments and the model,
    # and nothing contradicts them. HfTrainerDeepSpeedConfig needs DeepSpeed installed to be built, so its methods
    # are run on accelerate's HfDeepSpeedConfig (its base class where DeepSpeed is installed).
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    methods = ("is_auto", "fill_match", "fill_only", "trainer_config_process", "trainer_config_finalize")
    probe = type("Probe", (HfDeepSpeedConfig,), {name: vars(hf_deepspeed.HfTrainerDeepSpeedConfig)[name]
                                                 for name in methods})
    processed = probe(config)
    processed._dtype, processed.mismatches = None, []
    args = _training_arguments(tmp_path, {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
                                          "learning_rate": 1e-4, "weight_decay": 0.01})
    processed.trainer_config_process(args)
    processed.trainer_config_finalize(args, SimpleNamespace(config=SimpleNamespace(hidden_size=64)), 10)
    assert "auto" not in json.dumps(processed.config) and processed.mismatches == []
    assert processed.config["train_batch_size"] == 4 * 2 * args.world_size
    assert processed.config["zero_optimization"]["stage"] == zero.get("stage", 3)
    if offloaded:
        assert processed.config["optimizer"]["params"]["lr"] == 1e-4


def test_a_deepspeed_config_of_ones_own_is_passed_on(write_recipe, tmp_path):
    own = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}
    (tmp_path / "ds.json").write_text(json.dumps(own))
    for config in ("ds.json", own):
        changes = {"distributed": {"kind": "deepspeed", "deepspeed": {"config": config}}}
        recipe = _recipe(write_recipe, tmp_path, changes)
        value = distributed.training_args(recipe, 2)["deepspeed"]
        assert value == (str(tmp_path / "ds.json") if config == "ds.json" else own)  # relative to the recipe


DEEPSPEED_ERRORS = {
    "offload_params below stage 3": ({"stage": 2, "offload_params": "cpu"}, "distributed.deepspeed.offload_params",
                                     "stage: 3"),
    "nvme optimizer below stage 3": ({"offload_optimizer": "nvme", "nvme_path": "/nvme"},
                                     "distributed.deepspeed.offload_optimizer", "stage: 3"),
    "nvme without a path": ({"stage": 3, "offload_params": "nvme"}, "distributed.deepspeed.nvme_path", "fast"),
    "config with stage": ({"config": {"zero_optimization": {"stage": 2}}, "stage": 2}, "distributed.deepspeed.stage",
                          "config"),
    "config missing": ({"config": "missing.json"}, "distributed.deepspeed.config", "does not exist"),
    "stage 3 config that leaves final/ partitioned": ({"config": {"zero_optimization": {"stage": 3}}},
                                                      "distributed.deepspeed.config",
                                                      "stage3_gather_16bit_weights_on_model_save"),
}


@pytest.mark.parametrize("settings, key, words", DEEPSPEED_ERRORS.values(), ids=DEEPSPEED_ERRORS.keys())
def test_invalid_deepspeed_settings_are_refused_naming_the_key(write_recipe, tmp_path, settings, key, words):
    errors = _errors(write_recipe, tmp_path, {"distributed": {"kind": "deepspeed", "deepspeed": settings}})
    assert key in errors and words in errors[key], errors


OTHER_DEEPSPEED_ERRORS = {
    "offloaded optimizer other than AdamW": (
        {"optimizer": {"name": "adafactor"}, "distributed": {"kind": "deepspeed",
                                                             "deepspeed": {"offload_optimizer": "cpu"}}},
        "optimizer.name", "AdamW"),
    "lomo under deepspeed": ({"optimizer": {"name": "lomo"}, "train.max_grad_norm": 0,
                              "distributed": {"kind": "deepspeed"}}, "optimizer.name", "never change"),
    "zero-3 with quantization": ({"model.quantization": {"bits": 4}, "adapter": {"kind": "lora"},
                                  "distributed": {"kind": "deepspeed", "deepspeed": {"stage": 3}}},
                                 "model.quantization", "stage 3"),
    "train.deepspeed beside distributed": ({"distributed": {"kind": "deepspeed"}, "train.deepspeed": "ds.json"},
                                           "train.deepspeed", "distributed.deepspeed.config"),
}


@pytest.mark.parametrize("changes, key, words", OTHER_DEEPSPEED_ERRORS.values(), ids=OTHER_DEEPSPEED_ERRORS.keys())
def test_what_does_not_train_under_deepspeed_is_refused(write_recipe, tmp_path, changes, key, words):
    errors = _errors(write_recipe, tmp_path, changes)
    assert key in errors and words in errors[key], errors


def test_deepspeed_is_refused_where_it_is_not_installed(write_recipe, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    recipe = _recipe(write_recipe, tmp_path, {"distributed": {"kind": "deepspeed"}})
    problems = {p.path: p.message for p in hardware.check_hardware(recipe, GPU)}
    assert "pip install deepspeed" in problems["distributed.kind"]
    # train.deepspeed (no distributed: section) is refused the same way, at its own key
    recipe = _recipe(write_recipe, tmp_path, {"train.deepspeed": {"zero_optimization": {"stage": 2}}})
    assert "pip install deepspeed" in {p.path: p.message for p in hardware.check_hardware(recipe, GPU)}[
        "train.deepspeed"]


# --- launch -------------------------------------------------------------------------------------------------------


LAUNCH_ERRORS = {
    "node_rank not below nnodes": ({"nnodes": 2, "node_rank": 2, "master_addr": "node0"}, "launch.node_rank",
                                   "0..1"),
    "machines without a meeting point": ({"nnodes": 2}, "launch.nnodes", "launch.master_addr"),
    "rendezvous and master_addr": ({"nnodes": 2, "rdzv_endpoint": "node0:29400", "master_addr": "node0"},
                                   "launch.rdzv_endpoint", "launch.master_addr"),
    "rendezvous not host:port": ({"rdzv_endpoint": "node0"}, "launch.rdzv_endpoint", "host:port"),
    "accelerate config beside the other keys": ({"accelerate_config": "acc.yaml", "num_processes": 2},
                                                "launch.num_processes", "accelerate_config"),
    "no processes": ({"num_processes": 0}, "launch.num_processes", "1 or more"),
}


@pytest.mark.parametrize("launch, key, words", LAUNCH_ERRORS.values(), ids=LAUNCH_ERRORS.keys())
def test_launch_section_is_validated_naming_the_key(write_recipe, tmp_path, launch, key, words):
    errors = _errors(write_recipe, tmp_path, {"launch": launch})
    assert key in errors and words in errors[key], errors


def test_launch_section_fields_the_launcher_reads(write_recipe, tmp_path):
    (tmp_path / "acc.yaml").write_text("distributed_type: MULTI_GPU\n")
    launch = _recipe(write_recipe, tmp_path, {"launch": {"accelerate_config": "acc.yaml"}}).launch
    assert launch.accelerate_config == str(tmp_path / "acc.yaml")  # relative to the recipe's folder
    launch = _recipe(write_recipe, tmp_path, {"launch": {"num_processes": "auto", "nnodes": 2, "node_rank": 1,
                                                         "master_addr": "10.0.0.1", "master_port": 29501}}).launch
    assert (launch.num_processes, launch.nnodes, launch.node_rank, launch.master_addr, launch.master_port,
            launch.rdzv_endpoint) == ("auto", 2, 1, "10.0.0.1", 29501, None)


# --- rules that involve processes -----------------------------------------------------------------------------------


def test_process_count_is_the_commands_else_the_recipes(write_recipe, tmp_path):
    recipe = _recipe(write_recipe, tmp_path, {"launch": {"num_processes": 4, "nnodes": 2, "master_addr": "n0"}})
    assert process_count(recipe) == 8
    assert process_count(recipe, Processes(3, "--num-processes 3")) == 3  # ft train --num-processes 3, before the ranks
    assert process_count(recipe, Processes(6, "WORLD_SIZE=6")) == 6  # inside a rank: the run's size, every machine
    assert process_count(_recipe(write_recipe, tmp_path, {"launch": {"num_processes": "auto"}})) == 1
    assert process_count(_recipe(write_recipe, tmp_path, {})) == 1


@pytest.mark.parametrize("how", ["WORLD_SIZE", "--num-processes", "launch"])
def test_layerwise_optimizers_refuse_several_processes_however_they_are_started(write_recipe, tmp_path, how):
    """The count reaches the rules from wherever it is known: a rank's WORLD_SIZE and `ft train --num-processes`
    through the command, which passes it to validation as an argument; `launch:` from the recipe itself."""
    changes = {"optimizer": {"name": "galore_adamw_layerwise", "target_modules": ["attn"]}}
    if how == "launch":
        changes["launch"] = {"num_processes": 2}
    path = write_recipe(_with(tiny_sft(tmp_path / "out"), changes))
    command = ["train", str(path), "--num-processes", "2"] if how == "--num-processes" else ["validate", str(path)]
    result = run_ft(*command, env={"WORLD_SIZE": "2" if how == "WORLD_SIZE" else None})
    assert result.returncode == 2, result.stderr
    source = {"WORLD_SIZE": "WORLD_SIZE=2", "--num-processes": "--num-processes 2",
              "launch": "launch.num_processes 2"}[how]
    assert "2 processes" in result.stderr and "single process" in result.stderr and f"({source})" in result.stderr
    errors = _errors(write_recipe, tmp_path, {**changes, "launch": None, "distributed": {"kind": "fsdp"}})
    assert "single process" in errors["distributed.kind"]


def test_sharding_one_process_is_a_warning(write_recipe, tmp_path):
    warnings = _warnings(write_recipe, tmp_path, {"distributed": {"kind": "fsdp"}})
    assert "one" in warnings["distributed.kind"]
    # offloading still saves memory with one process; several processes shard
    offload = {"distributed": {"kind": "deepspeed", "deepspeed": {"offload_optimizer": "cpu"}}}
    assert "distributed.kind" not in _warnings(write_recipe, tmp_path, offload)
    assert "distributed.kind" not in _warnings(write_recipe, tmp_path, {"distributed": {"kind": "fsdp"},
                                                                        "launch": {"num_processes": 2}})
    several = Processes(2, "WORLD_SIZE=2")
    assert "distributed.kind" not in _warnings(write_recipe, tmp_path, {"distributed": {"kind": "fsdp"}},
                                               processes=several)


def test_batch_rebalance_with_nothing_to_balance_is_a_warning(write_recipe, tmp_path):
    alone = {"train.train_sampling_strategy": "batch_rebalance"}
    assert "group_by_length" in _warnings(write_recipe, tmp_path, alone)["train.train_sampling_strategy"]
    for more in ({"launch": {"num_processes": 2}}, {"train.gradient_accumulation_steps": 2}):
        assert "train.train_sampling_strategy" not in _warnings(write_recipe, tmp_path, {**alone, **more})


# --- drift on resume ----------------------------------------------------------------------------------------------


def _saved_run(tmp_path, recipe, ranks: int = 1):
    """An output directory with ``recipe`` saved as recipe.yaml and a checkpoint written by ``ranks`` processes."""
    out = tmp_path / "run"
    checkpoint = out / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (out / "recipe.yaml").write_text(resolved_recipe_yaml(recipe))
    for name in ["rng_state.pth"] if ranks == 1 else [f"rng_state_{rank}.pth" for rank in range(ranks)]:
        (checkpoint / name).write_bytes(b"")
    return out, str(checkpoint)


DRIFT_CASES = {
    "kind": ({"distributed": {"kind": "fsdp"}}, "distributed.kind"),
    "fsdp state dict": ({"distributed": {"kind": "fsdp", "fsdp": {"state_dict": "full"}}},
                        "distributed.fsdp.state_dict"),
    "process count": ({"launch": {"num_processes": 2}}, "launch.num_processes"),
    "machines": ({"launch": {"nnodes": 2, "master_addr": "n0"}}, "launch.nnodes"),
}


@pytest.mark.parametrize("changes, key", DRIFT_CASES.values(), ids=DRIFT_CASES.keys())
def test_changing_how_processes_train_is_refused_on_resume(write_recipe, tmp_path, changes, key):
    out, checkpoint = _saved_run(tmp_path, _recipe(write_recipe, tmp_path, {}))
    with pytest.raises(DriftError) as info:
        check_drift(_recipe(write_recipe, tmp_path, changes), out, checkpoint, "ft train r.yaml")
    assert f"  - {key}:" in str(info.value), str(info.value)


def test_deepspeed_stage_change_is_refused_and_speed_settings_are_harmless(write_recipe, tmp_path):
    ds = {"distributed": {"kind": "deepspeed", "deepspeed": {"offload_optimizer": "cpu"}}}
    out, checkpoint = _saved_run(tmp_path, _recipe(write_recipe, tmp_path, ds))
    with pytest.raises(DriftError, match="distributed.deepspeed.stage: 2 → 3"):
        check_drift(_recipe(write_recipe, tmp_path, _with(ds, {"distributed.deepspeed.stage": 3})), out, checkpoint,
                    "ft train r.yaml")
    # the stage unset or written as its default (2) is no change; offloading changes memory only
    same = _with(ds, {"distributed.deepspeed.stage": 2, "distributed.deepspeed.offload_optimizer": "none"})
    changes = check_drift(_recipe(write_recipe, tmp_path, same), out, checkpoint, "ft train r.yaml")
    assert [change.key for change in changes] == ["distributed.deepspeed.offload_optimizer"]


def test_where_machines_meet_and_fsdp_speed_settings_are_harmless(write_recipe, tmp_path):
    fsdp = {"distributed": {"kind": "fsdp"}, "launch": {"num_processes": 2, "nnodes": 2, "master_addr": "n0"}}
    out, checkpoint = _saved_run(tmp_path, _recipe(write_recipe, tmp_path, fsdp))
    moved = _with(fsdp, {"launch.master_addr": "n7", "launch.master_port": 29600,
                         "distributed.fsdp": {"sharding": "hybrid", "cpu_offload": True, "wrap": ["LlamaDecoderLayer"],
                                              "activation_checkpointing": True}})
    changes = check_drift(_recipe(write_recipe, tmp_path, moved), out, checkpoint, "ft train r.yaml")
    assert {change.key for change in changes} == {
        "launch.master_addr", "launch.master_port", "distributed.fsdp.sharding", "distributed.fsdp.cpu_offload",
        "distributed.fsdp.wrap", "distributed.fsdp.wrap.0", "distributed.fsdp.activation_checkpointing"}


def test_a_run_saved_before_these_sections_reads_as_their_defaults(write_recipe, tmp_path):
    recipe = _recipe(write_recipe, tmp_path, {})
    out, checkpoint = _saved_run(tmp_path, recipe)
    old = yaml.safe_load((out / "recipe.yaml").read_text())
    old.pop("distributed")
    old.pop("launch")
    (out / "recipe.yaml").write_text(yaml.safe_dump(old))
    explicit = _recipe(write_recipe, tmp_path, {"distributed": {"kind": "ddp"}, "launch": {"num_processes": 1}})
    assert check_drift(explicit, out, checkpoint, "ft train r.yaml") == []


def test_a_checkpoint_of_another_process_count_is_refused(write_recipe, tmp_path):
    recipe = _recipe(write_recipe, tmp_path, {})
    out, checkpoint = _saved_run(tmp_path, recipe, ranks=2)  # torchrun without launch: in no recipe key
    with pytest.raises(DriftError, match=r"processes \(WORLD_SIZE.*\): 2 → 1"):
        check_drift(recipe, out, checkpoint, "ft train r.yaml", world_size=1)
    assert check_drift(recipe, out, checkpoint, "ft train r.yaml", world_size=2) == []


# --- the smoke test -------------------------------------------------------------------------------------------------


def test_the_smoke_run_is_one_plain_process(write_recipe, tmp_path):
    from ft.smoke.rehearse import _Edits, _machine

    recipe = _recipe(write_recipe, tmp_path, {"distributed": {"kind": "fsdp"}, "launch": {"num_processes": 2}})
    edits = _Edits(recipe.model_dump(mode="json", exclude_unset=True, by_alias=True))
    _machine(edits, recipe)
    assert "distributed" not in edits.raw and "launch" not in edits.raw
    assert {sub.key for sub in edits.subs} >= {"distributed", "launch"}


@pytest.mark.parametrize("key", ["stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save"])
def test_a_stage_3_config_that_gathers_final_is_accepted_under_either_spelling(write_recipe, tmp_path, key):
    # DeepSpeed's ZeRO config takes the field under its name and under the stage3_ alias
    config = {"zero_optimization": {"stage": 3, key: True}}
    recipe = _recipe(write_recipe, tmp_path, {"distributed": {"kind": "deepspeed", "deepspeed": {"config": config}}})
    assert recipe.distributed.deepspeed.config == config


def test_a_recipe_saved_before_a_model_key_existed_resumes_without_drift(write_recipe, tmp_path):
    """recipe.yaml of a run from before `model.gguf_file` existed lacks the key; unset now, it is no change."""
    recipe = _recipe(write_recipe, tmp_path, {})
    out, checkpoint = _saved_run(tmp_path, recipe)
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    del saved["model"]["gguf_file"]
    (out / "recipe.yaml").write_text(yaml.safe_dump(saved))
    assert check_drift(recipe, out, checkpoint, "ft train r.yaml") == []
    changed = _recipe(write_recipe, tmp_path, {"model.gguf_file": "model.gguf", "model.init": "pretrained"})
    with pytest.raises(DriftError, match="model.gguf_file"):
        check_drift(changed, out, checkpoint, "ft train r.yaml")
