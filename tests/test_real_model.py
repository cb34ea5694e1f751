"""The shipped real-model recipe end to end: SmolLM2-135M-Instruct put in place by the documented command
(``python scripts/get_smollm2.py``), trained by ``recipes/smollm2-sft.yaml`` (shortened) through the real CLI, scored
before and after by the run itself; then ``ft merge`` and ``ft generate`` on what it trained.

The base model explains instead of answering ("To add 26 and 3, …") and runs past the 8-token budget; a short LoRA
run teaches it the bare number and to end its turn with ``<|im_end|>``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DATA, ROOT, run_ft, train_shortened, without_module

pytestmark = [pytest.mark.slow, pytest.mark.full]  # the full check (conftest.FULL_CHECK): minutes of training
RECIPE = ROOT / "recipes" / "smollm2-sft.yaml"
HELD_OUT = 40  # held-out sums scored before and after (the shipped recipe scores 200)
# of the recipe's 80 steps; measured on 2 cores (2026-12-03, seed 0): exact match 0.80 of 40 after 30 steps, 0.945
# of 200 after 80 (token accuracy 0.91 at step 30, 0.93 at 40); about 1.4 s a step
STEPS = 40
PROMPTS = 20  # greedy answers compared between the adapter run and its merged model
BENCHMARKED = 10  # rows of each shipped lm-eval task the recipe's benchmarks score (it scores 100)


@pytest.fixture(scope="module")
def trained(smollm2, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "run"
    # no eval loss (16 s): the held-out sums come from the prompt rows of the same questions instead of data.eval
    held_out = f"{{n: {HELD_OUT}, source: {{path: {DATA / 'prompts-eval.jsonl'}, format: prompt}}}}"
    return train_shortened(RECIPE, out, STEPS, held_out, f"benchmarks.limit={BENCHMARKED}")


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_ft_plan_says_the_runs_peak_memory(trained):
    """``ft plan --device cpu`` of the recipe as it was trained (the same --set flags) gives the process's peak, the
    figure summary.json measures (peak RSS: the training step, exact match and the benchmarks' passes, and the
    libraries), within 15%, and says what drives it (issue 47, item 14)."""
    import yaml

    recipe = yaml.safe_load((trained / "recipe.yaml").read_text())
    sets = [f"data.eval_exact_match={json.dumps(recipe['data']['eval_exact_match'])}", "data.eval=[]"]
    plan = run_ft("plan", str(RECIPE), "--device", "cpu", "--json", *(arg for s in sets for arg in ("--set", s)))
    assert plan.returncode == 0, plan.stderr[-3000:]
    expected = json.loads(plan.stdout)["process_peak_bytes"]
    measured = _summary(trained)["peak_memory_gb"] * 2**30
    assert 0.85 <= measured / expected <= 1.15, (measured / 2**30, expected / 2**30)
    said = run_ft("plan", str(RECIPE), "--device", "cpu", *(arg for s in sets for arg in ("--set", s))).stdout
    assert "The peak is the training step's forward" in said and "peak_memory_gb" in said


def test_the_base_model_fails_the_sums_and_the_trained_one_answers_them(trained):
    summary = _summary(trained)
    before, after = summary["exact_match_before"], summary["exact_match"]
    assert before["n"] == after["n"] == HELD_OUT
    assert before["exact_match"] <= 0.3, before  # the base explains ("To add 26 and 3, you simply add…")
    assert after["exact_match"] >= 0.8, after
    assert summary["base_model"]["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (trained / "final" / "adapter_model.safetensors").is_file()


def test_the_shipped_benchmarks_are_scored_before_and_after(trained):
    """The recipe's lm-eval tasks, scored in the run: the base answers no sum (it explains), the trained one answers
    most; ft report shows both figures."""
    benchmarks = _summary(trained)["benchmarks"]
    before, end = benchmarks["before"], benchmarks["end"]
    assert before["arithmetic_sums"]["exact_match"] <= 0.2, before
    assert end["arithmetic_sums"]["exact_match"] >= 0.7, end
    assert end["arithmetic_choice"]["acc"] > before["arithmetic_choice"]["acc"], benchmarks
    report = run_ft("report", str(trained))
    assert report.returncode == 0, report.stderr[-2000:]
    (row,) = [line for line in report.stdout.splitlines() if line.startswith("arithmetic_sums exact_match")]
    assert "→" in row, row


def test_the_trained_model_learns_to_stop(trained):
    """Its answers end with the template's end-of-turn token within 8 tokens; the base's run past them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained / "final")
    assert tokenizer.eos_token == "<|im_end|>" == tokenizer.pad_token  # what ended_turn stops on: the end of turn
    summary = _summary(trained)
    assert summary["exact_match"]["ended_turn"] >= 0.95, summary["exact_match"]
    assert summary["exact_match_before"]["ended_turn"] <= 0.2, summary["exact_match_before"]


