"""The worst batch first (train.preflight): before the first step, forward and backward of the largest batch the data
makes, measured; training afterwards is bit-identical to a run without it; a batch that does not fit stops the run
with exit 2 and the changes that would fit, before any step or checkpoint. Run on the CPU with the same code as on
a GPU (``train.preflight: true``; unset, it is on only where CUDA is)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ASSETS, DATA, ROOT, assert_same_final_weights, run_ft, tiny_sft
from test_preference import preference_recipe

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model

TIMING = {"tokens_per_second", "step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second",
          "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "peak_memory_gb"}


def _history(out) -> list[dict]:
    rows = json.loads((out / "log_history.json").read_text())
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def _lora_recipe(out, preflight: bool | None) -> dict:
    """LoRA with dropout on a random model, in train mode at every step: each forward draws from the torch RNG, so
    a probe that left the RNG advanced would change every later step."""
    recipe = tiny_sft(out, max_steps=6, logging_steps=1, seed=3, eval_strategy="no")
    recipe["adapter"] = {"kind": "lora", "r": 8, "dropout": 0.3, "target_modules": ["q_proj", "v_proj"]}
    if preflight is not None:
        recipe["train"]["preflight"] = preflight
    return recipe


def test_training_after_the_probe_is_bit_identical_to_training_without_it(write_recipe, tmp_path):
    runs = {}
    for preflight in (True, False):
        out = tmp_path / ("probed" if preflight else "plain")
        result = run_ft("train", str(write_recipe(_lora_recipe(out, preflight), name=f"{preflight}.yaml")))
        assert result.returncode == 0, result.stderr[-3000:]
        runs[preflight] = (out, result.stdout + result.stderr)
    (probed, said), (plain, quiet) = runs[True], runs[False]
    assert "preflight: memory: the largest batch (input_ids 8 × " in said and "preflight: memory" not in quiet
    assert _history(probed) == _history(plain)  # losses, grad norms, token counts, entropy, accuracy: all equal
    assert_same_final_weights(probed, plain)
    summary = json.loads((probed / "summary.json").read_text())
    assert summary["preflight"]["measured"] == "process_rss_growth" and summary["preflight"]["peak_bytes"] > 0
    assert json.loads((plain / "summary.json").read_text())["preflight"] is None


def test_unset_it_is_off_on_a_cpu(write_recipe, tmp_path):
    out = tmp_path / "out"
    result = run_ft("train", str(write_recipe(tiny_sft(out, max_steps=1))))
    assert result.returncode == 0 and "preflight: memory" not in result.stdout + result.stderr
    assert json.loads((out / "summary.json").read_text())["preflight"] is None


def test_the_probe_takes_the_longest_rows_at_the_batch_size(write_recipe, tmp_path):
    """Among short sums, three long chats: the probed batch is padded to the longest row (as ft tokenized it)."""
    from transformers import AutoTokenizer

    rows = (DATA / "train.jsonl").read_text().splitlines()[:40]
    long = [{"messages": [{"role": "user", "content": "What is " + " + ".join(["1"] * n) + "?"},
                          {"role": "assistant", "content": str(n)}]} for n in (20, 30, 25)]
    (tmp_path / "train.jsonl").write_text("\n".join(rows[:10] + [json.dumps(row) for row in long] + rows[10:]) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(ASSETS)
    longest = len(tokenizer.apply_chat_template(long[1]["messages"], tokenize=True, return_dict=True)["input_ids"])
    recipe = tiny_sft(tmp_path / "out", max_steps=1, per_device_train_batch_size=4, preflight=True)
    recipe["data"].update(train=[{"path": str(tmp_path / "train.jsonl"), "format": "chat"}], eval=[],
                          max_length=256)
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    probe = json.loads((tmp_path / "out" / "summary.json").read_text())["preflight"]
    assert probe["batch"]["tensors"]["input_ids"] == [4, longest] and longest > 64
    assert f"input_ids 4 × {longest}" in result.stdout + result.stderr


def test_dpo_probes_chosen_and_rejected_together_and_stays_bit_identical(write_recipe, tmp_path):
    runs = {}
    for preflight in (True, False):
        out = tmp_path / f"dpo-{preflight}"
        recipe = preference_recipe("dpo", ASSETS, out, init="random", train_fraction=0.05, max_steps=3,
                                   eval_strategy="no", preflight=preflight)
        result = run_ft("train", str(write_recipe(recipe, name=f"{preflight}.yaml")))
        assert result.returncode == 0, result.stderr[-3000:]
        runs[preflight] = out
    probe = json.loads((runs[True] / "summary.json").read_text())["preflight"]
    (sequences, length), = probe["batch"]["tensors"].values()  # TRL 1.16: chosen and rejected in one input_ids
    assert sequences == probe["batch"]["sequences"] == 16 and length > 0
    assert _history(runs[True]) == _history(runs[False])
    assert_same_final_weights(runs[True], runs[False])


LIMITED = """
import resource, runpy, sys
import torch, transformers, trl, peft, datasets  # noqa: F401  (their mappings count before the limit)
with open("/proc/self/status") as f:
    size = int(next(line for line in f if line.startswith("VmSize:")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + int(sys.argv[1]), resource.RLIM_INFINITY))
