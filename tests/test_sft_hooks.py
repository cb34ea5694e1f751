"""What a recipe plugs into SFT: a custom loss, callbacks (user and early stopping), batch-wise metrics,
and the exit-2 errors for user code that is missing or has the wrong signature."""

from __future__ import annotations

import importlib
import textwrap

import pytest
from conftest import run_ft, tiny_sft

from ft.recipe import load_recipe
from ft.run import train


def _module(tmp_path, name: str, code: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))


def _train(path):
    return train(load_recipe(path), resume="never", say=lambda _: None)


def test_custom_loss_is_called_with_num_items_in_batch(write_recipe, tmp_path):
    _module(tmp_path, "losses_a", """
        import torch.nn.functional as F
        CALLS = []

        def summed_ce(outputs, labels, num_items_in_batch):
            CALLS.append(num_items_in_batch)
            logits = outputs.logits[:, :-1, :].float()
            targets = labels[:, 1:]
            total = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100, reduction="sum")
            return total / num_items_in_batch
    """)
    recipe = tiny_sft(tmp_path / "out", max_steps=30, logging_steps=5, gradient_accumulation_steps=2)
    recipe["loss"] = "losses_a:summed_ce"
    result = _train(write_recipe(recipe))
    calls = importlib.import_module("losses_a").CALLS
    # 30 optimizer steps × 2 micro-batches, then the final evaluation's 25 batches (200 rows / 8)
    assert len(calls) == 60 + 25
    assert all(n is not None and int(n) > 0 for n in calls)
    # in training the count covers both accumulated micro-batches: the same value twice in a row
    assert all(int(calls[i]) == int(calls[i + 1]) for i in range(0, 60, 2))
    assert result.summary["last_train_loss"] < result.summary["first_train_loss"]


def test_user_callback_with_kwargs(write_recipe, tmp_path):
    _module(tmp_path, "callbacks_a", """
        from transformers import TrainerCallback

        class CountSteps(TrainerCallback):
            SEEN = []

            def __init__(self, label):
                self.label = label

            def on_step_end(self, args, state, control, **kwargs):
                CountSteps.SEEN.append((self.label, state.global_step))
    """)
    recipe = tiny_sft(tmp_path / "out", max_steps=3)
    recipe["callbacks"] = [{"cls": "callbacks_a:CountSteps", "kwargs": {"label": "mine"}}]
    _train(write_recipe(recipe))
    assert importlib.import_module("callbacks_a").CountSteps.SEEN == [("mine", 1), ("mine", 2), ("mine", 3)]


def test_early_stopping_stops_early(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out", max_steps=200, eval_strategy="steps", eval_steps=2, save_strategy="steps",
                      save_steps=2, metric_for_best_model="eval_loss", load_best_model_at_end=True)
    # an improvement must exceed 100 nats to count, so none does and patience 2 runs out at the 3rd evaluation
    recipe["callbacks"] = [{"name": "early_stopping", "patience": 2, "threshold": 100.0}]
    result = _train(write_recipe(recipe))
    assert result.summary["steps"] == 6
    assert result.status == "completed"


def test_token_accuracy_and_perplexity_are_computed_per_batch(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out", max_steps=60, eval_strategy="steps", eval_steps=30, eval_on_start=True,
                      per_device_train_batch_size=16)
    recipe["metrics"] = ["token_accuracy", "perplexity"]
    summary = _train(write_recipe(recipe)).summary
    first, final = summary["first_eval"], summary["final_eval"]  # before any training step, and at the end
    assert final["eval_token_accuracy"] > first["eval_token_accuracy"] + 0.2
    assert final["eval_perplexity"] < first["eval_perplexity"] / 4


@pytest.mark.parametrize("reference, code, words", [
    ("no_such_module:fn", None, "no module `no_such_module`"),
    ("losses_b:sumed", "def summed(outputs, labels, num_items_in_batch):\n    return 0\n", "Did you mean 'summed'"),
    ("losses_c:bad", "def bad(outputs):\n    return 0\n", "documented signature"),
])
def test_unusable_loss_exits_2_naming_the_key(write_recipe, tmp_path, reference, code, words):
    if code:
        (tmp_path / f"{reference.split(':')[0]}.py").write_text(code)
    recipe = tiny_sft(tmp_path / "out")
    recipe["loss"] = reference
    path = write_recipe(recipe)
    result = run_ft("train", str(path))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("loss:"))
    assert result.returncode == 2
    assert f"{path}:{line}: loss:" in result.stderr and words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was loaded or written


def test_a_callback_that_is_not_a_trainer_callback(write_recipe, tmp_path):
    _module(tmp_path, "callbacks_b", "class Plain:\n    pass\n")
    recipe = tiny_sft(tmp_path / "out")
    recipe["callbacks"] = [{"cls": "callbacks_b:Plain"}]
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 2 and "callbacks.0.cls" in result.stderr and "TrainerCallback" in result.stderr


def test_recipe_rules_for_hooks(write_recipe, tmp_path):
    from ft.recipe import RecipeError

    recipe = tiny_sft(tmp_path / "out")
    recipe["callbacks"] = [{"name": "early_stopping"}]
    recipe["data"]["eval"] = []
    recipe["metrics"] = ["token_accuracy"]
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(recipe))
    paths = {p.path for p in info.value.problems}
    assert {"callbacks.0", "metrics"} <= paths
