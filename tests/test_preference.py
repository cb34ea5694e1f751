"""Preference methods on real TRL (CPU): DPO learns from the SFT model, the reference model is the one the
recipe implies (frozen copy, explicit directory, or the base under a LoRA adapter), KTO and ORPO run end to
end on the shipped pairs, and the method settings live in their own section."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import ASSETS, DATA, run_ft
from safetensors.torch import load_file

import ft.run.train
from ft.model.loading import ModelLoadError
from ft.recipe import load_recipe
from ft.trainers.kto import unpaired


def preference_recipe(method: str, model: Path, output_dir: Path, *, init: str = "pretrained",
                      train_fraction: float = 1.0, eval_fraction: float = 0.2, **train) -> dict:
    """A small preference recipe on the shipped arithmetic pairs (absolute paths)."""
    return {
        "method": method,
        "model": {"name": str(model), "init": init},
        "data": {
            "train": [{"path": str(DATA / "preference.jsonl"), "format": "preference", "fraction": train_fraction}],
            "eval": [{"path": str(DATA / "preference-eval.jsonl"), "format": "preference",
                      "fraction": eval_fraction}],
            "max_length": 64,
        },
        "optimizer": {"lr": 1.0e-3},
        "train": {"output_dir": str(output_dir), "max_steps": 3, "per_device_train_batch_size": 8,
                  "per_device_eval_batch_size": 20, "logging_steps": 1, "save_strategy": "no",
                  "report_to": "none", "seed": 0, **train},
    }


@pytest.fixture
def train_keeping_trainer(monkeypatch):
    """``ft.run.train.train`` as ``ft train`` runs it, also returning the trainer it built (a pass-through wrapper
    around the real ``build_trainer``)."""

    def run(path: Path):
        built = []
        real = ft.run.train.build_trainer

        def keep(*args, **kwargs):
            built.append(real(*args, **kwargs))
            return built[-1]

        monkeypatch.setattr(ft.run.train, "build_trainer", keep)
        result = ft.run.train.train(load_recipe(path), resume="never", say=lambda _: None)
        return result, built[0]

    return run


def _logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def _same_weights(module, reference: dict[str, torch.Tensor]) -> bool:
    state = module.state_dict()
    return all(torch.equal(state[name], tensor) for name, tensor in reference.items())


@pytest.mark.slow
def test_dpo_raises_the_reward_margin_against_a_frozen_copy(sft_model, write_recipe, tmp_path, train_keeping_trainer):
    # 64 pairs, 4 batches of 16, 8 epochs, one log line per epoch: the reward margin (chosen minus rejected
    # implicit reward, averaged over the epoch) must climb. (The held-out margin does not move in so short a run.)
    recipe = preference_recipe("dpo", sft_model, tmp_path / "out", train_fraction=0.064, max_steps=32,
                               per_device_train_batch_size=16, logging_steps=4)
    recipe["dpo"] = {"beta": 0.1}
    result, trainer = train_keeping_trainer(write_recipe(recipe))

    margins = _logged(trainer, "rewards/margins")
    assert len(margins) == 8
    first, last = sum(margins[:2]) / 2, sum(margins[-2:]) / 2
    assert last > first + 0.01, margins
    assert _logged(trainer, "rewards/accuracies")[-1] > 0.6

    # implicit reference: a distinct, frozen module holding the starting weights, untouched by training
    start = load_file(sft_model / "model.safetensors")
    ref = trainer.ref_model
    assert ref is not None and ref is not trainer.model
    assert not any(p.requires_grad for p in ref.parameters()) and not ref.training
    assert _same_weights(ref, start)
    assert not _same_weights(trainer.model, start)  # the policy did move
    assert result.summary["status"] == "completed" and math.isfinite(result.summary["last_train_loss"])


def test_explicit_ref_model_is_loaded_and_used(sft_model, write_recipe, tmp_path, train_keeping_trainer):
    # policy: a random-init model; reference: the SFT model, named by directory
    recipe = preference_recipe("dpo", ASSETS, tmp_path / "out", init="random", max_steps=1,
                               eval_strategy="steps", eval_steps=1, eval_on_start=True)
    recipe["dpo"] = {"ref_model": str(sft_model)}
    _, trainer = train_keeping_trainer(write_recipe(recipe))

    assert _same_weights(trainer.ref_model, load_file(sft_model / "model.safetensors"))
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())
    # before any step the rewards are beta * (policy - reference) log-probs: far below 0 for a random policy
    # scored against the trained reference (with a copy of the policy they would be exactly 0)
    before = next(entry for entry in trainer.state.log_history if "eval_rewards/chosen" in entry)
    assert before["step"] == 0 and before["eval_rewards/chosen"] < -0.5


def test_missing_ref_model_is_a_model_load_error(write_recipe, tmp_path):
    recipe = preference_recipe("dpo", ASSETS, tmp_path / "out", init="random", train_fraction=0.05)
    recipe["dpo"] = {"ref_model": str(tmp_path / "no-such-model")}
    with pytest.raises(ModelLoadError, match=r"^dpo\.ref_model: could not load"):  # `ft train` exits 2 on it
        ft.run.train.train(load_recipe(write_recipe(recipe)), resume="never", say=lambda _: None)


@pytest.mark.slow
def test_lora_dpo_uses_the_base_as_reference_and_beta_reaches_the_trainer(write_recipe, tmp_path,
                                                                          train_keeping_trainer):
    from peft import PeftModel

    recipe = preference_recipe("dpo", ASSETS, tmp_path / "out", init="random", max_steps=2,
                               eval_strategy="no")
    recipe["adapter"] = {"kind": "lora", "r": 4, "alpha": 8}
    recipe["dpo"] = {"beta": 0.3}
    result, trainer = train_keeping_trainer(write_recipe(recipe))

    assert trainer.args.beta == 0.3 and trainer.beta == 0.3
    assert trainer.ref_model is None  # TRL disables the adapter to score the reference
    assert isinstance(trainer.model, PeftModel)
    assert math.isfinite(result.summary["last_train_loss"])


def test_beta_under_train_points_at_the_dpo_section(write_recipe, tmp_path):
    recipe = preference_recipe("dpo", ASSETS, tmp_path / "out", init="random", beta=0.3)
    result = run_ft("validate", str(write_recipe(recipe)))
    assert result.returncode == 2
    assert "train.beta" in result.stderr and "dpo.beta" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("method", ["kto", "orpo"])
def test_kto_and_orpo_train_end_to_end(method, write_recipe, tmp_path):
    out = tmp_path / "out"
    recipe = preference_recipe(method, ASSETS, out, init="random", train_fraction=0.2)  # evaluated once, at the end
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3
    for key in ("first_train_loss", "last_train_loss", "eval_loss"):
        assert math.isfinite(summary[key]), (key, summary[key])


def _watch():
    """A TrainerCallback keeping the trainer's arguments as training starts and its log history as it ends."""
    from transformers import TrainerCallback

    class Watch(TrainerCallback):
        args = None
        log_history: list = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.args = args

        def on_train_end(self, args, state, control, **kwargs):
            self.log_history = list(state.log_history)

    return Watch()


