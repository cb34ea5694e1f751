"""The shipped real-model recipe end to end: SmolLM2-135M-Instruct put in place by the documented command
(``python scripts/get_smollm2.py``), trained by ``recipes/smollm2-sft.yaml`` (shortened) through the real CLI, scored
before and after by the run itself; then ``ft merge`` and ``ft generate`` on what it trained.

The base model explains instead of answering ("To add 26 and 3, …") and runs past the 8-token budget; a short LoRA
run teaches it the bare number and to end its turn with ``<|im_end|>``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DATA, ROOT, run_ft, without_module

pytestmark = pytest.mark.slow
RECIPE = ROOT / "recipes" / "smollm2-sft.yaml"
HELD_OUT = 40  # held-out sums scored before and after (the shipped recipe scores 200)
# of the recipe's 80 steps; measured on 2 cores (2026-12-03, seed 0): exact match 0.80 of 40 after 30 steps, 0.945
# of 200 after 80 (token accuracy 0.91 at step 30, 0.93 at 40); about 1.4 s a step
STEPS = 40
PROMPTS = 20  # greedy answers compared between the adapter run and its merged model


@pytest.fixture(scope="module")
def trained(smollm2, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "run"
    # no eval loss (16 s): the held-out sums come from the prompt rows of the same questions instead of data.eval
    held_out = f"{{n: {HELD_OUT}, source: {{path: {DATA / 'prompts-eval.jsonl'}, format: prompt}}}}"
    result = run_ft("train", str(RECIPE), "--set", f"train.output_dir={out}", "--set", f"train.max_steps={STEPS}",
                    "--set", "data.eval=[]", "--set", f"data.eval_exact_match={held_out}",
                    "--set", "train.save_strategy='no'")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_the_base_model_fails_the_sums_and_the_trained_one_answers_them(trained):
    summary = _summary(trained)
    before, after = summary["exact_match_before"], summary["exact_match"]
    assert before["n"] == after["n"] == HELD_OUT
    assert before["exact_match"] <= 0.3, before  # the base explains ("To add 26 and 3, you simply add…")
    assert after["exact_match"] >= 0.8, after
    assert summary["base_model"]["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (trained / "final" / "adapter_model.safetensors").is_file()


def test_the_trained_model_learns_to_stop(trained):
    """Its answers end with the template's end-of-turn token within 8 tokens; the base's run past them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained / "final")
    assert tokenizer.eos_token == "<|im_end|>" == tokenizer.pad_token  # what ended_turn stops on: the end of turn
    summary = _summary(trained)
    assert summary["exact_match"]["ended_turn"] >= 0.95, summary["exact_match"]
    assert summary["exact_match_before"]["ended_turn"] <= 0.2, summary["exact_match_before"]


def _prompts(tmp_path: Path) -> Path:
    rows = [json.loads(line)["messages"][:-1] for line in (DATA / "eval.jsonl").read_text().splitlines()]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"messages": messages}) + "\n" for messages in rows[:PROMPTS]))
    return path


def _generated(model: Path, prompts: Path) -> list[str]:
    result = run_ft("generate", str(model), "--file", str(prompts), "--max-new-tokens", "12")
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line)["completion"] for line in result.stdout.splitlines() if line.strip()]


def _base_answers(gguf: Path, prompts: Path) -> list[str]:
    """Greedy answers of the base model, loaded as transformers loads a GGUF file, through its own chat template
    (one left-padded batch)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    texts = [tokenizer.apply_chat_template(json.loads(line)["messages"], add_generation_prompt=True, tokenize=False)
             for line in prompts.read_text().splitlines()]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        output = model.generate(**batch, max_new_tokens=12, do_sample=False)
    return tokenizer.batch_decode(output[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


def test_merge_and_generate_give_the_adapter_runs_answers(trained, smollm2, tmp_path):
    """``ft merge`` folds the adapter into the de-quantized base; greedy text from the merged model equals the
    adapter run's on prompts where training changed the answer (the base's answers differ, so an untouched base
    could not pass)."""
    merged = tmp_path / "merged"
    result = run_ft("merge", str(trained), "--out", str(merged))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    prompts = _prompts(tmp_path)
    adapter, folded = _generated(trained, prompts), _generated(merged, prompts)
    base = _base_answers(smollm2, prompts)
    changed = [i for i in range(PROMPTS) if adapter[i].strip() != base[i].strip()]
    assert len(changed) == PROMPTS, list(zip(base, adapter, strict=True))
    assert folded == adapter
    # the run's base is rebuilt from its recipe.yaml, and checked as ft train checks it, before it loads
    refused = run_ft("generate", str(trained), "--prompt", "Hi", env={"PYTHONPATH": str(without_module(tmp_path,
                                                                                                      "gguf"))})
    assert refused.returncode == 2 and "pip install 'ft[gguf]'" in refused.stderr, refused.stderr[-2000:]
