"""``method: reward``: TRL's RewardTrainer on preference pairs trains a sequence classifier with one score that ranks
chosen above rejected on held-out pairs; ``final/`` loads with ``AutoModelForSequenceClassification``; summary.json
and the console report pair accuracy and margin; a LoRA reward run keeps its new score head and merges; what a
scoring model cannot do (exact match, ft generate, ft export) is refused with the reason.

The pairs: the arithmetic questions, answered with the bare number (chosen) or with a refusal (rejected), a
difference a small model learns in a few dozen steps, so the test is about the trainer, not about arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import ASSETS, DATA, run_ft, tiny_sft

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model

REFUSAL = [{"role": "assistant", "content": "I am not able to work that out."}]


def _pairs(folder: Path, source: str, count: int) -> Path:
    rows = [json.loads(line) for line in (DATA / source).read_text().splitlines()[:count]]
    path = folder / source
    path.write_text("".join(json.dumps({**row, "rejected": REFUSAL}) + "\n" for row in rows))
    return path


def _recipe(folder: Path, **train) -> dict:
    settings = {"max_steps": 40, "per_device_train_batch_size": 16, "logging_steps": 10, "eval_strategy": "steps",
                "eval_steps": 20, "eval_on_start": True, "per_device_eval_batch_size": 50, **train}
    recipe = tiny_sft(folder / "run", **settings)
    recipe.update(method="reward", optimizer={"lr": 1.0e-3})
    recipe["data"] = {"train": [{"path": str(_pairs(folder, "preference.jsonl", 640)), "format": "preference"}],
                      "eval": [{"path": str(_pairs(folder, "preference-eval.jsonl", 100)), "format": "preference"}],
                      "max_length": 64}
    return recipe


def _train(folder: Path, recipe: dict, *args: str):
    import yaml

    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return run_ft("train", str(path), *args)


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("reward")
    result = _train(folder, _recipe(folder))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "acc " in result.stderr and "margin " in result.stderr  # the console's training line
    return folder / "run"


def _scores(model_dir: Path, rows: list[dict], model=None) -> torch.Tensor:
    """(chosen score, rejected score) per row, computed here from the saved model and tokenizer alone (or from
    ``model``, given, with that tokenizer)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = (AutoModelForSequenceClassification.from_pretrained(model_dir) if model is None else model).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.num_labels == 1
    out = []
    for row in rows:
        pair = []
        for answer in (row["chosen"], row["rejected"]):
            ids = tokenizer.apply_chat_template(row["prompt"] + answer, tokenize=True, return_tensors="pt",
                                                return_dict=True)
            with torch.no_grad():
                pair.append(float(model(**ids).logits[0, 0]))
        out.append(pair)
    return torch.tensor(out)


def test_a_reward_model_learns_to_rank_chosen_above_rejected(reward_run):
    summary = json.loads((reward_run / "summary.json").read_text())
    figures = summary["headline"]
    assert figures["source"] == "eval"
    accuracy, margin = figures["pair_accuracy"], figures["reward_margin"]
    # the new score head ranks the two kinds of answer one way or the other by chance, with a margin near 0;
    # training opens the margin in the right direction
    assert margin["first_step"] == 0 and abs(margin["first"]) < 0.5, margin
    assert accuracy["last"] >= 0.95 and margin["last"] > margin["first"] + 1.0, figures
    rows = [json.loads(line) for line in (reward_run.parent / "preference-eval.jsonl").read_text().splitlines()]
    scores = _scores(reward_run / "final", rows[:30])
    assert float((scores[:, 0] > scores[:, 1]).float().mean()) >= 0.95, scores


def test_exact_match_generate_and_export_are_refused_for_a_reward_model(reward_run, tmp_path):
    recipe = _recipe(tmp_path)
    recipe["data"]["eval_exact_match"] = {"n": 10}
    result = _train(tmp_path, recipe)
    assert result.returncode == 2 and "data.eval_exact_match" in result.stderr and "scores texts" in result.stderr
    assert not (tmp_path / "run").exists()
    generated = run_ft("generate", str(reward_run), "--prompt", "What is 2 + 2?")
    assert generated.returncode == 2 and "is a reward model" in generated.stderr
    exported = run_ft("export", str(reward_run), "--gguf", str(tmp_path / "rm.gguf"))
    assert exported.returncode == 2 and "is a reward model" in exported.stderr and not (tmp_path / "rm.gguf").exists()


