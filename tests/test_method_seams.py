"""What a method's section declares for the rest of ft to read, instead of its field names: the models it loads
besides the policy (``MethodSection.models``: a reference, reward models; the Hub check is in test_hub_reads.py, a
teacher registered from outside ft in test_layout.py) and how it samples completions (``MethodSection.generation``);
and the TRL keywords the builders take from its ``CONFIG_FIELDS`` (``trainers.build.section_kwargs``)."""

from __future__ import annotations

import pytest
from conftest import ASSETS, DATA, tiny_sft

from ft.recipe import load_recipe
from ft.recipe.methods import METHODS, ExtraModel, RewardSpec
from ft.trainers.build import section_kwargs

SECTIONED = [name for name, method in METHODS.items() if method.section is not None]


def _section(name: str, **values):
    """A valid section of method ``name`` (a generating one needs its rewards)."""
    section = METHODS[name].section
    if section.GENERATES and "rewards" not in values:
        values["rewards"] = [RewardSpec(name="exact_match")]
    return section(**values)


@pytest.mark.parametrize("name", METHODS)
def test_a_method_generates_exactly_when_its_section_declares_a_generation(name):
    method = METHODS[name]
    declared = method.section is not None and _section(name).generation(name) is not None
    assert method.generates == declared


def test_a_generation_carries_the_sections_figures_and_rewards_under_its_keys():
    rewards = [RewardSpec(name="exact_match"), RewardSpec(model="org/rm")]
    generation = _section("grpo", num_generations=4, max_completion_length=12, steps_per_generation=2,
                          rewards=rewards).generation("grpo")
    assert (generation.num_generations, generation.max_completion_length, generation.steps_per_generation,
            generation.generation_batch_size) == (4, 12, 2, None)
    assert generation.rewards == tuple(rewards)
    assert generation.key("num_generations") == "grpo.num_generations"


def test_the_models_a_section_declares_carry_their_key_role_and_dtype():
    assert _section("dpo").models("dpo") == ()  # a copy of the start model: no model of its own
    assert _section("dpo", ref_model="org/ref").models("dpo") == (ExtraModel("dpo.ref_model", "org/ref", "reference"),)
    rewards = [RewardSpec(model="org/rm", dtype="bfloat16"), RewardSpec(name="exact_match"), RewardSpec(model="rm2")]
    declared = _section("rloo", rewards=rewards).models("rloo")
    assert declared == (ExtraModel("rloo.rewards.0.model", "org/rm", "reward", "bfloat16"),
                        ExtraModel("rloo.rewards.2.model", "rm2", "reward"))
    assert all(m.scores and m.auto_class == "AutoModelForSequenceClassification" for m in declared)
    reference = _section("dpo", ref_model="org/ref").models("dpo")[0]
    assert not reference.scores and reference.auto_class == "AutoModelForCausalLM"
    assert {_section(name).models(name) for name in SECTIONED if name != "dpo"} == {()}  # without reward models


@pytest.mark.parametrize("name", SECTIONED)
def test_section_kwargs_are_the_sections_config_fields_in_trl_names(name):
    section = _section(name)
    kwargs = section_kwargs(section)
    assert set(kwargs) == set(section.CONFIG_FIELDS.values())
    for field, trl in section.CONFIG_FIELDS.items():
        value = getattr(section, field)
        assert kwargs[trl] == value
        if isinstance(value, list):  # TRL may normalise it in place: the recipe's stays as written
            assert kwargs[trl] is not value
    assert section_kwargs(None) == {}


def _recipe(write_recipe, tmp_path, method: str, section: dict, adapter: dict | None = None):
    recipe = tiny_sft(tmp_path / "out")
    data = ("prompts.jsonl", "prompt") if METHODS[method].generates else ("preference.jsonl", "preference")
    recipe.update(method=method, data={"train": [{"path": str(DATA / data[0]), "format": data[1]}], "max_length": 64})
    recipe[method] = section
    if adapter is not None:
        recipe["adapter"] = adapter
    return load_recipe(write_recipe(recipe))


def test_the_smoke_run_stands_in_for_each_declared_model_under_its_key(write_recipe, tmp_path):
    """A reference is the tiny model too; a reward model is a tiny sequence classifier under its own key; the
    completion length is shortened where the generation says it is set."""
    from transformers import AutoConfig

    from ft.smoke import rehearse

    loaded = _recipe(write_recipe, tmp_path, "dpo", {"ref_model": str(ASSETS)})
    subs = {s.key: s for s in rehearse.prepare(loaded, say=lambda _: None).substitutions}
    inputs = tmp_path / "out-smoke" / "inputs"
    assert (subs["dpo.ref_model"].was, subs["dpo.ref_model"].now) == (str(ASSETS), str(inputs / "model"))
    assert subs["dpo.ref_model"].why == "the reference model is the tiny model too"

    loaded = _recipe(write_recipe, tmp_path, "grpo", {"max_completion_length": 64, "rewards": [
        {"name": "exact_match"}, {"model": str(ASSETS), "dtype": "bfloat16"}]})
    smoke = rehearse.prepare(loaded, say=lambda _: None)
    subs = {s.key: s for s in smoke.substitutions}
    scorer = subs["grpo.rewards.1.model"].now
    assert scorer == str(inputs.joinpath("grpo.rewards.1.model", *ASSETS.parts[-2:]))
    config = AutoConfig.from_pretrained(scorer)
    assert config.architectures[0].endswith("ForSequenceClassification") and config.num_labels == 1
    assert (subs["grpo.max_completion_length"].was, subs["grpo.max_completion_length"].now) == (64, 16)
    assert smoke.loaded.recipe.grpo.rewards[1].dtype == "bfloat16"  # the stand-in scores as the real one would


@pytest.mark.parametrize(("section", "adapter", "held"), [
    ({}, None, True),  # full fine-tuning: a frozen copy of the start model
    ({}, {"kind": "lora"}, False),  # the base with the adapter off
    ({"ref_model": str(ASSETS)}, {"kind": "lora"}, True),  # ft loads the declared reference whatever the adapter
])
def test_ft_plan_holds_a_reference_where_the_run_holds_one(write_recipe, tmp_path, section, adapter, held):
    from ft.plan.memory import estimate, setup_for
    from ft.plan.shape import read_shape

    recipe = _recipe(write_recipe, tmp_path, "dpo", section, adapter).recipe
    shape = read_shape(recipe)
    parts = {part.name for part in estimate(shape, setup_for(recipe, shape, "cpu")).parts}
    assert ("reference model (frozen copy)" in parts) == held
