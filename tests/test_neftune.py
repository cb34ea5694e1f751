"""NEFTune (``train.neftune_noise_alpha``) in SFT, with and without a LoRA adapter, on real transformers/TRL (CPU).

transformers' Trainer implements it: ``train()`` registers ``neftune_post_forward_hook`` on the input embeddings,
which adds uniform noise in [-mag, mag], mag = alpha / sqrt(L * d) (L: the batch's padded length, d: the hidden
size), while the module is in training mode, and removes the hook when training ends. A probe callback records
every call of the embedding module during training (its hook runs after NEFTune's, so it sees the noisy output)
next to the plain lookup ``embedding.weight[input_ids]``. One run per variant serves the tests of that variant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_sft
from transformers import TrainerCallback

from ft.recipe import load_recipe
from ft.run.train import train

ALPHA = 5.0
# dropout 0 (ft's default is 0.05): the model is compared in training mode, which must be deterministic
LORA = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
STEPS = 4


@dataclass
class Call:
    training: bool
    alpha: float | None  # the module's neftune_noise_alpha while a NEFTune hook is on it, else None
    input_ids: torch.Tensor
    output: torch.Tensor  # what the embedding module returned, after every hook before the probe's
    lookup: torch.Tensor  # embedding.weight[input_ids] at the same moment


class EmbeddingProbe(TrainerCallback):
    """Records each call of the model's input embeddings between ``on_train_begin`` and ``on_train_end`` and keeps
    the model it was given (for a PEFT model: the PeftModel; ``get_input_embeddings`` reaches the base's)."""

    def __init__(self):
        self.calls: list[Call] = []
        self.model = None
        self._handle = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.model = model
        self._handle = model.get_input_embeddings().register_forward_hook(self._record)

    def on_train_end(self, args, state, control, **kwargs):
        self._handle.remove()

    def _record(self, module, inputs, output):
        ids = inputs[0]
        alpha = getattr(module, "neftune_noise_alpha", None) if _neftune_hooks(module) else None
        self.calls.append(Call(module.training, alpha, ids.detach().clone(), output.detach().clone(),
                               module.weight[ids].detach().clone()))

    def train_calls(self) -> list[Call]:
        return [call for call in self.calls if call.training]

    def eval_calls(self) -> list[Call]:
        return [call for call in self.calls if not call.training]


@dataclass
class Run:
    probe: EmbeddingProbe
    output_dir: Path
    recipe_path: Path


def _run(root: Path, adapter: dict | None, **train_args) -> Run:
    out = root / "out"
    recipe = tiny_sft(out, max_steps=STEPS, logging_steps=1, eval_strategy="steps", eval_steps=2,
                      per_device_eval_batch_size=8, seed=0, **train_args)
    recipe["data"]["eval"][0]["fraction"] = 0.1  # 20 rows: 3 batches per evaluation
    if adapter is not None:
        recipe["adapter"] = adapter
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    probe = EmbeddingProbe()
    result = train(load_recipe(path), resume="never", say=lambda _: None, callbacks=[probe])
    assert result.status == "completed"
    return Run(probe, result.output_dir, path)


@pytest.fixture(scope="module", params=["full", "lora"])
def neftune_run(request, tmp_path_factory) -> Run:
    """One SFT run with ``neftune_noise_alpha: 5`` per variant (full model; LoRA on q_proj/v_proj)."""
    adapter = LORA if request.param == "lora" else None
    return _run(tmp_path_factory.mktemp(f"neftune-{request.param}"), adapter, neftune_noise_alpha=ALPHA)


def _neftune_hooks(embedding) -> list:
    """transformers' NEFTune hooks on ``embedding`` (``transformers.integrations.neftune``)."""
    return [hook for hook in embedding._forward_hooks.values()
            if getattr(hook, "__name__", None) == "neftune_post_forward_hook"]


# --- during training ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_training_embeddings_carry_uniform_noise_of_alpha_over_sqrt_length_times_dim(neftune_run):
    calls = neftune_run.probe.train_calls()
    assert len(calls) == STEPS  # one forward per optimizer step (batch 8, no accumulation)
    for call in calls:
        assert call.alpha == ALPHA  # the recipe's value reached the hook on the embedding module
        batch, length, dim = call.output.shape
        assert dim == 64 and batch == 8
        mag = ALPHA / math.sqrt(length * dim)
        noise = (call.output - call.lookup).abs()
        # uniform in [-mag, mag] at every position (padding included): bounded by mag, reaching close to it,
        # with mean |noise| = mag / 2; nowhere zero
        assert noise.max().item() <= mag * (1 + 1e-5)
        assert noise.max().item() >= 0.99 * mag
        assert noise.mean().item() == pytest.approx(mag / 2, rel=0.05)
        assert (noise > 0).float().mean().item() > 0.999


@pytest.mark.slow
def test_embeddings_are_exact_lookups_in_eval_mode_during_training(neftune_run):
    """The evaluations at steps 2 and 4 run inside train(), hook attached, with the model in eval mode."""
    calls = neftune_run.probe.eval_calls()
    assert len(calls) == 2 * 3  # two evaluations × 3 batches of the 20 eval rows
    for call in calls:
        assert call.alpha == ALPHA  # the hook is there, and adds nothing in eval mode
        assert torch.equal(call.output, call.lookup)


# --- after training -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_hook_is_removed_when_training_ends(neftune_run):
    """The in-memory model that ``ft train`` trained (and saved) carries no NEFTune hook: in training mode its
    embeddings are exact lookups again."""
    assert all(call.alpha == ALPHA for call in neftune_run.probe.calls)  # it was there during training
    model = neftune_run.probe.model
    embedding = model.get_input_embeddings()
    assert _neftune_hooks(embedding) == []
    assert not hasattr(embedding, "neftune_noise_alpha")
    ids = neftune_run.probe.train_calls()[0].input_ids
    model.train()
    with torch.no_grad():
        assert torch.equal(embedding(ids), embedding.weight[ids])


@pytest.mark.slow
def test_trained_model_in_training_mode_matches_the_saved_one(neftune_run):
    """Logits of the trained model, in training mode (the config has no dropout), equal those of a fresh load of
    ``final/``, which has no hook. The LoRA run saves only the adapter, and ``model.init: random`` leaves no base
    weights on disk: the base is rebuilt as ``ft`` built it (same config, same seed) and the adapter loaded on it."""
    from transformers import AutoModelForCausalLM

    assert all(call.alpha == ALPHA for call in neftune_run.probe.calls)  # the hook was there during training
    final = neftune_run.output_dir / "final"
    trained = neftune_run.probe.model
    if (final / "adapter_config.json").exists():
        from peft import PeftModel

        from ft.model.loading import load_model

        recipe = load_recipe(neftune_run.recipe_path).recipe
        fresh = PeftModel.from_pretrained(load_model(recipe, seed=recipe.train_args["seed"]), final)
    else:
        fresh = AutoModelForCausalLM.from_pretrained(final)
    ids = neftune_run.probe.train_calls()[0].input_ids
    trained.train()
    fresh.train()
    with torch.no_grad():
        logits, fresh_logits = trained(input_ids=ids).logits, fresh(input_ids=ids).logits
    torch.testing.assert_close(logits, fresh_logits, rtol=0, atol=1e-5)


# --- the control: the probe sees no noise without the key -----------------------------------------------------


@pytest.mark.slow
def test_without_neftune_training_embeddings_are_exact_lookups(tmp_path):
    """Without ``neftune_noise_alpha`` the probe sees the plain lookup in training mode too: the noise measured
    above is NEFTune's, not the probe's or the trainer's doing."""
    probe = _run(tmp_path, None).probe
    assert len(probe.train_calls()) == STEPS
    assert all(call.alpha is None and torch.equal(call.output, call.lookup) for call in probe.train_calls())
    assert _neftune_hooks(probe.model.get_input_embeddings()) == []