def _train_watched(path: Path):
    watch = _watch()
    result = ft.run.train.train(load_recipe(path), resume="never", say=lambda _: None, callbacks=[watch])
    return result, watch


def _non_default(config_class, settings: dict) -> bool:
    """None of ``settings`` is the TRL config's default (so a section that did not arrive cannot pass for one)."""
    import dataclasses

    defaults = {field.name: field.default for field in dataclasses.fields(config_class)}
    return all(defaults[key] != value for key, value in settings.items())


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_kto_settings_reach_the_trainer_and_the_reward_margin_rises(sft_model, write_recipe, tmp_path):
    # 64 pairs unpaired into 128 rows: 8 batches of 16 an epoch, in the same order every epoch (KTO's sequential
    # sampler), 4 epochs, one log line per epoch, so the margins compare the same rows
    recipe = preference_recipe("kto", sft_model, tmp_path / "out", train_fraction=0.064, max_steps=32,
                               per_device_train_batch_size=16, logging_steps=8, eval_strategy="no")
    recipe["data"]["eval"] = []
    recipe["optimizer"]["lr"] = 3.0e-3
    settings = {"beta": 0.3, "desirable_weight": 1.5, "undesirable_weight": 0.75}
    recipe["kto"] = settings
    result, watch = _train_watched(write_recipe(recipe))

    from trl import KTOConfig

    assert _non_default(KTOConfig, settings)
    assert {key: getattr(watch.args, key) for key in settings} == settings
    # chosen minus rejected implicit reward (KTO's batches mix both labels): -0.07 in the first epoch, +0.06 in the 4th
    margins = [entry["rewards/margins"] for entry in watch.log_history if "rewards/margins" in entry]
    assert len(margins) == 4
    assert margins[-1] > margins[0] + 0.05, margins
    assert result.summary["status"] == "completed"


def test_orpo_beta_reaches_the_trainer_and_the_log_odds_ratio_rises(sft_model, write_recipe, tmp_path):
    # 64 pairs: 4 batches of 16 an epoch, 8 epochs, one log line per epoch
    recipe = preference_recipe("orpo", sft_model, tmp_path / "out", train_fraction=0.064, max_steps=32,
                               per_device_train_batch_size=16, logging_steps=4, eval_strategy="no")
    recipe["data"]["eval"] = []
    recipe["optimizer"]["lr"] = 3.0e-3
    recipe["orpo"] = {"beta": 1.0}  # the weight of the odds-ratio term, the signal watched here, against the NLL's
    result, watch = _train_watched(write_recipe(recipe))

    from trl.experimental.orpo import ORPOConfig

    assert _non_default(ORPOConfig, {"beta": 1.0}) and watch.args.beta == 1.0
    # mean log-odds of chosen over rejected (0.07 → 0.26 here) and its log-sigmoid, the term ORPO maximises
    # (-0.68 → -0.60), first two epochs against the last two
    chosen = [entry["log_odds_chosen"] for entry in watch.log_history if "log_odds_chosen" in entry]
    ratio = [entry["log_odds_ratio"] for entry in watch.log_history if "log_odds_ratio" in entry]
    assert len(chosen) == len(ratio) == 8
    assert _mean(chosen[-2:]) > _mean(chosen[:2]) + 0.1, chosen
    assert _mean(ratio[-2:]) > _mean(ratio[:2]) + 0.03, ratio
    assert result.summary["status"] == "completed"


def test_kto_unpairs_the_pairs_into_mixed_batches():
    from datasets import load_dataset

    pairs = load_dataset("json", data_files=str(DATA / "preference.jsonl"), split="train")
    rows = unpaired(pairs, seed=0)
    assert len(rows) == 2 * len(pairs) and {"prompt", "completion", "label"} <= set(rows.column_names)
    assert sum(rows["label"][:]) == len(pairs)
    first_batch = rows["label"][:16]  # TRL alone would give 1,000 desirable rows first
    assert 0 < sum(first_batch) < 16
