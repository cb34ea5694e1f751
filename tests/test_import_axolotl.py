"""`ft import axolotl`: each mapping, on Axolotl configs written for these tests, checked through ft's own loader.

Every import here is written to a file and loaded with ``ft.recipe.load_recipe`` (what ``ft validate`` runs), so a
test passes only when ft accepts the recipe and the resolved values are the ones the config meant. Each config's
keys are also checked to be all accounted for in the ledger: carried, ignored or not carried, none dropped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest
import yaml
from conftest import run_ft

from ft.importers.axolotl import ConfigError, import_axolotl
from ft.importers.ledger import CARRIED, IGNORED, NOT_CARRIED
from ft.recipe import load_recipe

BASE = {"base_model": "org/some-model", "datasets": [{"path": "org/some-data", "type": "alpaca"}],
        "micro_batch_size": 2, "num_epochs": 1, "learning_rate": 0.0002, "output_dir": "./outputs/out"}


def keys_of(config, prefix: str = ""):
    """Every key path of a config, nested ones included (``datasets.0.type``)."""
    items = config.items() if isinstance(config, dict) else enumerate(config) if isinstance(config, list) else ()
    for key, value in items:
        path = f"{prefix}{key}"
        yield path
        yield from keys_of(value, path + ".")


def imported(tmp_path: Path, config: dict | str, *, valid: bool = True):
    """Import ``config`` (a dict written as YAML, or YAML text) into tmp_path/recipe.yaml; returns the recipe ft
    loads from it (None when ``valid`` is False) and the import result."""
    source = tmp_path / "axolotl.yml"
    source.write_text(config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False))
    out = tmp_path / "recipe.yaml"
    result = import_axolotl(source, out)
    out.write_text(result.text)
    assert result.valid is valid, result.verdict.message
    if isinstance(config, dict):  # nothing dropped silently: each key is in the ledger, or inside one that is, or
        for path in keys_of(config):  # (a container) holds keys that are
            assert any(path == e or path.startswith(e + ".") or e.startswith(path + ".")
                       for e in result.ledger.entries), path
    return (load_recipe(out).recipe if valid else None), result


def status(result, key: str) -> str:
    return result.ledger.entries[key].status


def why(result, key: str) -> str:
    return result.ledger.entries[key].why


# --- model -------------------------------------------------------------------------------------------------------


def test_base_model_revision_and_remote_code(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "revision_of_model": "abc123", "trust_remote_code": True,
                                         "base_model_config": "org/some-model", "model_type": "AutoModelForCausalLM",
                                         "tokenizer_type": "AutoTokenizer"})
    assert recipe.model.name == "org/some-model"
    assert recipe.model.revision == "abc123"
    assert recipe.model.trust_remote_code is True
    assert status(result, "base_model_config") == IGNORED  # the same as base_model
    assert status(result, "model_type") == CARRIED and status(result, "tokenizer_type") == CARRIED


def test_a_separate_config_source_or_tokenizer_class_is_not_carried(tmp_path):
    _, result = imported(tmp_path, {**BASE, "base_model_config": "org/other-config",
                                    "tokenizer_type": "LlamaTokenizer",
                                    "model_type": "AutoModelForSequenceClassification"})
    for key in ("base_model_config", "tokenizer_type", "model_type"):
        assert status(result, key) == NOT_CARRIED, key


@pytest.mark.parametrize(("precision", "dtype", "train"), [
    ({"bf16": True}, "bfloat16", {"bf16": True}),
    ({"bf16": False, "fp16": True}, "float16", {"fp16": True}),
    ({"bf16": "auto", "fp16": True}, "float16", {"fp16": True}),
    ({"bf16": False}, "float32", {"bf16": False}),
    ({"bf16": "auto"}, "auto", {}),
    ({"bf16": "full"}, "bfloat16", {"bf16": True, "bf16_full_eval": True}),
    ({"bfloat16": True, "bf16": False}, "bfloat16", {"bf16": False}),
])
def test_model_dtype_and_mixed_precision(tmp_path, precision, dtype, train):
    recipe, _ = imported(tmp_path, {**BASE, **precision})
    assert recipe.model.dtype == dtype
    for key, value in train.items():
        assert recipe.train_args[key] == value, key
    assert "fp16" not in recipe.train_args or "fp16" in train


def test_tf32(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "tf32": True})
    assert recipe.train_args["tf32"] is True
    recipe, result = imported(tmp_path, {**BASE, "tf32": False})
    assert "tf32" not in recipe.train_args and status(result, "tf32") == CARRIED


def test_qlora_loads_in_4_bits_with_axolotls_bnb_settings(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "adapter": "qlora", "load_in_4bit": True, "load_in_8bit": False,
                                         "bf16": True, "bnb_config_kwargs": {"bnb_4bit_use_double_quant": False,
                                                                             "llm_int8_threshold": 5.0}})
    quantization = recipe.model.quantization
    assert (quantization.bits, quantization.quant_type, quantization.compute_dtype) == (4, "nf4", "bfloat16")
    assert quantization.double_quant is False
    assert recipe.adapter is not None
    assert status(result, "load_in_8bit") == IGNORED
    assert status(result, "bnb_config_kwargs.llm_int8_threshold") == NOT_CARRIED


def test_lora_loads_in_8_bits_in_float16(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "adapter": "lora", "load_in_8bit": True, "bf16": False})
    assert recipe.model.quantization.bits == 8
    assert recipe.model.dtype == "float16"


def test_4_bit_loading_without_qlora_has_no_effect_as_in_axolotl(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "adapter": "lora", "load_in_4bit": True})
    assert recipe.model.quantization is None
    assert status(result, "load_in_4bit") == IGNORED


def test_attention(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "attn_implementation": "sdpa"})
    assert recipe.model.attn_implementation == "sdpa"
    recipe, result = imported(tmp_path, {**BASE, "flash_attention": True, "sdp_attention": False})
    assert recipe.model.attn_implementation == "flash_attention_2"
    assert status(result, "sdp_attention") == IGNORED
    recipe, result = imported(tmp_path, {**BASE, "attn_implementation": "xformers"})
    assert recipe.model.attn_implementation is None
    assert status(result, "attn_implementation") == NOT_CARRIED


# --- adapter -----------------------------------------------------------------------------------------------------


def test_lora_settings(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.1,
                                    "lora_target_modules": ["q_proj", "v_proj"], "lora_modules_to_save": ["lm_head"],
                                    "peft_use_dora": True, "peft_use_rslora": True})
    adapter = recipe.adapter
    assert (adapter.kind, adapter.r, adapter.alpha, adapter.dropout) == ("lora", 8, 16, 0.1)
    assert adapter.target_modules == ["q_proj", "v_proj"]
    assert adapter.modules_to_save == ["lm_head"]
    assert adapter.use_dora is True and adapter.use_rslora is True


def test_lora_target_linear_is_all_linear_and_a_regex_passes_as_one(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "adapter": "qlora", "load_in_4bit": True, "lora_target_linear": True,
                                    "lora_target_modules": ["q_proj"]})
    assert recipe.adapter.target_modules == "all-linear"
    regex = r"model.layers.[\d]+.mlp.up_proj"
    recipe, _ = imported(tmp_path, {**BASE, "adapter": "lora", "lora_target_modules": regex})
    assert recipe.adapter.target_modules == regex


def test_axolotls_lora_dropout_default_is_written_out(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "adapter": "lora", "lora_r": 8, "lora_dropout": None})
    assert recipe.adapter.dropout == 0.0
    assert ("adapter.dropout", 0.0) in [(target, value) for target, value, _ in result.ledger.defaults]


def test_lora_model_dir_continues_the_saved_adapter(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "adapter": "lora", "lora_model_dir": "saved/adapter", "lora_r": 8})
    assert recipe.adapter.path == "saved/adapter"
    assert "r" not in recipe.adapter.model_fields_set
    assert status(result, "lora_r") == IGNORED


def test_lora_keys_without_an_adapter_are_ignored(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "lora_r": 8, "lora_alpha": 16})
    assert recipe.adapter is None
    assert status(result, "lora_r") == IGNORED


# --- data --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "fields"), [
    ("alpaca", {}), ("alpaca:chat", {}), ("alpaca_chat.load_qa", {"instruction": "question", "output": "answer"}),
    ("gpteacher", {"output": "response"}), ("oasst", {"instruction": "INSTRUCTION", "output": "RESPONSE"}),
])
def test_instruction_variants(tmp_path, kind, fields):
    recipe, result = imported(tmp_path, {**BASE, "datasets": [{"path": "org/d", "type": kind, "split": "train[:10%]",
                                                               "name": "main", "revision": "v1"}]})
    source = recipe.data.train[0]
    assert (source.format, source.fields, source.split, source.name, source.revision) == (
        "instruction", fields, "train[:10%]", "main", "v1")
    assert status(result, "datasets.0.type") == CARRIED


def test_chat_template_dataset_with_fields_and_roles(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "datasets": [{
        "path": "org/chats", "type": "chat_template", "field_messages": "conversations",
        "message_property_mappings": {"role": "from", "content": "value"},
        "roles": {"user": ["human", "user"], "assistant": ["gpt"], "system": ["system"]},
        "roles_to_train": ["assistant"], "train_on_eos": "turn"}]})
    source = recipe.data.train[0]
    assert source.format == "chat"
    assert source.fields == {"messages": "conversations", "role": "from", "content": "value"}
    assert source.roles == {"human": "user", "gpt": "assistant"}


def test_sharegpt_columns_get_axolotls_default_role_names(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "datasets": [{"path": "org/chats", "type": "chat_template",
                                                          "message_field_role": "from",
                                                          "message_field_content": "value"}]})
    assert recipe.data.train[0].roles == {"human": "user", "gpt": "assistant"}


def test_dataset_keys_ft_lacks_are_named(tmp_path):
    _, result = imported(tmp_path, {**BASE, "datasets": [{"path": "org/chats", "type": "chat_template",
                                                          "drop_system_message": True, "split_thinking": True,
                                                          "roles_to_train": ["assistant", "user"]}]})
    for key in ("drop_system_message", "split_thinking", "roles_to_train"):
        assert status(result, f"datasets.0.{key}") == NOT_CARRIED, key
    assert "does not split reasoning out of a message's content" in why(result, "datasets.0.split_thinking")


def test_reasoning_and_tools_fields_and_template_kwargs_carry_and_ft_reads_the_rows_through_them(tmp_path):
    """`field_thinking` and `field_tools` name the keys ft's chat format reads the reasoning and the tool definitions
    from; `chat_template_kwargs` become `data.chat_template_kwargs`, each variable on its own (one ft hands the template
itself is named as not carried, and the others still come): the imported source, read by ft itself, gives
    canonical rows holding the reasoning and the tools (without the mapping ft would refuse the `thinking` key, and
    leave the `functions` column out)."""
    from ft.data.formats import normalize
    from ft.data.rows import BadRows
    from ft.data.sources import read_source

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "21 degrees"},
                {"role": "assistant", "content": "21 degrees.", "thinking": "The tool said 21."}]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"messages": messages, "functions": [weather]}) + "\n")
    kwargs = {"enable_thinking": False, "add_generation_prompt": True}  # the second: ft passes it itself
    recipe, result = imported(tmp_path, {**BASE, "chat_template_kwargs": kwargs, "datasets": [{
        "path": "json", "data_files": str(rows), "type": "chat_template", "field_thinking": "thinking",
        "field_tools": "functions", "template_thinking_key": "reasoning_content", "split_thinking": False}]})
    source = recipe.data.train[0]
    assert source.fields == {"reasoning_content": "thinking", "tools": "functions"}
    assert recipe.data.chat_template_kwargs == {"enable_thinking": False}
    for key in ("datasets.0.field_thinking", "datasets.0.field_tools", "datasets.0.template_thinking_key",
                "chat_template_kwargs.enable_thinking"):
        assert status(result, key) == CARRIED, key
    assert status(result, "chat_template_kwargs.add_generation_prompt") == NOT_CARRIED
    assert status(result, "datasets.0.split_thinking") == IGNORED
    report = BadRows()
    raw = read_source(source, seed=0, on_bad_row="error", report=report, key="data.train.0")
    row = normalize(raw, source, key="data.train.0", on_bad_row="error", report=report)[0]
    assert row["messages"][-1] == {"role": "assistant", "content": "21 degrees.",
                                   "reasoning_content": "The tool said 21."}
    assert row["tools"] == [weather] and row["messages"][1]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_reasoning_under_another_template_key_or_outside_a_text_chat_is_not_carried(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "datasets": [{
        "path": "org/chats", "type": "chat_template", "field_thinking": "thinking", "template_thinking_key": "thinking",
        "field_tools": "tools", "message_property_mappings": {"role": "from", "content": "value",
                                                             "tool_calls": "calls", "score": "score"}}]})
    assert recipe.data.train[0].fields == {"reasoning_content": "thinking", "role": "from", "content": "value",
                                           "tool_calls": "calls"}
    assert status(result, "datasets.0.template_thinking_key") == NOT_CARRIED  # gpt-oss's template reads `thinking`
    assert "as `reasoning_content` only" in why(result, "datasets.0.template_thinking_key")
    assert status(result, "datasets.0.field_tools") == CARRIED  # Axolotl's default name is ft's: nothing written
    assert "score not passed" in why(result, "datasets.0.message_property_mappings")
    _, result = imported(tmp_path, {**DPO, "datasets": [{"path": "org/pairs", "type": "chat_template",
                                                         "field_thinking": "thinking"}]})
    assert status(result, "datasets.0.field_thinking") == NOT_CARRIED
    assert "chat rows only, not in `preference` rows" in why(result, "datasets.0.field_thinking")


def test_the_message_keys_the_importer_maps_are_those_ft_reads():
    from ft.data.formats import CHAT_KEYS
    from ft.importers.axolotl_data import MESSAGE_KEYS

    assert MESSAGE_KEYS == ("role", "content", *CHAT_KEYS)


def test_completion_and_pretraining_read_text(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "datasets": [{"path": "org/books", "type": "completion",
                                                          "field": "chapter"}],
                                    "pretraining_dataset": [{"path": "org/web", "name": "en", "type": "pretrain",
                                                             "text_column": "content"}]})
    books, web = recipe.data.train
    assert (books.format, books.fields) == ("text", {"text": "chapter"})
    assert (web.format, web.name, web.fields) == ("text", "en", {"text": "content"})


def test_a_loader_with_data_files_becomes_the_file(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"instruction": "a", "output": "b"}\n')
    recipe, _ = imported(tmp_path, {**BASE, "datasets": [{"path": "json", "data_files": str(rows), "type": "alpaca"}]})
    assert recipe.data.train[0].path == str(rows)


def test_an_unknown_prompt_strategy_keeps_its_source_with_the_nearest_format(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "datasets": [{"path": "org/d", "type": "metharme"},
                                                              {"path": "org/e", "type": "jeopardy"}]})
    assert [s.path for s in recipe.data.train] == ["org/d", "org/e"]
    assert recipe.data.train[0].format == "chat"
    assert status(result, "datasets.0.type") == NOT_CARRIED
    assert "nearest ft format, `chat`" in why(result, "datasets.0.type")
    assert recipe.data.train[1].fields == {"instruction": "question", "input": "category", "output": "answer"}
    assert "what is" in why(result, "datasets.1.type")  # carried, with the difference named


def test_test_datasets_and_val_set_size(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "test_datasets": [{"path": "org/held-out", "type": "alpaca",
                                                                    "split": "test"}], "val_set_size": 0.1})
    assert [(s.path, s.split) for s in recipe.data.eval] == [("org/held-out", "test")]
    assert status(result, "val_set_size") == IGNORED
    recipe, _ = imported(tmp_path, {**BASE, "val_set_size": 0.05})
    assert recipe.data.eval.split_ratio == 0.05
    recipe, result = imported(tmp_path, {**BASE, "val_set_size": 0})
    assert not recipe.data.has_eval and status(result, "val_set_size") == CARRIED
    _, result = imported(tmp_path, {**BASE, "val_set_size": 200})
    assert status(result, "val_set_size") == NOT_CARRIED


def test_length_packing_masking_and_cache(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "sequence_len": 2048, "sample_packing": True, "train_on_inputs": True,
                                    "dataset_prepared_path": "last_run_prepared", "dataset_num_proc": 4,
                                    "excess_length_strategy": "truncate"})
    data = recipe.data
    assert (data.max_length, data.packing, data.train_on, data.prepared_path, data.num_proc, data.truncation) == (
        2048, True, "all", "last_run_prepared", 4, "truncate")
    recipe, _ = imported(tmp_path, {**BASE, "sample_packing": False, "train_on_inputs": False})
    assert (recipe.data.packing, recipe.data.train_on, recipe.data.truncation) == (False, "assistant", "drop")


@pytest.mark.parametrize(("config", "expected"), [
    ({"chat_template": "chatml"}, "chatml"), ({"chat_template": "llama3"}, "llama3"),
    ({"chat_template": "tokenizer_default"}, None),
    ({"chat_template": "jinja", "chat_template_jinja": "{% for m in messages %}{{ m['content'] }}{% endfor %}"},
     "{% for m in messages %}{{ m['content'] }}{% endfor %}"),
])
def test_chat_template(tmp_path, config, expected):
    recipe, _ = imported(tmp_path, {**BASE, **config})
    assert recipe.data.chat_template == expected


def test_a_named_template_ft_lacks_is_not_carried(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "chat_template": "gemma3"})
    assert recipe.data.chat_template is None
    assert status(result, "chat_template") == NOT_CARRIED


# --- training ----------------------------------------------------------------------------------------------------


def test_batch_length_and_schedule(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "micro_batch_size": 4, "gradient_accumulation_steps": 8, "num_epochs": 3,
                                    "max_steps": 100, "logging_steps": 5, "seed": 7, "max_grad_norm": 0.5,
                                    "save_total_limit": 2, "output_dir": "./outputs/mine"})
    args = recipe.train_args
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"], args["num_train_epochs"],
            args["max_steps"], args["logging_steps"], args["seed"], args["max_grad_norm"], args["save_total_limit"],
            args["output_dir"]) == (4, 8, 3, 100, 5, 7, 0.5, 2, "./outputs/mine")


def test_batch_size_gives_the_accumulation(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "micro_batch_size": 2, "batch_size": 16})
    assert recipe.train_args["gradient_accumulation_steps"] == 8


def test_optimizer_and_scheduler(tmp_path):
    recipe, _ = imported(tmp_path, "base_model: org/m\ndatasets: [{path: org/d, type: alpaca}]\n"
                                   "optimizer: paged_adamw_8bit\nlearning_rate: 2e-5\nweight_decay: 0.01\n"
                                   "adam_beta2: 0.95\nadam_epsilon: 1e-5\nlr_scheduler: cosine\n"
                                   "cosine_min_lr_ratio: 0.1\nwarmup_steps: 10\nwarmup_ratio: 0.1\n")
    opt, sched = recipe.optimizer, recipe.scheduler
    assert (opt.name, opt.lr, opt.weight_decay, opt.betas, opt.eps) == ("paged_adamw_8bit", 2e-5, 0.01, (0.9, 0.95),
                                                                        1e-5)
    assert (sched.type, sched.kwargs, sched.warmup_steps) == ("cosine_with_min_lr", {"min_lr_rate": 0.1}, 10)


def test_warmup_ratio_and_scheduler_kwargs(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "lr_scheduler": "polynomial", "lr_scheduler_kwargs": {"power": 2.0},
                                    "warmup_ratio": 0.05})
    assert (recipe.scheduler.type, recipe.scheduler.kwargs, recipe.scheduler.warmup_steps) == (
        "polynomial", {"power": 2.0}, 0.05)


def test_an_optimizer_of_axolotls_own_is_not_carried(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "optimizer": "muon", "lr_scheduler": "rex"})
    assert recipe.optimizer.name == "adamw_torch" and recipe.scheduler.type == "linear"  # ft's defaults
    assert status(result, "optimizer") == NOT_CARRIED and status(result, "lr_scheduler") == NOT_CARRIED


def test_activation_checkpointing(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "gradient_checkpointing": True,
                                    "gradient_checkpointing_kwargs": {"use_reentrant": False}})
    assert recipe.train_args["activation_checkpointing"] is True
    assert recipe.train_args["activation_checkpointing_kwargs"] == {"use_reentrant": False}
    recipe, _ = imported(tmp_path, BASE)  # Axolotl's default: off (ft's is on, on a GPU)
    assert recipe.train_args["activation_checkpointing"] is False


def test_evals_and_saves_per_epoch_become_shares_of_all_steps(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "val_set_size": 0.05, "num_epochs": 2, "evals_per_epoch": 4,
                                    "saves_per_epoch": 1})
    args = recipe.train_args
    assert (args["eval_strategy"], args["eval_steps"]) == ("steps", 0.125)  # 1 / (4 × 2)
    assert (args["save_strategy"], args["save_steps"]) == ("steps", 0.5)
    recipe, _ = imported(tmp_path, {**BASE, "val_set_size": 0.05, "num_epochs": 1, "evals_per_epoch": 1,
                                    "saves_per_epoch": 1})
    assert (recipe.train_args["eval_strategy"], recipe.train_args["save_strategy"]) == ("epoch", "epoch")


def test_eval_steps_save_steps_and_no_eval_without_data(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "val_set_size": 0.1, "eval_steps": 50, "save_steps": 100})
    args = recipe.train_args
    assert (args["eval_strategy"], args["eval_steps"], args["save_strategy"], args["save_steps"]) == (
        "steps", 50, "steps", 100)
    recipe, result = imported(tmp_path, {**BASE, "evals_per_epoch": 4})
    assert "eval_strategy" not in recipe.train_args and status(result, "evals_per_epoch") == IGNORED


def test_early_stopping(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "val_set_size": 0.1, "eval_steps": 10, "early_stopping_patience": 3})
    assert [(c.name, c.patience) for c in recipe.callbacks] == [("early_stopping", 3)]
    assert recipe.train_args["metric_for_best_model"] == "eval_loss"


def test_neftune_is_carried_for_sft_and_refused_by_ft_for_dpo(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "neftune_noise_alpha": 5})
    assert recipe.train_args["neftune_noise_alpha"] == 5
    recipe, result = imported(tmp_path, {**DPO, "neftune_noise_alpha": 5})
    assert "neftune_noise_alpha" not in recipe.train_args
    assert status(result, "neftune_noise_alpha") == NOT_CARRIED
    assert why(result, "neftune_noise_alpha").startswith("ft refuses it: `train.neftune_noise_alpha`")


def test_trackers_and_run_name(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "wandb_project": "proj", "wandb_name": "run-1",
                                         "wandb_entity": "team", "wandb_watch": None, "use_tensorboard": True})
    assert sorted(recipe.train_args["report_to"]) == ["tensorboard", "wandb"]
    assert recipe.train_args["run_name"] == "run-1"
    assert "WANDB_PROJECT=proj" in why(result, "wandb_project")
    assert status(result, "wandb_entity") == NOT_CARRIED and "WANDB_ENTITY=team" in why(result, "wandb_entity")
    assert status(result, "wandb_watch") == IGNORED
    recipe, _ = imported(tmp_path, {**BASE, "trackio_project_name": "p", "trackio_run_name": "r",
                                    "trackio_space_id": "me/space"})
    args = recipe.train_args
    assert (args["report_to"], args["project"], args["run_name"], args["trackio_space_id"]) == (
        ["trackio"], "p", "r", "me/space")


def test_hub(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "hub_model_id": "me/model", "hub_strategy": "end"})
    args = recipe.train_args
    assert (args["hub_model_id"], args["push_to_hub"], args["hub_strategy"], args["hub_private_repo"]) == (
        "me/model", True, "end", True)


def test_special_tokens(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "special_tokens": {"pad_token": "<|pad|>", "eos_token": "<|eot|>"}})
    assert recipe.train_args["pad_token"] == "<|pad|>"
    assert status(result, "special_tokens.eos_token") == NOT_CARRIED


def test_liger_plugin_carries_and_other_plugins_do_not(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "plugins": ["axolotl.integrations.liger.LigerPlugin",
                                                             "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"],
                                         "liger_rms_norm": True, "liger_glu_activation": True,
                                         "cut_cross_entropy": True})
    assert recipe.train_args["use_liger_kernel"] is True
    assert recipe.train_args["liger_kernel_config"] == {"rms_norm": True, "swiglu": True, "geglu": True}
    assert status(result, "plugins.1") == NOT_CARRIED
    assert "cut_cross_entropy" in why(result, "cut_cross_entropy")


# --- methods -----------------------------------------------------------------------------------------------------

DPO = {**BASE, "rl": "dpo", "datasets": [{"path": "org/pairs", "type": "chat_template.default",
                                          "field_messages": "conversation", "field_chosen": "good",
                                          "field_rejected": "bad"}]}


def test_dpo_with_chat_template_pairs(tmp_path):
    recipe, _ = imported(tmp_path, {**DPO, "rl_beta": 0.2, "dpo_loss_type": ["sigmoid", "sft"]})
    assert recipe.method == "dpo"
    source = recipe.data.train[0]
    assert (source.format, source.fields) == ("preference", {"prompt": "conversation", "chosen": "good",
                                                             "rejected": "bad"})
    assert (recipe.dpo.beta, recipe.dpo.loss_type) == (0.2, ["sigmoid", "sft"])


def test_ipo_and_trl_beta(tmp_path):
    recipe, result = imported(tmp_path, {**DPO, "rl": "ipo", "rl_beta": 0.5, "trl": {"beta": 0.3}})
    assert (recipe.method, recipe.dpo.loss_type, recipe.dpo.beta) == ("dpo", ["ipo"], 0.3)
    assert status(result, "rl_beta") == IGNORED


def test_chatml_pairs_with_a_question_column(tmp_path):
    recipe, result = imported(tmp_path, {**DPO, "datasets": [{"path": "org/orca", "type": "chatml.intel"}]})
    assert recipe.data.train[0].fields == {"prompt": "question"}
    assert "ChatML" in why(result, "datasets.0.type") or "markup" in why(result, "datasets.0.type")


def test_kto_and_orpo_settings(tmp_path):
    recipe, result = imported(tmp_path, {**DPO, "rl": "kto", "kto_desirable_weight": 1.5, "rl_beta": 0.2,
                                         "datasets": [{"path": "org/kto", "type": "llama3.ultra"}]})
    assert (recipe.method, recipe.kto.desirable_weight, recipe.kto.beta) == ("kto", 1.5, 0.2)
    assert recipe.data.train[0].format == "preference"
    assert status(result, "datasets.0.type") == NOT_CARRIED  # unpaired KTO rows: ft's KTO reads pairs
    recipe, _ = imported(tmp_path, {**DPO, "rl": "orpo", "orpo_alpha": 0.1})
    assert (recipe.method, recipe.orpo.beta) == ("orpo", 0.1)


def test_grpo_with_rewards_and_generation_settings(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "rl": "grpo", "gradient_accumulation_steps": 4,
                                         "datasets": [{"path": "org/math", "type": "rewards.transform"}],
                                         "trl": {"num_generations": 4, "max_completion_length": 64, "beta": 0.0,
                                                 "temperature": 0.8, "use_vllm": False, "scale_rewards": False,
                                                 "reward_funcs": ["rewards.correct", "rewards.short"],
                                                 "reward_weights": [1.0, 0.5]}})
    grpo = recipe.grpo
    assert (recipe.method, grpo.num_generations, grpo.max_completion_length, grpo.beta, grpo.temperature) == (
        "grpo", 4, 64, 0.0, 0.8)
    assert [(r.fn, r.weight) for r in grpo.rewards] == [("rewards:correct", 1.0), ("rewards:short", 0.5)]
    assert (recipe.train_args["use_vllm"], recipe.train_args["scale_rewards"]) == (False, "none")
    assert recipe.data.train[0].format == "prompt" and status(result, "datasets.0.type") == NOT_CARRIED


def test_gdpo_is_grpo_normalising_each_reward(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "rl": "gdpo", "datasets": [{"path": "org/math", "type": "r.t"}],
                                    "trl": {"num_generations": 2, "reward_funcs": ["r.a"]}})
    assert recipe.method == "grpo"
    assert recipe.train_args["multi_objective_aggregation"] == "normalize_then_sum"


def test_an_rl_method_ft_lacks_is_named_at_the_top(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "rl": "ebft", "trl": {"num_generations": 4}})
    assert recipe.method == "sft"
    assert status(result, "rl") == NOT_CARRIED and status(result, "trl.num_generations") == NOT_CARRIED
    assert "WARNING: rl: ebft is not carried" in result.text.splitlines()[2]


def test_a_vision_language_config_is_imported_as_one(tmp_path):
    """A processor means the model reads images: the recipe says so (`model.modality: vision`) and ft accepts it;
    without the processor the same config trains the model as text. The vision keys one by one, the example configs
    and audio: tests/test_import_axolotl_vision.py."""
    config = {**BASE, "base_model": "mistral-community/pixtral-12b", "processor_type": "AutoProcessor",
              "adapter": "lora", "lora_r": 16, "lora_alpha": 32,
              "lora_target_modules": "model.language_model.layers.[\\d]+.(mlp|self_attn).(up|down|gate|q|k|v|o)_proj"}
    recipe, result = imported(tmp_path, config)
    assert recipe.model.modality == "vision" and status(result, "processor_type") == CARRIED
    assert not result.out_of_scope and result.modality == "vision"
    (tmp_path / "text").mkdir()
    text_only, _ = imported(tmp_path / "text", {**config, "processor_type": None})
    assert text_only.model.modality is None


# --- distributed -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "settings"), [
    ("deepspeed_configs/zero1.json", {"stage": 1}),
    ("deepspeed_configs/zero2.json", {"stage": 2, "offload_optimizer": "cpu"}),
    ("deepspeed_configs/zero3_bf16.json", {"stage": 3}),
    ("deepspeed_configs/zero3_bf16_cpuoffload_params.json", {"stage": 3, "offload_params": "cpu"}),
])
def test_axolotls_bundled_deepspeed_configs(tmp_path, path, settings):
    recipe, _ = imported(tmp_path, {**BASE, "optimizer": "adamw_torch", "deepspeed": path})
    ds = recipe.distributed.deepspeed
    assert recipe.distributed.kind == "deepspeed"
    assert {key: getattr(ds, key) for key in settings} == settings
    assert recipe.launch.num_processes == "auto"  # as `axolotl train`: one process per visible GPU


def test_a_deepspeed_file_of_ones_own(tmp_path):
    config = tmp_path / "my_ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    recipe, _ = imported(tmp_path, {**BASE, "deepspeed": str(config)})
    assert recipe.distributed.deepspeed.config == str(config)


def test_fsdp2(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "gradient_checkpointing": True, "fsdp_version": 2, "fsdp_config": {
        "offload_params": True, "state_dict_type": "FULL_STATE_DICT", "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "reshard_after_forward": False,
        "cpu_ram_efficient_loading": True}})
    dist = recipe.distributed
    assert dist.kind == "fsdp"
    fsdp = dist.fsdp
    assert (fsdp.cpu_offload, fsdp.state_dict, fsdp.wrap, fsdp.sharding, fsdp.activation_checkpointing) == (
        True, "full", ["LlamaDecoderLayer"], "shard_grad_op", True)  # checkpointing: FSDP's own
    assert "activation_checkpointing" not in recipe.train_args
    assert status(result, "fsdp_config.cpu_ram_efficient_loading") == NOT_CARRIED


def test_fsdp1_style_options(tmp_path):
    recipe, _ = imported(tmp_path, {**BASE, "fsdp": ["full_shard", "auto_wrap"], "fsdp_config": {
        "fsdp_offload_params": False, "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_activation_checkpointing": True}})
    fsdp = recipe.distributed.fsdp
    assert (recipe.distributed.kind, fsdp.sharding, fsdp.cpu_offload, fsdp.state_dict,
            fsdp.activation_checkpointing) == ("fsdp", "full", False, "sharded", True)


# --- accounting ----------------------------------------------------------------------------------------------------


def test_every_key_is_accounted_for(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "strict": False, "debug": None, "wandb_project": "",
                                         "some_future_key": 3, "unfrozen_parameters": ["lm_head"],
                                         "trl": {"beta": 0.1}})
    assert status(result, "strict") == IGNORED  # false: a feature ft does not have, switched off
    assert status(result, "debug") == IGNORED and status(result, "wandb_project") == IGNORED
    assert status(result, "some_future_key") == NOT_CARRIED and why(result, "some_future_key") == "no ft equivalent"
    assert status(result, "unfrozen_parameters") == NOT_CARRIED
    assert status(result, "trl.beta") == IGNORED  # no rl: Axolotl does not read it either


def test_values_of_the_wrong_kind_are_named_not_a_crash(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "evals_per_epoch": [4], "gradient_checkpointing_kwargs": True,
                                         "plugins": 3, "datasets": [{"path": "org/d", "type": 7}]})
    for key in ("evals_per_epoch", "gradient_checkpointing_kwargs", "plugins", "datasets.0.type"):
        assert status(result, key) == NOT_CARRIED and why(result, key).startswith("Axolotl reads"), key
    assert recipe.data.train[0].path == "org/d"


def test_one_dataset_written_as_a_mapping(tmp_path):
    recipe, result = imported(tmp_path, {**BASE, "datasets": {"path": "org/d", "type": "alpaca"}})
    assert (recipe.data.train[0].path, recipe.data.train[0].format) == ("org/d", "instruction")
    assert status(result, "datasets.type") == CARRIED


def test_a_false_that_changes_an_ft_default_is_not_ignored(tmp_path):
    _, result = imported(tmp_path, {**BASE, "shuffle_merged_datasets": False, "auto_resume_from_checkpoints": False})
    assert status(result, "shuffle_merged_datasets") == NOT_CARRIED
    assert "sequential" in why(result, "shuffle_merged_datasets")
    assert status(result, "auto_resume_from_checkpoints") == NOT_CARRIED


def test_axolotl_defaults_that_differ_from_fts_are_written_out(tmp_path):
    recipe, result = imported(tmp_path, {"base_model": "org/m", "datasets": [{"path": "org/d", "type": "alpaca"}]})
    written = {target for target, _, _ in result.ledger.defaults}
    assert {"train.num_train_epochs", "data.max_length", "scheduler.type", "train.save_strategy"} <= written
    assert (recipe.train_args["num_train_epochs"], recipe.data.max_length, recipe.scheduler.type) == (1, 512, "cosine")


def test_a_recipe_ft_refuses_is_still_written_with_the_reason(tmp_path):
    _, result = imported(tmp_path, {**BASE, "reward_model": True, "model_type": "AutoModelForSequenceClassification",
                                    "datasets": [{"path": "org/pairs", "type": "bradley_terry.chat_template"}]},
                         valid=False)
    assert result.verdict.errors[0].path == "data.train.0.format"
    assert "# ft does not accept this recipe yet:" in result.text


# nine levels of aliases, nine of the level before each: 354 bytes that expand to 9**9 values
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(f"{cur}: &{cur} [{', '.join([f'*{prev}'] * 9)}]\n"
                                                      for prev, cur in pairwise("abcdefghi"))


@pytest.mark.parametrize(("text", "says"), [
    ("base_model: [unclosed", "not valid YAML"), ("- just\n- a list\n", "is a mapping of keys"),
    ("provider: modal\ngpu: h100\n", "not an Axolotl training config"),
    # hostile YAML (issue 43): each refused at its line, in the time the file's size bounds
    ("base_model: x\nextra: &k {self: *k}\n", r"bad.yml:2: extra.self: the alias \*k is inside the value of its own"),
    ("base_model: x\nbase_model: y\n", "bad.yml:2: base_model: is written twice, at lines 1 and 2"),
    ("base_model: !!python/object/apply:os.system ['true']\n", "bad.yml:1: base_model: has the tag"),
    ("base_model: x\n" + BOMB, r"bad.yml:6: e: the anchor &e \(line 6\) expands"),
])
def test_a_config_that_cannot_be_read_is_one_clear_error(tmp_path, text, says):
    path = tmp_path / "bad.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        import_axolotl(path)


def test_a_config_that_is_not_text_or_not_a_file_is_one_clear_error(tmp_path):
    latin = tmp_path / "latin.yml"
    latin.write_bytes(b"base_model: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin.yml:1: is not UTF-8 text: byte 0xe9 at line 1, column 16"):
        import_axolotl(latin)
    with pytest.raises(ConfigError, match="cannot read it \\(is a directory"):
        import_axolotl(tmp_path)


def test_an_alias_bomb_imports_within_a_gib_in_seconds(tmp_path):
    """The nine-level bomb (Axolotl's own reader expands it): `ft import axolotl` under a 1 GiB address-space limit
    exits 2 naming the anchor, where it spun for over a minute in the cycle check."""
    import resource
    import time

    source = tmp_path / "bomb.yml"
    source.write_text("base_model: x\n" + BOMB)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ft", "import", "axolotl", str(source)], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120, preexec_fn=limit)
    assert done.returncode == 2 and time.monotonic() - start < 5, done.stderr[-2000:]
    assert "the anchor &e (line 6)" in done.stderr and "Traceback" not in done.stderr


def test_the_command_imports_no_torch_and_never_the_hub_client(tmp_path):
    """`ft import axolotl` (import and validation) runs on the config alone: no torch, transformers, TRL or
    datasets, and not even huggingface_hub, so a hub model or dataset name is never looked up."""
    source = tmp_path / "axolotl.yml"
    source.write_text(yaml.safe_dump({**DPO, "adapter": "qlora", "load_in_4bit": True, "deepspeed": "zero2.json"}))
    code = ("import sys\n"
            f"sys.argv = ['ft', 'import', 'axolotl', {str(source)!r}, '--out', {str(tmp_path / 'r.yaml')!r}]\n"
            "from ft import cli\n"
            "try:\n    cli.main()\nexcept SystemExit as done:\n    assert not done.code, done.code\n"
            "heavy = [m for m in ('torch', 'transformers', 'trl', 'datasets', 'huggingface_hub') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "r.yaml").is_file()


# --- the command ---------------------------------------------------------------------------------------------------


def test_cli_writes_the_recipe_to_stdout_and_to_a_file_ft_validate_accepts(tmp_path):
    source = tmp_path / "qlora.yml"
    source.write_text(yaml.safe_dump({**BASE, "adapter": "qlora", "load_in_4bit": True, "lora_r": 16,
                                      "loss_watchdog_threshold": 5.0, "wandb_entity": None}))
    done = run_ft("import", "axolotl", str(source), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"# Imported by `ft import axolotl` from the Axolotl config {source}."
    assert "# ---- Not carried (1): no ft equivalent, or a value ft refuses ----" in lines
    assert "# loss_watchdog_threshold: 5.0" in lines
    assert any(line.startswith("# wandb_entity: (empty)") for line in lines)
    assert yaml.safe_load(done.stdout)["adapter"]["r"] == 16
    assert "1 not carried" in done.stderr
    out = tmp_path / "sub" / "recipe.yaml"
    done = run_ft("import", "axolotl", str(source), "--out", str(out), cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert out.read_text() == run_ft("import", "axolotl", str(source), cwd=tmp_path, timeout=120).stdout
    validated = run_ft("validate", str(out), cwd=tmp_path, timeout=120)
    assert validated.returncode == 0, validated.stderr
    assert "quantization" in validated.stdout


def test_cli_exit_codes(tmp_path):
    missing = run_ft("import", "axolotl", str(tmp_path / "nope.yml"), cwd=tmp_path, timeout=120)
    assert missing.returncode == 2 and "cannot read it" in missing.stderr and "Traceback" not in missing.stderr
    refused = tmp_path / "reward.yml"
    refused.write_text(yaml.safe_dump({**BASE, "datasets": [{"path": "org/p", "type": "bradley_terry.chat_template"}]}))
    out = tmp_path / "reward-recipe.yaml"
    done = run_ft("import", "axolotl", str(refused), "--out", str(out), cwd=tmp_path, timeout=120)
    assert done.returncode == 1 and "data.train.0.format" in done.stderr and "Traceback" not in done.stderr
    assert out.is_file()
