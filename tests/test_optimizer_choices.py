"""Optimizer and scheduler choices beyond transformers' names, trained for real: a class of your own (optimizer
and scheduler), per-module parameter groups, and the learning rate each schedule gives at chosen steps."""

from __future__ import annotations

import math

import pytest
from conftest import run_ft, tiny_sft

from ft.recipe import load_recipe
from ft.run.train import train

BASE_LR = 3e-3


class Watch:
    """A TrainerCallback (built lazily: transformers imports slowly) recording, after each optimizer step, the
    learning rate of every parameter group, and the optimizer and scheduler the Trainer built."""

    def __new__(cls):
        from transformers import TrainerCallback

        class _Watch(TrainerCallback):
            def __init__(self):
                self.lrs, self.optimizer, self.scheduler, self.groups = [], None, None, []

            def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, model=None, **kwargs):
                self.optimizer, self.scheduler = optimizer, lr_scheduler
                names = {id(p): n for n, p in model.named_parameters()}
                self.groups = [{names[id(p)] for p in group["params"]} for group in optimizer.param_groups]

            def on_step_end(self, args, state, control, optimizer=None, **kwargs):
                self.lrs.append([group["lr"] for group in optimizer.param_groups])

        return _Watch()


def _train(write_recipe, tmp_path, optimizer=None, scheduler=None, **train_args):
    recipe = tiny_sft(tmp_path / "out", **{"max_steps": 10, **train_args})
    recipe["data"]["eval"] = recipe["data"]["eval"] if train_args.get("eval_strategy") else []
    recipe["optimizer"] = {"lr": BASE_LR, **(optimizer or {})}
    if scheduler is not None:
        recipe["scheduler"] = scheduler
    watch = Watch()
    result = train(load_recipe(write_recipe(recipe)), resume="never", say=lambda _: None, callbacks=[watch])
    return result, watch


# --- your own optimizer class ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_optimizer_class_of_your_own_trains_with_its_kwargs_and_the_recipes_lr(write_recipe, tmp_path):
    import torch

    result, watch = _train(write_recipe, tmp_path, optimizer={"class": "torch.optim.SGD",
                                                               "kwargs": {"momentum": 0.9, "nesterov": True}},
                           scheduler={"type": "constant"}, max_steps=6, logging_steps=1)
    inner = getattr(watch.optimizer, "optimizer", watch.optimizer)  # accelerate wraps it
    assert type(inner) is torch.optim.SGD
    group = watch.optimizer.param_groups[0]
    assert group["momentum"] == 0.9 and group["nesterov"] is True
    assert watch.lrs[0] == [BASE_LR] * len(watch.lrs[0])  # optimizer.lr, filled in as the class's lr
    assert result.summary["last_train_loss"] < result.summary["first_train_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, key, words", [
    ({"class": "torch.optim.Nope"}, "optimizer.class", "has no `Nope`"),
    ({"class": "collections.OrderedDict"}, "optimizer.class", "not a torch.optim.optimizer.Optimizer subclass"),
    ({"class": "torch.optim.SGD", "kwargs": {"momentm": 0.9}}, "optimizer.kwargs.momentm", "Did you mean 'momentum'"),
    ({"class": "torch.optim.SGD", "betas": [0.9, 0.99]}, "optimizer.betas", "optimizer.kwargs"),
    ({"name": "sgd", "class": "torch.optim.SGD"}, "optimizer.class", "not both"),
    ({"groups": [{"match": "no_such_layer"}]}, "optimizer.groups.0.match", "matches no trainable parameter"),
    ({"groups": [{"match": "(unclosed"}]}, "optimizer.groups.0.match", "not a valid regular expression"),
])
def test_an_unusable_choice_exits_2_naming_the_key(write_recipe, tmp_path, optimizer, key, words):
    recipe = tiny_sft(tmp_path / "out")
    recipe["optimizer"] = optimizer
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 2, result.stderr[-2000:]
    assert key in result.stderr and words in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "final").exists()