def _first_prompts(tmp_path: Path) -> Path:
    """The first PROMPTS held-out questions (the fixture's exact-match source), as ``ft generate --file`` reads them."""
    rows = [json.loads(line)["prompt"] for line in (DATA / "prompts-eval.jsonl").read_text().splitlines()]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"messages": messages}) + "\n" for messages in rows[:PROMPTS]))
    return path


def test_the_run_keeps_every_answer_before_and_after(trained):
    lines = [json.loads(line) for line in (trained / "exact_match.jsonl").read_text().splitlines()]
    assert len(lines) == HELD_OUT and set(lines[0]) == {"prompt", "expected", "before", "after"}
    assert lines[0]["prompt"] == "What is 57 + 6?" and lines[0]["expected"] == "63"
    summary = _summary(trained)
    assert sum(line["after"] == line["expected"] for line in lines) / HELD_OUT == summary["exact_match"]["exact_match"]
    assert summary["exact_match"]["examples"] == [{"prompt": line["prompt"], "expected": line["expected"],
                                                   "got": line["after"]} for line in lines[:3]]


@pytest.fixture(scope="module")
def merged(trained, tmp_path_factory) -> Path:
    """``ft merge`` of the run: the adapter folded into the de-quantized base."""
    out = tmp_path_factory.mktemp("smollm2-merged") / "merged"
    result = run_ft("merge", str(trained), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_merge_and_generate_give_the_adapter_runs_answers(trained, merged, tmp_path):
    """``ft merge`` folds the adapter into the de-quantized base; ``ft generate`` on the merged model answers as the
    adapter run itself answered (its exact_match.jsonl, scored in memory at the end of training), on prompts where
    training changed the answer (the base's, scored before training, differ: an untouched base could not pass)."""
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    scored = [json.loads(line) for line in (trained / "exact_match.jsonl").read_text().splitlines()][:PROMPTS]
    assert all(row["after"] != row["before"] for row in scored), scored
    generated = run_ft("generate", str(merged), "--file", str(_first_prompts(tmp_path)), "--max-new-tokens", "8")
    assert generated.returncode == 0, generated.stderr[-3000:]
    folded = [json.loads(line)["completion"].strip() for line in generated.stdout.splitlines() if line.strip()]
    assert folded == [row["after"] for row in scored]
    # the run's base is rebuilt from its recipe.yaml, and checked as ft train checks it, before it loads
    refused = run_ft("generate", str(trained), "--prompt", "Hi", env={"PYTHONPATH": str(without_module(tmp_path,
                                                                                                      "gguf"))})
    assert refused.returncode == 2 and "pip install 'ft[gguf]'" in refused.stderr, refused.stderr[-2000:]


def test_export_writes_a_gguf_that_answers_as_the_run_did(trained, merged, tmp_path):
    """``ft export`` of the merged model (an adapter run exports to the same bytes as its merge: test_export.py)
    writes f16 GGUF; transformers reads the file back (model and tokenizer from the GGUF alone) and answers the
    held-out prompts as the run itself answered, with SmolLM2's real tokenizer encoding the training data to the same
    ids and the chat template carried over."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "smollm2-sums.gguf"
    result = run_ft("export", str(merged), "--gguf", str(out), "--quant", "f16", "--modelfile")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "f16" in result.stderr and "llama architecture" in result.stderr
    modelfile = (tmp_path / "smollm2-sums.Modelfile").read_text()
    assert modelfile.startswith("FROM ./smollm2-sums.gguf\n") and 'PARAMETER stop "<|im_end|>"' in modelfile
    assert "You are a helpful AI assistant named SmolLM" in modelfile  # the template's default system prompt
    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=out.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file=out.name)
    source = AutoTokenizer.from_pretrained(trained / "final")
    assert tokenizer.chat_template == source.chat_template
    for line in (DATA / "train.jsonl").read_text().splitlines()[:50]:
        text = source.apply_chat_template(json.loads(line)["messages"], tokenize=False)
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == source(text, add_special_tokens=False)[
            "input_ids"]
    scored = [json.loads(line) for line in (trained / "exact_match.jsonl").read_text().splitlines()][:PROMPTS]
    prompts = [json.loads(line)["prompt"] for line in (DATA / "prompts-eval.jsonl").read_text().splitlines()]
    answers = []
    for messages in prompts[:PROMPTS]:
        encoded = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                            add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            output = model.generate(**encoded, max_new_tokens=8, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)
        answers.append(tokenizer.decode(output[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True).strip())
    assert answers == [row["after"] for row in scored]