def _random_lm(folder: Path) -> Path:
    """A causal LM of the shipped config with random weights (seed 0), saved with the shipped tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ASSETS)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(ASSETS).save_pretrained(folder)
    return folder


def _as_adapter(run: Path, rows: list[dict], base_dir: Path, **base_kwargs) -> torch.Tensor:
    """The scores of ``rows`` by the run's adapter (final/) applied by PEFT, in this process, on its base read here
    with transformers (a sequence classifier from ``base_dir``; the adapter brings the trained score head, and the
    rows of tokens its tokenizer added to the base's, with the embeddings resized to hold them as in training)."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    base = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=1, **base_kwargs)
    tokens = len(AutoTokenizer.from_pretrained(run / "final"))
    if tokens > base.get_input_embeddings().num_embeddings:
        base.resize_token_embeddings(tokens)
    return _scores(run / "final", rows, PeftModel.from_pretrained(base, run / "final"))


def _assert_merged_scores_as_adapter(merged: torch.Tensor, adapter: torch.Tensor) -> None:
    # the texts score differently (by 0.1 and more, measured), and the merged model gives the adapter's scores
    assert merged.max() - merged.min() > 0.05 and torch.allclose(merged, adapter, rtol=1e-4, atol=1e-5), \
        (merged, adapter)


def test_a_lora_reward_model_saves_its_score_head_and_merges(tmp_path):
    """The merged model scores texts as the run's adapter does on its base (PEFT, in this process, on a random model
    saved here, which the test reads itself): its LoRA weights and its trained score head are both folded in."""
    recipe = _recipe(tmp_path, max_steps=20, eval_strategy="no", eval_on_start=False)
    recipe["model"] = {"name": str(_random_lm(tmp_path / "base")), "init": "pretrained"}
    recipe["adapter"] = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
    recipe["data"]["max_length"] = 24  # shorter than every pair: refused, nothing trains
    result = _train(tmp_path, recipe)
    assert result.returncode == 2 and "every one of its 640 pairs" in result.stderr, result.stderr[-2000:]
    recipe["data"]["max_length"] = 43  # shorter than some pairs: they are left out, and the run says how many
    result = _train(tmp_path, recipe, "--overwrite")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pairs have a chosen or rejected text longer than data.max_length (43 tokens)" in result.stderr
    adapter = json.loads((tmp_path / "run" / "final" / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_CLS" and "score" in " ".join(adapter["modules_to_save"] or [])
    merged = run_ft("merge", str(tmp_path / "run"), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr[-3000:]
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"]  # one label: _scores checks it
    rows = [json.loads(line) for line in (tmp_path / "preference-eval.jsonl").read_text().splitlines()]
    _assert_merged_scores_as_adapter(_scores(tmp_path / "merged", rows[:5]),
                                      _as_adapter(tmp_path / "run", rows[:5], tmp_path / "base"))


def test_a_reward_model_from_a_gguf_file_trains_and_merges(tmp_path):
    """A GGUF file's de-quantized weights become a sequence classifier (the real-model recipe smollm2-reward.yaml
    does this): the model carried no generation config over, and LoRA's merge rebuilds the same base, so the merged
    model scores texts as the adapter does on the GGUF file's weights, read here by transformers."""
    pytest.importorskip("gguf")
    from ft.export.gguf import export

    gguf = export(_random_lm(tmp_path / "lm"), tmp_path / "gguf" / "lm.gguf", "f32", say=lambda _: None).path
    recipe = _recipe(tmp_path, max_steps=2, eval_strategy="no", eval_on_start=False)
    recipe["model"] = {"name": str(gguf.parent), "gguf_file": gguf.name, "init": "pretrained"}
    recipe["adapter"] = {"kind": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"}
    result = _train(tmp_path, recipe)
    assert result.returncode == 0, result.stderr[-3000:]
    merged = run_ft("merge", str(tmp_path / "run"), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "preference-eval.jsonl").read_text().splitlines()]
    _assert_merged_scores_as_adapter(_scores(tmp_path / "merged", rows[:5]),
                                      _as_adapter(tmp_path / "run", rows[:5], gguf.parent, gguf_file=gguf.name))
