"""A recipe whose ``model.name`` is a run: a LoRA run's adapter folded into its base as it loads (``ft merge``'s fold,
in memory), with the recipe's own class, so that a reward model or another method starts from an SFT run without a
merge step; ``ft merge``, ``ft plan``, the GRPO reference and the smoke test follow it. Real transformers and PEFT on
the tiny shared runs (conftest: ``lora_run``, a LoRA on a full fine-tune, and ``lora_merged``, that run merged)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from conftest import DATA, run_ft, tiny_sft
from test_grpo import tiny_grpo

from ft.model.loading import ModelLoadError, load_model
from ft.model.locate import load_adapter_model, load_start, locate
from ft.recipe import load_recipe

PAIRS = {"train": [{"path": str(DATA / "preference.jsonl"), "format": "preference"}],
         "eval": [{"path": str(DATA / "preference-eval.jsonl"), "format": "preference"}], "max_length": 64}
LORA = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}


def _recipe(folder: Path, method: str, model: str, **more) -> dict:
    recipe = tiny_sft(folder / "run", max_steps=2)
    recipe.update(method=method, model={"name": model, "init": "pretrained"}, **more)
    if method == "reward":
        recipe["data"] = PAIRS
    return recipe


def _loaded(folder: Path, recipe: dict):
    path = folder / f"{recipe['method']}-{len(list(folder.glob('*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return load_recipe(path).recipe


@pytest.mark.parametrize("method", ["sft", "reward"])
def test_a_lora_run_loads_as_its_merged_model_with_the_recipes_own_class(lora_run, lora_merged, tmp_path, method):
    """Every tensor (a reward model's new score head too, drawn with the seed) is what loading ``ft merge``'s output
    gives: the run directory names the same model as the merged folder."""
    from_run = load_start(_loaded(tmp_path, _recipe(tmp_path, method, str(lora_run))), seed=3)
    from_merge = load_model(_loaded(tmp_path, _recipe(tmp_path, method, str(lora_merged))), seed=3)
    assert type(from_run) is type(from_merge)
    assert type(from_run).__name__.endswith("ForSequenceClassification" if method == "reward" else "ForCausalLM")
    ours, theirs = from_run.state_dict(), from_merge.state_dict()
    assert ours.keys() == theirs.keys()
    assert [name for name in ours if not torch.equal(ours[name], theirs[name])] == []


def test_a_reward_run_started_from_a_lora_run_trains_plans_and_merges_on_the_folded_base(lora_run, lora_merged,
                                                                                         tmp_path):
    recipe = _recipe(tmp_path, "reward", str(lora_run), adapter=LORA)
    path = tmp_path / "reward.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    trained = run_ft("train", str(path))
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "its adapter" in trained.stderr and "folded into its base" in trained.stderr
    run = Path(recipe["train"]["output_dir"])
    assert json.loads((run / "summary.json").read_text())["base_model"]["name"] == str(lora_run)

    # what ft merge, ft generate and a learned reward rebuild as the reward adapter's base: the SFT run, folded
    model, _ = load_adapter_model(locate(run, "RUN"), None, "RUN", say=lambda _: None)
    rebuilt = model.get_base_model().state_dict()
    merged_sft = load_model(_loaded(tmp_path, _recipe(tmp_path, "sft", str(lora_merged))), seed=0).state_dict()
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(rebuilt[weight.replace(".weight", ".base_layer.weight")], merged_sft[weight])

    merged = run_ft("merge", str(run), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["architectures"] == [
        "LlamaForSequenceClassification"]
    planned = run_ft("plan", str(path))
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "hidden 64" in planned.stdout  # the base's config, read through the run

    with pytest.raises(ModelLoadError, match="reward model"):  # a scorer is no start for a model that writes text
        load_start(_loaded(tmp_path, _recipe(tmp_path, "sft", str(run))), seed=0)

    # the run it started from, left unfinished (no final/): ft merge names it, exit 2, no traceback
    unfinished, moved = tmp_path / "unfinished", tmp_path / "moved"
    unfinished.mkdir()
    (unfinished / "recipe.yaml").write_text((lora_run / "recipe.yaml").read_text())
    shutil.copytree(run / "final", moved / "final")
    for name in ("recipe.yaml", "summary.json"):
        (moved / name).write_text((run / name).read_text().replace(str(lora_run), str(unfinished)))
    refused = run_ft("merge", str(moved), "--out", str(tmp_path / "not-merged"))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "is a run that cannot be loaded" in refused.stderr and "has no final/" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_run_is_no_start_for_random_init_and_a_run_without_final_is_named(lora_run, tmp_path):
    recipe = _loaded(tmp_path, {**_recipe(tmp_path, "sft", str(lora_run)), "model": {"name": str(lora_run),
                                                                                    "init": "random"}})
    with pytest.raises(ModelLoadError, match="model.init"):
        load_start(recipe, seed=0)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "recipe.yaml").write_text((lora_run / "recipe.yaml").read_text())
    result = run_ft("train", str(_written(tmp_path, _recipe(tmp_path, "sft", str(unfinished)))))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "model.name" in result.stderr and "has no final/" in result.stderr and "Traceback" not in result.stderr


def _written(folder: Path, recipe: dict) -> Path:
    path = folder / "written.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def test_grpo_from_a_lora_run_keeps_the_folded_model_as_its_kl_reference(lora_run, tmp_path):
    """TRL loads the KL reference by the policy's name, which no folder holds for a folded run: ft hands it a
    snapshot of the start model, so the first step's KL is exactly 0 (a reference of other weights gives more)."""
    recipe = tiny_grpo(tmp_path / "out", [{"name": "exact_match"}], model=lora_run, init="pretrained",
                       grpo={"beta": 0.04}, max_steps=1)
    result = run_ft("train", str(_written(tmp_path, recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    logged = json.loads((tmp_path / "out" / "log_history.json").read_text())
    assert logged[0]["kl"] == 0.0


def test_the_smoke_run_follows_a_lora_run_to_the_model_it_started_from(lora_run, tmp_path):
    result = run_ft("train", str(_written(tmp_path, _recipe(tmp_path, "reward", str(lora_run)))), "--smoke")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run-smoke" / "summary.json").read_text())
    (change,) = [entry for entry in summary["smoke"]["substitutions"] if entry["key"] == "model.name"]
    assert f"is the run {lora_run / 'recipe.yaml'} records" in change["why"]
    assert "config: the real one" in change["why"]  # the base's config, found through the run's recipe.yaml
