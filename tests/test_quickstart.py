"""End to end: the quickstart recipe trains through the real CLI, loss falls, final/ reloads and generates."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import run_ft
from transformers import AutoModelForCausalLM, AutoTokenizer

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart") / "run"
    result = run_ft("train", "recipes/quickstart.yaml", "--set", f"train.output_dir={out}",
                    "--set", "train.max_steps=120", "--set", "train.eval_steps=60",
                    "--set", "train.save_steps=60")
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def test_loss_falls(quickstart_run):
    out, _ = quickstart_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["steps"] == 120
    assert summary["last_train_loss"] < 0.6 * summary["first_train_loss"]
    # eval_on_start gives the untrained loss (≈ ln 512 ≈ 6.2); training must cut it by well over half
    assert summary["first_eval_loss"] > 5.0
    assert summary["eval_loss"] < 0.5 * summary["first_eval_loss"]
    assert summary["train_seconds"] > 0


def test_tokens_per_second_is_tokens_over_train_seconds(quickstart_run):
    """The summary's throughput is measured over its train_seconds (the training call itself): not stretched by the
    final evaluation and save that follow training, nor over a clock of its own."""
    out, _ = quickstart_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens"] > 0 and summary["train_seconds"] > 0
    # both are rounded (0.1 token/s, 1 ms): far below 0.1% over a run of seconds
    assert math.isclose(summary["tokens_per_second"], summary["tokens"] / summary["train_seconds"], rel_tol=1e-3)


def test_output_directory_layout(quickstart_run):
    out, result = quickstart_run
    assert (out / "recipe.yaml").is_file()
    assert (out / "checkpoint-60" / "trainer_state.json").is_file()
    assert (out / "final" / "config.json").is_file()
    assert "model in" in result.stderr


def test_plots_of_loss_learning_rate_grad_norm_tokens_per_second_and_eval_metrics(quickstart_run):
    out, _ = quickstart_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["plots"] == ["plots/loss.png", "plots/learning_rate.png", "plots/grad_norm.png",
                                "plots/tokens_per_second.png", "plots/eval_entropy.png",
                                "plots/eval_mean_token_accuracy.png"]
    for name in summary["plots"]:
        png = (out / name).read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000  # axes and a line, not an empty canvas


def test_final_loads_with_auto_classes_and_generates(quickstart_run):
    out, _ = quickstart_run
    tokenizer = AutoTokenizer.from_pretrained(out / "final")
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    messages = [{"role": "system", "content": "You are a calculator."},
                {"role": "user", "content": "What is 12 + 7?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    new_tokens = generated[0, inputs["input_ids"].shape[1]:]
    text = tokenizer.decode(new_tokens, skip_special_tokens=True)
    assert len(new_tokens) > 0
    # a trained model answers with digits, as the data taught it (a random one emits arbitrary bytes)
    assert text.strip() and text.strip()[0].isdigit(), text


def test_tokens_are_the_non_padding_tokens_the_model_received(write_recipe, tmp_path):
    """summary.json's ``tokens`` against a count taken where the batches enter the model (a forward pre-hook, train
    mode only): the attention mask's ones. Rows of different lengths are padded in each batch, so a count that
    included padding, or one taken from the data instead of the batches, would differ."""
    from conftest import tiny_sft
    from transformers import TrainerCallback

    from ft.recipe import load_recipe
    from ft.run.train import train

    fed = {"real": 0, "positions": 0}

    def count(module, args, kwargs):
        if module.training:
            mask = kwargs["attention_mask"]
            fed["real"] += int(mask.sum())
            fed["positions"] += mask.numel()

    class Hook(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            model.register_forward_pre_hook(count, with_kwargs=True)

    recipe = tiny_sft(tmp_path / "out", max_steps=5, gradient_accumulation_steps=2)
    result = train(load_recipe(write_recipe(recipe)), resume="never", say=lambda _: None, callbacks=[Hook()])
    assert result.summary["tokens"] == fed["real"] < fed["positions"]
    assert result.summary["samples"] == 5 * 2 * 8  # steps × accumulation × batch
    assert result.summary["padding_efficiency"] == round(fed["real"] / fed["positions"], 4)
