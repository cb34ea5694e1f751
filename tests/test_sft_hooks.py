"""What a recipe plugs into SFT: a custom loss, callbacks (user and early stopping), batch-wise metrics,
and the exit-2 errors for user code that is missing or has the wrong signature."""

from __future__ import annotations

import importlib
import math
import textwrap

import pytest
from conftest import run_ft, tiny_sft

from ft.recipe import load_recipe
from ft.run.train import train


def _module(tmp_path, name: str, code: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))


def _train(path, callbacks=()):
    return train(load_recipe(path), resume="never", say=lambda _: None, callbacks=callbacks)


def _watch():
    """A TrainerCallback that keeps the model's weights as training starts and the log history as it ends."""
    from transformers import TrainerCallback

    class Watch(TrainerCallback):
        start_weights: dict = {}
        log_history: list = []

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.start_weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}

        def on_train_end(self, args, state, control, **kwargs):
            self.log_history = list(state.log_history)

    return Watch()


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_loss_times_zero_leaves_every_weight_as_it_started(write_recipe, tmp_path):
    """What the `loss:` function returns is what is trained: multiplied by zero, it moves no weight."""
    import torch
    from safetensors.torch import load_file

    _module(tmp_path, "losses_zero", """
        def zero(outputs, labels, num_items_in_batch):
            return 0.0 * outputs.logits.float().sum()
    """)
    recipe = tiny_sft(tmp_path / "out", max_steps=3, logging_steps=1)
    recipe["data"]["eval"] = []
    recipe["loss"] = "losses_zero:zero"
    recipe["optimizer"]["weight_decay"] = 0.0  # decay alone would shrink the weights, whatever the loss
    watch = _watch()
    _train(write_recipe(recipe), callbacks=[watch])
    final = load_file(tmp_path / "out" / "final" / "model.safetensors")
    assert final and final.keys() <= watch.start_weights.keys()
    assert all(torch.equal(final[name], watch.start_weights[name]) for name in final)
    logged = [entry for entry in watch.log_history if "loss" in entry]
    assert [entry["loss"] for entry in logged] == [0.0] * 3 and all(entry["grad_norm"] == 0 for entry in logged)


@pytest.mark.slow
def test_the_logged_training_loss_is_what_the_loss_function_returned(write_recipe, tmp_path):
    _module(tmp_path, "losses_half", """
        import torch.nn.functional as F
        RETURNED = []

        def half_ce(outputs, labels, num_items_in_batch):
            logits = outputs.logits[:, :-1, :].float()
            total = F.cross_entropy(logits.transpose(1, 2), labels[:, 1:], ignore_index=-100, reduction="sum")
            loss = 0.5 * total / num_items_in_batch  # half the model's own loss: not a number ft would log by itself
            if loss.requires_grad:  # a training micro-batch (evaluation runs without gradients)
                RETURNED.append(loss.item())
            return loss
    """)
    recipe = tiny_sft(tmp_path / "out", max_steps=4, logging_steps=1, gradient_accumulation_steps=2)
    recipe["data"]["eval"] = []
    recipe["loss"] = "losses_half:half_ce"
    watch = _watch()
    _train(write_recipe(recipe), callbacks=[watch])
    returned = importlib.import_module("losses_half").RETURNED
    logged = [entry["loss"] for entry in watch.log_history if "loss" in entry]
    assert len(returned) == 2 * len(logged) == 8
    # both micro-batches of a step are normalised by the count over the two, so the step's loss is their sum, as
    # returned (not rescaled for gradient accumulation)
    for step, loss in enumerate(logged):
        assert math.isclose(loss, returned[2 * step] + returned[2 * step + 1], rel_tol=1e-6), (step, loss, returned)


@pytest.mark.slow
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


@pytest.mark.slow
def test_early_stopping_stops_early(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out", max_steps=200, eval_strategy="steps", eval_steps=2, save_strategy="steps",
                      save_steps=2, metric_for_best_model="eval_loss", load_best_model_at_end=True)
    # an improvement must exceed 100 nats to count, so none does and patience 2 runs out at the 3rd evaluation
    recipe["callbacks"] = [{"name": "early_stopping", "patience": 2, "threshold": 100.0}]
    result = _train(write_recipe(recipe))
    assert result.summary["steps"] == 6
    assert result.status == "completed"


@pytest.mark.slow
def test_token_accuracy_and_perplexity_are_computed_per_batch(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out", max_steps=60, eval_strategy="steps", eval_steps=30, eval_on_start=True,
                      per_device_train_batch_size=16)
    recipe["metrics"] = ["token_accuracy", "perplexity"]
    summary = _train(write_recipe(recipe)).summary
    first, final = summary["first_eval"], summary["final_eval"]  # before any training step, and at the end
    assert final["eval_token_accuracy"] > first["eval_token_accuracy"] + 0.2
    assert final["eval_perplexity"] < first["eval_perplexity"] / 4


@pytest.mark.slow
def test_perplexity_is_exp_of_the_eval_loss(write_recipe, tmp_path):
    """perplexity is exp(mean NLL over every target token of the eval set). Trainer's eval_loss is the mean of
    per-batch mean losses: the same number when the eval set is one batch, as here. (With several batches of unequal
    token counts the two part a little: eval_loss 3.2377 against ln(perplexity) 3.2354 with batches of 8 on this
    data; the perplexity, pooled over tokens, does not depend on the batch size.)"""
    recipe = tiny_sft(tmp_path / "out", max_steps=5, eval_strategy="steps", eval_steps=100, eval_on_start=True,
                      per_device_eval_batch_size=200)  # data/arithmetic/eval.jsonl: 200 rows
    recipe["metrics"] = ["perplexity"]
    summary = _train(write_recipe(recipe)).summary
    for evaluation in (summary["first_eval"], summary["final_eval"]):  # untrained (≈ 500), then after 5 steps
        assert math.isclose(evaluation["eval_perplexity"], math.exp(evaluation["eval_loss"]), rel_tol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("reference, code, words", [
    ("no_such_module:fn", None, "no module `no_such_module`"),
    ("losses_b:sumed", "def summed(outputs, labels, num_items_in_batch):\n    return 0\n", "Did you mean 'summed'"),
    ("losses_c:bad", "def bad(outputs):\n    return 0\n", "documented signature"),
    ("os:system", None, "Python's standard library"),  # no loss: refused before it is imported (tests/test_trust.py)
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


@pytest.mark.slow
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
