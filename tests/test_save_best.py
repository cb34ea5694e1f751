"""Keeping the best checkpoint: with `metric_for_best_model` and `load_best_model_at_end`, final/ holds the weights of
the best evaluation's checkpoint (not the last step's), `save_total_limit` never deletes that checkpoint, and
summary.json names the best step, metric and value.

The best step is made known in advance: `greater_is_better: true` on `eval_loss` of a model trained from random init
(whose loss falls step after step) makes the *first* evaluation, the worst loss, the best one."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_sft
from safetensors.torch import load_file
from transformers import TrainerCallback

from ft.outputs.summary import best_checkpoint
from ft.recipe import load_recipe
from ft.run.train import train

STEPS = 4


class Watch(TrainerCallback):
    """The evaluations during training, and a copy of the weights right after the last optimizer step (before the
    trainer loads the best ones back)."""

    def __init__(self):
        self.evals, self.last_weights, self.training = {}, None, True

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == state.max_steps:
            self.last_weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self.training:  # not ft's evaluation of the final model
            self.evals[state.global_step] = metrics["eval_loss"]

    def on_train_end(self, args, state, control, **kwargs):
        self.training = False


CASES = {
    # a checkpoint only when an evaluation beats the best so far: here only at step 1
    "save_strategy best": {"save_strategy": "best"},
    # a checkpoint every step, at most one kept: transformers keeps the best one (and deletes the last at the end)
    "save_total_limit 1": {"save_strategy": "steps", "save_steps": 1, "save_total_limit": 1},
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_final_holds_the_best_checkpoint_and_the_summary_names_it(write_recipe, tmp_path, case):
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=STEPS, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=64,
                      metric_for_best_model="eval_loss", greater_is_better=True, load_best_model_at_end=True,
                      logging_steps=1, **CASES[case])
    watch = Watch()
    result = train(load_recipe(write_recipe(recipe)), resume="never", say=lambda _: None, callbacks=[watch])

    evals = watch.evals
    assert sorted(evals) == list(range(1, STEPS + 1))
    assert max(evals, key=evals.get) == 1 and evals[STEPS] < evals[1], evals  # the loss fell: step 1 is the best
    best = result.summary["best"]
    assert best == {"step": 1, "metric": "eval_loss", "value": pytest.approx(evals[1]),
                    "checkpoint": str(out / "checkpoint-1"), "loaded_at_end": True}
    assert json.loads((out / "summary.json").read_text())["best"] == best
    assert sorted(path.name for path in out.glob("checkpoint-*")) == ["checkpoint-1"]

    final = load_file(out / "final" / "model.safetensors")
    kept = load_file(out / "checkpoint-1" / "model.safetensors")
    assert final.keys() == kept.keys()
    assert all(torch.equal(final[name], kept[name]) for name in final)
    last = {name: watch.last_weights[name] for name in final}
    assert any(not torch.equal(final[name], last[name]) for name in final)
    # evaluated after training, the model in final/ scores the best value, not the last step's
    assert result.summary["final_eval"]["eval_loss"] == pytest.approx(evals[1], rel=1e-5)

def test_the_summary_names_a_checkpoint_only_when_one_was_saved_at_the_best_step(tmp_path):
    """transformers keeps `best_model_checkpoint` naming an earlier best when the best step saved no checkpoint
    (save_steps 2, eval_steps 1); the summary then names the step and value but no checkpoint. A run that tracks no
    metric has no best."""
    from transformers import TrainerState, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, metric_for_best_model="loss", report_to="none")
    untracked = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert best_checkpoint(TrainerState(), args) is None
    assert best_checkpoint(TrainerState(best_global_step=3, best_metric=0.5), untracked) is None
    stale = TrainerState(best_global_step=3, best_metric=0.5, best_model_checkpoint=str(tmp_path / "checkpoint-2"))
    assert best_checkpoint(stale, args) == {"step": 3, "metric": "eval_loss", "value": 0.5, "checkpoint": None,
                                            "loaded_at_end": False}
