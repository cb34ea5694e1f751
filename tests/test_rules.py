"""Every cross-field rule: the recipe that breaks it fails (or warns) naming the exact key path."""

from __future__ import annotations

import pytest
from conftest import ASSETS, DATA, tiny_sft

from ft.machine import hardware
from ft.machine.hardware import Hardware
from ft.recipe import Processes, RecipeError, load_recipe

CPU = Hardware(cuda=False, bf16=False, devices=0, name="cpu")
GPU = Hardware(cuda=True, bf16=True, devices=1, name="NVIDIA H100")


def _with(base: dict, changes: dict) -> dict:
    """``changes`` maps dotted keys to values (None deletes) onto a copy of ``base``."""
    import copy

    recipe = copy.deepcopy(base)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = recipe
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return recipe


def _errors(write_recipe, tmp_path, changes: dict, base=None, processes=None) -> dict[str, str]:
    base = base or tiny_sft(tmp_path / "out")
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(_with(base, changes)), processes=processes)
    return {p.path: p.message for p in info.value.problems if p.level == "error"}


def _warnings(write_recipe, tmp_path, changes: dict, base=None) -> dict[str, str]:
    loaded = load_recipe(write_recipe(_with(base or tiny_sft(tmp_path / "out"), changes)))
    return {p.path: p.message for p in loaded.warnings}


def preference_recipe(tmp_path, method="dpo") -> dict:
    recipe = tiny_sft(tmp_path / "out")
    recipe["method"] = method
    recipe["data"]["train"] = [{"path": str(DATA / "preference.jsonl"), "format": "preference"}]
    recipe["data"]["eval"] = [{"path": str(DATA / "preference-eval.jsonl"), "format": "preference"}]
    return recipe


def grpo_recipe(tmp_path) -> dict:
    recipe = tiny_sft(tmp_path / "out")
    recipe["method"] = "grpo"
    recipe["data"]["train"] = [{"path": str(DATA / "prompts.jsonl"), "format": "prompt"}]
    recipe["data"]["eval"] = []
    recipe["grpo"] = {"num_generations": 4, "rewards": [{"name": "exact_match"}]}
    return recipe


ERROR_CASES = {
    "eval_on_start without strategy": ({"train.eval_on_start": True}, "train.eval_on_start", "eval_strategy"),
    "eval_on_start without data": ({"train.eval_on_start": True, "train.eval_strategy": "steps",
                                    "data.eval": []}, "train.eval_on_start", "data.eval"),
    "eval strategy without data": ({"train.eval_strategy": "steps", "data.eval": []}, "train.eval_strategy",
                                   "data.eval"),
    "greedy without eval": ({"scheduler": {"type": "greedy"}}, "scheduler.type", "eval_strategy"),
    "eval accumulation without eval": ({"train.eval_accumulation_steps": 4}, "train.eval_accumulation_steps",
                                       "eval_strategy"),
    "persistent workers without workers": ({"train.dataloader_persistent_workers": True},
                                           "train.dataloader_persistent_workers", "dataloader_num_workers"),
    "prefetch without workers": ({"train.dataloader_prefetch_factor": 2}, "train.dataloader_prefetch_factor",
                                 "dataloader_num_workers"),
    "save best without metric": ({"train.save_strategy": "best", "train.eval_strategy": "steps"},
                                 "train.save_strategy", "metric_for_best_model"),
    "load best without eval": ({"train.load_best_model_at_end": True}, "train.load_best_model_at_end",
                               "eval_strategy"),
    "load best with mismatched strategies": ({"train.load_best_model_at_end": True, "train.eval_strategy": "epoch",
                                              "train.save_strategy": "steps"}, "train.load_best_model_at_end",
                                             "save_strategy"),
    "load best with steps not a multiple": ({"train.load_best_model_at_end": True, "train.eval_strategy": "steps",
                                             "train.save_strategy": "steps", "train.eval_steps": 30,
                                             "train.save_steps": 100}, "train.save_steps", "multiple"),
    "galore without targets": ({"optimizer": {"name": "galore_adamw"}}, "optimizer.target_modules", "galore"),
    "apollo without targets": ({"optimizer": {"name": "apollo_adamw"}}, "optimizer.target_modules", "apollo"),
    "layerwise with clipping": ({"optimizer": {"name": "galore_adamw_layerwise", "target_modules": ["attn"]},
                                 "train.max_grad_norm": 1.0}, "train.max_grad_norm", "clipped"),
    "layerwise with deepspeed": ({"optimizer": {"name": "apollo_adamw_layerwise", "target_modules": ["attn"]},
                                  "train.deepspeed": "ds.json"}, "train.deepspeed", "single process"),
    "quantization without adapter": ({"model.quantization": {"bits": 4}}, "model.quantization", "adapter"),
    "format does not fit sft": ({"data.train": [{"path": str(DATA / "preference.jsonl"), "format": "preference"}]},
                                "data.train.0.format", "sft"),
    "method section of another method": ({"dpo": {"beta": 0.2}}, "dpo", "method: dpo"),
}