sys.argv = ["ft", *sys.argv[2:]]
runpy.run_module("ft", run_name="__main__")
"""


def test_a_batch_that_does_not_fit_stops_before_any_step_with_the_changes_that_fit(write_recipe, tmp_path):
    """The address space is limited to what the libraries map plus 1.5 GiB: the model (the tiny Llama with a
    32000-token vocabulary) and short rows fit, but the longest rows' logits (16 × 1024 positions × 32000 × 4 bytes =
    2 GiB) do not. The CPU allocator's failure is what CUDA's out-of-memory error is on a GPU."""
    model = tmp_path / "model"
    shutil.copytree(ASSETS, model)
    config = json.loads((model / "config.json").read_text())
    config.update(vocab_size=32000, hidden_size=256, max_position_embeddings=2048)
    (model / "config.json").write_text(json.dumps(config))
    rows = [json.dumps({"text": " ".join(f"w{i}" for i in range(n))}) for n in [20] * 30 + [400] * 16]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=2, per_device_train_batch_size=16, preflight=True, save_strategy="steps",
                      save_steps=1)
    recipe["model"]["name"] = str(model)
    recipe["data"].update(train=[{"path": str(tmp_path / "train.jsonl"), "format": "text"}], eval=[],
                          max_length=1024)
    path = write_recipe(recipe)
    env_python = [sys.executable, "-c", LIMITED, str(3 * 2**29), "train", str(path)]
    # a bounded number of threads and malloc arenas: each arena reserves address space, more on a machine with more
    # cores, which would otherwise eat into the limit before the probe
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(env_python, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    said = result.stdout + result.stderr
    assert result.returncode == 2, said[-3000:]
    assert ("preflight: memory: the largest batch the data makes (input_ids 16 × 1024, per device) ran out of "
            "memory") in said
    assert "train.per_device_train_batch_size: 8, train.gradient_accumulation_steps: 2" in said
    assert "train.gradient_checkpointing: true" in said and "Traceback" not in said
    assert not any(out.glob("checkpoint-*")) and not (out / "final").exists()
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"


@pytest.mark.parametrize("value", ["yes", 1])
def test_train_preflight_takes_only_true_or_false(write_recipe, tmp_path, value):
    result = run_ft("validate", str(write_recipe(tiny_sft(tmp_path / "out", preflight=value))))
    assert result.returncode == 2 and "train.preflight" in result.stderr


def test_grpo_probes_the_longest_prompts_with_full_completions_and_stays_bit_identical(write_recipe, tmp_path):
    """GRPO samples its batches: the probe puts the longest prompts, each followed by max_completion_length tokens,
    forward and backward through the policy; the sampling after it (torch's RNG) is the run's own."""
    from test_grpo import tiny_grpo

    runs = {}
    for preflight in (True, False):
        out = tmp_path / ("probed" if preflight else "plain")
        # a reward the random model's answers spread over (their lengths), so every step trains
        recipe = tiny_grpo(out, [{"name": "length_penalty", "args": {"target": 3}}], max_steps=3, preflight=preflight)
        result = run_ft("train", str(write_recipe(recipe, name=f"{preflight}.yaml")))
        assert result.returncode == 0, result.stderr[-3000:]
        runs[preflight] = out
    probe = json.loads((runs[True] / "summary.json").read_text())["preflight"]
    (sequences, length), = probe["batch"]["tensors"].values()
    assert sequences == 16 and length > 8  # 16 completions a step; prompt + the 8 completion tokens
    history = _history(runs[True])
    assert history == _history(runs[False])  # the same samples, rewards, losses
    assert all(row["grad_norm"] > 0 for row in history if "grad_norm" in row)  # it trained: equal weights tell
    assert_same_final_weights(runs[True], runs[False])
