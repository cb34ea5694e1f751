"""The method table is the one home of a method: its module builds the config the table names, every setting of
its section reaches that config, TRL loads only for the chosen method, and the names the recipe offers match the
registries that implement them."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from conftest import CPU, DATA, ROOT, tiny_sft

from ft.machine.hardware import device_defaults
from ft.recipe import load_recipe
from ft.recipe.methods import METHODS
from ft.recipe.names import BUILTIN_CALLBACKS, BUILTIN_REWARDS, FORMATS, METRICS

DATA_FOR = {"sft": ("train.jsonl", "chat"), "dpo": ("preference.jsonl", "preference"),
            "kto": ("preference.jsonl", "preference"), "orpo": ("preference.jsonl", "preference"),
            "grpo": ("prompts.jsonl", "prompt"), "reward": ("preference.jsonl", "preference"),
            "rloo": ("prompts.jsonl", "prompt")}
REWARDS = [{"name": "numeric_match", "weight": 0.75}, {"name": "format", "weight": 0.25, "args": {"pattern": r"\d+"}}]
# non-default values for every field of every method section; GRPO twice, as its two batch settings exclude each other
SECTIONS = [
    ("dpo", {"beta": 0.37, "loss_type": ["hinge"]}),
    ("kto", {"beta": 0.37, "desirable_weight": 1.5, "undesirable_weight": 0.5}),
    ("orpo", {"beta": 0.37}),
    ("grpo", {"num_generations": 4, "max_completion_length": 12, "steps_per_generation": 2, "temperature": 0.7,
              "top_p": 0.9, "top_k": 5, "beta": 0.05, "loss_type": "bnpo"}),
    ("grpo", {"num_generations": 4, "generation_batch_size": 16}),
    ("rloo", {"num_generations": 4, "max_completion_length": 12, "steps_per_generation": 2, "temperature": 0.7,
              "top_p": 0.9, "top_k": 5, "beta": 0.5}),
    ("rloo", {"num_generations": 4, "generation_batch_size": 16}),
]


def _recipe(write_recipe, tmp_path, method: str, section: dict | None = None):
    recipe = tiny_sft(tmp_path / "out", per_device_train_batch_size=8)
    recipe["method"] = method
    name, fmt = DATA_FOR[method]
    recipe["data"] = {"train": [{"path": str(DATA / name), "format": fmt}], "max_length": 48}
    recipe["train"]["eval_strategy"] = "no"
    if METHODS[method].generates:
        section = {**(section or {}), "rewards": REWARDS}
    if section is not None:
        recipe[method] = section
    return load_recipe(write_recipe(recipe)).recipe


def _config(recipe):
    """The method module's TRL config for ``recipe``, with ft's CPU defaults (TRL's own ask for bf16)."""
    return importlib.import_module(f"ft.trainers.{recipe.method}").config(recipe, device_defaults(recipe, CPU))


def _config_class(method: str):
    module, _, name = METHODS[method].config.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("method", METHODS)
def test_each_method_module_builds_the_config_class_the_table_names(write_recipe, tmp_path, method):
    recipe = _recipe(write_recipe, tmp_path, method)
    config = _config(recipe)
    assert type(config) is _config_class(method)
    assert config.max_steps == 4 and config.learning_rate == pytest.approx(3e-3)  # train: and optimizer: arrive


def test_the_section_cases_cover_every_field_each_section_owns():
    covered = {}
    for method, values in SECTIONS:
        covered.setdefault(method, set()).update(values)
    assert covered == {m: set(spec.section.CONFIG_FIELDS) for m, spec in METHODS.items() if spec.section}


@pytest.mark.parametrize("method, values", SECTIONS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(SECTIONS)])
def test_every_section_setting_reaches_the_trl_config(write_recipe, tmp_path, method, values):
    section = METHODS[method].section
    defaults = section.model_fields
    assert all(value != defaults[key].default for key, value in values.items()), "pick values that differ"
    config = _config(_recipe(write_recipe, tmp_path, method, values))
    for field, value in values.items():
        assert getattr(config, section.CONFIG_FIELDS[field]) == pytest.approx(value), field
    if method == "grpo":
        assert config.reward_weights == [0.75, 0.25]  # grpo.rewards[].weight


@pytest.mark.slow
def test_only_the_chosen_methods_module_imports_trl():
    code = ("import sys, ft.run.train, ft.trainers.build\n"
            "assert not any(m == 'trl' or m.startswith('trl.') for m in sys.modules), 'trl imported early'\n"
            "import ft.trainers.sft\n"
            "others = [m for m in ('dpo', 'kto', 'orpo', 'grpo') if f'ft.trainers.{m}' in sys.modules]\n"
            "assert not others, others\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_recipe_names_match_the_registries_that_implement_them():
    from ft.data.formats import FORMATS as FORMAT_REGISTRY
    from ft.trainers.callbacks import BUILTIN
    from ft.trainers.metrics import METRICS as METRIC_REGISTRY
    from ft.trainers.rewards import BUILTINS

    assert set(FORMATS) == set(FORMAT_REGISTRY)
    assert set(METRICS) == set(METRIC_REGISTRY)
    assert set(BUILTIN_CALLBACKS) == set(BUILTIN)
    assert set(BUILTIN_REWARDS) == set(BUILTINS)
    assert set().union(*(m.formats for m in METHODS.values())) == set(FORMATS)  # every format trains something