@pytest.mark.parametrize("changes, key, words", ERROR_CASES.values(), ids=ERROR_CASES.keys())
def test_rule_errors_name_the_key(write_recipe, tmp_path, changes, key, words):
    errors = _errors(write_recipe, tmp_path, changes)
    assert key in errors, errors
    assert words.lower() in errors[key].lower(), errors[key]


WARNING_CASES = {
    "schedule-free with cosine": ({"optimizer": {"name": "schedule_free_adamw"}, "scheduler": {"type": "cosine"}},
                                  "scheduler.type", "constant"),
    "adalomo with clipping": ({"optimizer": {"name": "adalomo"}}, "train.max_grad_norm", "clipping"),
    "save_only_model": ({"train.save_only_model": True}, "train.save_only_model", "restarts the optimizer"),
}


@pytest.mark.parametrize("changes, key, words", WARNING_CASES.values(), ids=WARNING_CASES.keys())
def test_rule_warnings_name_the_key(write_recipe, tmp_path, changes, key, words):
    warnings = _warnings(write_recipe, tmp_path, changes)
    assert key in warnings and words in warnings[key], warnings


def test_valid_variants_pass(write_recipe, tmp_path):
    ok = {"train.eval_on_start": True, "train.eval_strategy": "steps", "train.load_best_model_at_end": True,
          "train.save_strategy": "steps", "train.eval_steps": 25, "train.save_steps": 100,
          "train.dataloader_num_workers": 2, "train.dataloader_prefetch_factor": 2,
          "scheduler": {"type": "greedy"}, "optimizer": {"name": "schedule_free_adamw"}}
    recipe = load_recipe(write_recipe(_with(tiny_sft(tmp_path / "out"), ok))).recipe
    assert recipe.train_args["dataloader_prefetch_factor"] == 2
    # a schedule-free optimizer with a constant schedule draws no warning
    assert _warnings(write_recipe, tmp_path, {"optimizer": {"name": "schedule_free_adamw"},
                                              "scheduler": {"type": "constant"}}) == {}


def test_packing_is_sft_only(write_recipe, tmp_path):
    errors = _errors(write_recipe, tmp_path, {"data.packing": True}, base=preference_recipe(tmp_path))
    assert "sft" in errors["data.packing"]


def test_neftune_is_sft_only(write_recipe, tmp_path):
    errors = _errors(write_recipe, tmp_path, {"train.neftune_noise_alpha": 5}, base=preference_recipe(tmp_path))
    assert "sft" in errors["train.neftune_noise_alpha"]
    assert load_recipe(write_recipe(tiny_sft(tmp_path / "out", neftune_noise_alpha=5))).recipe  # SFT takes it


def test_preference_methods_need_preference_data(write_recipe, tmp_path):
    base = preference_recipe(tmp_path, "kto")
    errors = _errors(write_recipe, tmp_path, {"data.eval": [{"path": str(DATA / "eval.jsonl"), "format": "chat"}]},
                     base=base)
    assert "preference" in errors["data.eval.0.format"]


def test_method_fields_live_in_their_section(write_recipe, tmp_path):
    errors = _errors(write_recipe, tmp_path, {"train.beta": 0.3}, base=preference_recipe(tmp_path))
    assert "dpo.beta" in errors["train.beta"]
    recipe = load_recipe(write_recipe(_with(preference_recipe(tmp_path), {"dpo": {"beta": 0.3}}))).recipe
    assert recipe.method_section.beta == 0.3