def test_a_scheduler_class_needs_no_type_or_warmup(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    recipe["scheduler"] = {"class": "torch.optim.lr_scheduler.OneCycleLR", "warmup_steps": 5,
                           "kwargs": {"max_lr": 0.01}}
    result = run_ft("validate", str(write_recipe(recipe)))
    assert result.returncode == 2 and "scheduler.warmup_steps" in result.stderr


# --- per-module groups ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_parameter_group_gets_its_scaled_learning_rate_and_its_own_decay(write_recipe, tmp_path):
    _, watch = _train(write_recipe, tmp_path, optimizer={"weight_decay": 0.1, "groups": [
        {"match": r"embed_tokens", "lr_scale": 10, "weight_decay": 0.0}]}, scheduler={"type": "constant"},
        max_steps=3)
    groups = watch.optimizer.param_groups
    (embedding,) = [i for i, names in enumerate(watch.groups) if any("embed_tokens" in n for n in names)]
    assert watch.groups[embedding] == {"model.embed_tokens.weight"}
    assert groups[embedding]["lr"] == pytest.approx(10 * BASE_LR) and groups[embedding]["weight_decay"] == 0.0
    others = [g for i, g in enumerate(groups) if i != embedding]
    assert all(g["lr"] == pytest.approx(BASE_LR) for g in others)
    assert sorted(g["weight_decay"] for g in others) == [0.0, 0.1]  # the usual split: norms undecayed
    assert all(step[embedding] == pytest.approx(10 * BASE_LR) for step in watch.lrs)  # through training


# --- schedules at chosen steps -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cosine_with_warmup_follows_its_formula(write_recipe, tmp_path):
    total, warmup = 10, 4
    _, watch = _train(write_recipe, tmp_path, scheduler={"type": "cosine", "warmup_steps": warmup}, max_steps=total)

    def cosine(step: int) -> float:  # after `step` optimizer steps
        if step < warmup:
            return BASE_LR * step / warmup
        return BASE_LR * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    for step in (1, 3, 4, 6, 9, 10):
        assert watch.lrs[step - 1][0] == pytest.approx(cosine(step), abs=1e-12), step


@pytest.mark.slow
def test_a_scheduler_class_of_your_own_gets_the_total_steps_and_follows_its_formula(write_recipe, tmp_path):
    total, peak = 10, 0.01
    _, watch = _train(write_recipe, tmp_path, scheduler={"class": "torch.optim.lr_scheduler.OneCycleLR",
                                                         "kwargs": {"max_lr": peak}}, max_steps=total)
    assert watch.scheduler.total_steps == total  # ft filled it in
    start, end = peak / 25, peak / 25 / 1e4  # OneCycleLR's defaults: div_factor 25, final_div_factor 1e4
    rise = 0.3 * total - 1  # pct_start 0.3: the step at which it peaks

    def one_cycle(step: int) -> float:
        def anneal(a, b, fraction):
            return b + (a - b) / 2 * (math.cos(math.pi * fraction) + 1)

        if step <= rise:
            return anneal(start, peak, step / rise)
        return anneal(peak, end, (step - rise) / (total - 1 - rise))

    for step in (1, 2, 5, 9):
        assert watch.lrs[step - 1][0] == pytest.approx(one_cycle(step), rel=1e-9), step


@pytest.mark.slow
@pytest.mark.parametrize("mode, direction", [("min", 1), ("max", -1)])
def test_greedy_lr_moves_with_the_eval_metric(write_recipe, tmp_path, mode, direction):
    """GreedyLR (patience 0) divides the learning rate by its factor after an evaluation that improved the metric and
    multiplies by it after one that did not. Training lowers eval_loss: in `min` mode each evaluation is an
    improvement and the rate rises; in `max` mode the same falling loss is no improvement and the rate falls."""
    result, watch = _train(write_recipe, tmp_path, scheduler={"type": "greedy", "kwargs": {
        "mode": mode, "patience": 0, "factor": 0.5, "min_lr": 1e-6, "max_lr": 1.0}},
        max_steps=4, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=100)
    lrs = [step[0] for step in watch.lrs]
    # on_step_end runs before the step's evaluation: lrs[k] is the rate after k evaluations
    changes = [later / earlier for earlier, later in zip(lrs, lrs[1:], strict=False)]
    assert changes, lrs
    expected = 2.0 if direction > 0 else 0.5
    # the first evaluation beats the initial `best` (±inf) in either mode; from the second on, the direction tells
    assert all(change == pytest.approx(expected) for change in changes[1:]), lrs
    assert result.summary["eval_loss"] < result.summary["first_eval_loss"]