def test_grpo_needs_rewards(write_recipe, tmp_path):
    errors = _errors(write_recipe, tmp_path, {"grpo": None}, base=grpo_recipe(tmp_path))
    assert "rewards" in errors["grpo"]


def test_grpo_generation_batch_divides_by_num_generations(write_recipe, tmp_path):
    base = grpo_recipe(tmp_path)  # per_device_train_batch_size 8
    errors = _errors(write_recipe, tmp_path, {"grpo": {"num_generations": 3, "rewards": [{"name": "format"}],
                                                       "steps_per_generation": 2}}, base=base)
    assert "16" in errors["grpo.num_generations"] and "num_generations (3)" in errors["grpo.num_generations"]
    errors = _errors(write_recipe, tmp_path, {"grpo": {"num_generations": 4, "generation_batch_size": 6,
                                                       "rewards": [{"name": "format"}]}}, base=base)
    assert "grpo.generation_batch_size" in errors
    loaded = load_recipe(write_recipe(_with(base, {"grpo.steps_per_generation": 4})))
    assert loaded.recipe.grpo.steps_per_generation == 4


def test_reward_spec_needs_exactly_one_source(write_recipe, tmp_path):
    errors = _errors(write_recipe, tmp_path, {"grpo.rewards": [{"weight": 2.0}]}, base=grpo_recipe(tmp_path))
    assert "exactly one" in errors["grpo.rewards.0"]
    errors = _errors(write_recipe, tmp_path, {"grpo.rewards": [{"fn": "not a function"}]}, base=grpo_recipe(tmp_path))
    assert "module:name" in errors["grpo.rewards.0.fn"]


# --- rules that depend on the machine (run at the start of `ft train`) ---------------------------


def _machine_problems(write_recipe, tmp_path, changes, hw):
    recipe = load_recipe(write_recipe(_with(tiny_sft(tmp_path / "out"), changes))).recipe
    return {p.path: p.message for p in hardware.check_hardware(recipe, hw)}


@pytest.mark.parametrize("changes, key", [
    ({"optimizer": {"name": "adalomo"}, "train.max_grad_norm": 0}, "optimizer.name"),
    ({"optimizer": {"name": "galore_adamw_8bit", "target_modules": ["attn"]}}, "optimizer.name"),
    ({"optimizer": {"name": "galore_adamw_8bit_layerwise", "target_modules": ["attn"]}}, "optimizer.name"),
    ({"train.use_liger_kernel": True}, "train.use_liger_kernel"),
    ({"train.fp16": True}, "train.fp16"),
])
def test_cuda_only_settings_are_refused_on_cpu_and_allowed_on_gpu(write_recipe, tmp_path, changes, key):
    on_cpu = _machine_problems(write_recipe, tmp_path, changes, CPU)
    assert key in on_cpu and "CUDA" in on_cpu[key]
    assert key not in _machine_problems(write_recipe, tmp_path, changes, GPU)


def test_vllm_generation_is_refused_on_cpu_and_where_vllm_is_not_installed(write_recipe, tmp_path):
    """GRPO's ``train.use_vllm`` on this CPU: refused with the way on (generate with transformers); on a GPU machine
    without the vllm package (it is not installed here): refused naming the package."""
    import importlib.util

    recipe = {"method": "grpo", "model": {"name": str(ASSETS), "init": "random"},
              "data": {"train": [{"path": str(DATA / "prompts.jsonl"), "format": "prompt"}]},
              "grpo": {"rewards": [{"name": "length_penalty", "args": {"target": 2}}]},
              "train": {"output_dir": str(tmp_path / "out"), "use_vllm": True}}
    loaded = load_recipe(write_recipe(recipe)).recipe
    on_cpu = {p.path: p.message for p in hardware.check_hardware(loaded, CPU)}
    assert set(on_cpu) == {"train.use_vllm"} and "no CUDA device is visible" in on_cpu["train.use_vllm"]
    assert importlib.util.find_spec("vllm") is None
    on_gpu = {p.path: p.message for p in hardware.check_hardware(loaded, GPU)}
    assert set(on_gpu) == {"train.use_vllm"} and "`pip install vllm`" in on_gpu["train.use_vllm"]
    recipe["train"]["use_vllm"] = False
    assert hardware.check_hardware(load_recipe(write_recipe(recipe)).recipe, CPU) == []


def test_quantization_is_allowed_on_cpu_where_bitsandbytes_runs_there(write_recipe, tmp_path):
    changes = {"model.quantization": {"bits": 4}, "adapter": {"kind": "lora"}}
    assert _machine_problems(write_recipe, tmp_path, changes, CPU) == {}


def test_cpu_capable_optimizers_are_allowed_on_cpu(write_recipe, tmp_path):
    for name in ("lomo", "paged_adamw_8bit", "adamw_8bit", "schedule_free_adamw", "stable_adamw", "grokadamw"):
        assert _machine_problems(write_recipe, tmp_path, {"optimizer": {"name": name}}, CPU) == {}, name


def test_bf16_on_a_gpu_without_it(write_recipe, tmp_path):
    turing = Hardware(cuda=True, bf16=False, devices=1, name="Tesla T4")
    problems = _machine_problems(write_recipe, tmp_path, {"train.bf16": True}, turing)
    assert "Tesla T4" in problems["train.bf16"]


def test_layerwise_refuses_several_processes(write_recipe, tmp_path):
    # a rule of the recipe, with the process count the command passes (tests/test_distributed_config.py: every way)
    changes = {"optimizer": {"name": "galore_adamw_layerwise", "target_modules": ["attn"]}}
    errors = _errors(write_recipe, tmp_path, changes, processes=Processes(2, "WORLD_SIZE=2"))
    assert "WORLD_SIZE=2" in errors["optimizer.name"]


def test_grpo_checkpoints_inside_a_generation_round_are_a_warning(write_recipe, tmp_path):
    """A checkpoint inside a round of generated completions resumes with newly generated ones (no checkpoint holds
    the buffer): save_steps should end rounds."""
    recipe = grpo_recipe(tmp_path)
    recipe["grpo"]["steps_per_generation"] = 4
    recipe["train"].update(save_strategy="steps", save_steps=6)
    assert "generation round" in _warnings(write_recipe, tmp_path, {}, base=recipe)["train.save_steps"]
    recipe["train"]["save_steps"] = 8
    assert "train.save_steps" not in _warnings(write_recipe, tmp_path, {}, base=recipe)
    recipe["train"].update(save_steps=6, gradient_accumulation_steps=2)  # 12 micro-batches: three rounds
    assert "train.save_steps" not in _warnings(write_recipe, tmp_path, {}, base=recipe)


def _two_sources(tmp_path, *weights, stop=None) -> dict:
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"]["train"] = [{"path": str(DATA / "train.jsonl"), **({} if w is None else {"weight": w})}
                               for w in weights]
    if stop:
        recipe["data"]["mix_stop"] = stop
    return recipe


@pytest.mark.parametrize(("weights", "stop", "key", "says"), [
    ((3, None), None, "data.train.1", "has no `weight` while other training sources have one"),
    ((0, 0), None, "data.train.0.weight", "every training source has weight 0"),
    ((1, 0), "all_exhausted", "data.train.1.weight", "would never end"),
    ((0, 2), "all_exhausted_without_replacement", "data.train.0.weight", "would never end"),
])
def test_mixture_weights_that_cannot_end_are_refused(write_recipe, tmp_path, weights, stop, key, says):
    errors = _errors(write_recipe, tmp_path, {}, base=_two_sources(tmp_path, *weights, stop=stop))
    assert says in errors[key]


def test_mixture_weights_that_end_are_accepted_and_normalized(write_recipe, tmp_path):
    recipe = load_recipe(write_recipe(_two_sources(tmp_path, 3, 1))).recipe
    assert recipe.data.weights == [0.75, 0.25]
    zero = load_recipe(write_recipe(_two_sources(tmp_path, 1, 0))).recipe  # first_exhausted ends without it
    assert zero.data.weights == [1.0, 0.0]
    assert load_recipe(write_recipe(_two_sources(tmp_path, None, None))).recipe.data.weights is None


def test_a_weight_on_an_evaluation_source_is_refused(write_recipe, tmp_path):
    changes = {"data.eval": [{"path": str(DATA / "eval.jsonl"), "weight": 1}]}
    assert "evaluation sources are read whole" in _errors(write_recipe, tmp_path, changes)["data.eval.0.weight"]
