"""Loading: extends chains and cycles, deep merge, --set, float parsing, redaction, all errors at once."""

from __future__ import annotations

import pytest
import yaml
from conftest import ASSETS, DATA, run_ft, tiny_sft

from ft.recipe import RecipeError, load_recipe
from ft.recipe.redact import REDACTED, resolved_recipe_yaml


def test_extends_chain_merges_maps_and_replaces_lists(tmp_path):
    (tmp_path / "base").mkdir()
    base = tiny_sft(tmp_path / "out", logging_steps=5)
    (tmp_path / "base" / "root.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "base" / "mid.yaml").write_text("extends: root.yaml\ntrain: {max_steps: 9}\n")
    child = tmp_path / "child.yaml"
    child.write_text(
        "extends: base/mid.yaml\n"
        f"data:\n  train: [{{path: {DATA / 'text.jsonl'}, format: text}}]\n"
        "train: {logging_steps: 2}\n"
    )
    recipe = load_recipe(child).recipe
    assert recipe.train_args["max_steps"] == 9  # from the middle file
    assert recipe.train_args["logging_steps"] == 2  # child wins
    assert recipe.train_args["per_device_train_batch_size"] == 8  # from the root, merged deeply
    assert [s.format for s in recipe.data.train] == ["text"]  # lists are replaced, not appended
    assert recipe.data.max_length == 64


def test_extends_cycle_is_reported(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "a.yaml")
    assert "cycle" in str(info.value) and "a.yaml" in str(info.value) and "b.yaml" in str(info.value)


def test_extends_missing_file(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: nope.yaml\n")
    with pytest.raises(RecipeError, match="nope.yaml"):
        load_recipe(tmp_path / "a.yaml")


def test_errors_in_a_base_file_point_at_the_base(tmp_path):
    base = tiny_sft(tmp_path / "out")
    base["train"]["warmup_ratio"] = 0.1
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "child.yaml").write_text("extends: base.yaml\ntrain: {max_steps: 3}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "child.yaml")
    (problem,) = info.value.problems
    assert problem.path == "train.warmup_ratio" and "scheduler.warmup_steps" in problem.message
    assert problem.where.startswith(str(tmp_path / "base.yaml") + ":")


def test_set_overrides_nested_keys_list_items_and_parses_yaml_scalars(write_recipe, tmp_path):
    path = write_recipe(tiny_sft(tmp_path / "out"))
    recipe = load_recipe(path, ["train.max_steps=11", "optimizer.lr=1e-4", "data.packing=true",
                                f"data.train.0.path={DATA / 'instruction.jsonl'}", "data.train.0.format=instruction",
                                "optimizer.target_modules=[q_proj, v_proj]"]).recipe
    assert recipe.train_args["max_steps"] == 11
    assert recipe.optimizer.lr == pytest.approx(1e-4)
    assert recipe.data.packing is True
    assert recipe.data.train[0].format == "instruction"
    assert recipe.optimizer.target_modules == ["q_proj", "v_proj"]


def test_set_errors_name_the_flag(write_recipe, tmp_path):
    path = write_recipe(tiny_sft(tmp_path / "out"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["train.max_stepz=3"])
    (problem,) = info.value.problems
    assert problem.where == "--set train.max_stepz=3" and "max_steps" in problem.message
    with pytest.raises(RecipeError, match="KEY=VALUE"):
        load_recipe(path, ["train.max_steps"])


def test_scientific_notation_is_a_float(write_recipe, tmp_path):
    text = yaml.safe_dump(tiny_sft(tmp_path / "out")) + "scheduler: {type: cosine, warmup_steps: 1e1}\n"
    recipe = load_recipe(write_recipe(text.replace("0.003", "3e-3"))).recipe
    assert recipe.optimizer.lr == pytest.approx(3e-3) and recipe.scheduler.warmup_steps == 10.0


def test_all_problems_are_reported_at_once_with_lines(write_recipe, tmp_path):
    path = write_recipe(
        "method: sft\n"
        f"model: {{name: {ASSETS}, init: randm}}\n"
        "data:\n"
        f"  train: [{{path: {DATA / 'train.jsonl'}, formt: chat}}]\n"
        "train:\n"
        "  per_device_train_batch_size: '8'\n"
        "  optim: adamw_torch\n"
        "optimizer: {name: adamw_torhc}\n"
    )
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    found = {p.path: p for p in info.value.problems}
    assert set(found) == {"model.init", "data.train.0.formt", "train.per_device_train_batch_size", "train.optim",
                          "optimizer.name"}
    assert found["model.init"].where == f"{path}:2" and "'random'" in found["model.init"].message
    assert found["data.train.0.formt"].where == f"{path}:4" and "'format'" in found["data.train.0.formt"].message
    assert found["train.optim"].where == f"{path}:7" and "optimizer.name" in found["train.optim"].message
    assert "'adamw_torch'" in found["optimizer.name"].message  # did you mean
    assert "'8'" in found["train.per_device_train_batch_size"].message  # the bad value is shown


def test_secrets_are_redacted_in_the_resolved_recipe(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out", hub_token="hf_secret123", push_to_hub=False)
    recipe["grpo"] = None
    recipe.pop("grpo")
    loaded = load_recipe(write_recipe(recipe))
    text = resolved_recipe_yaml(loaded.recipe)
    assert "hf_secret123" not in text and REDACTED in text
    assert yaml.safe_load(text)["train"]["push_to_hub"] is False


def test_training_writes_the_redacted_recipe(write_recipe, tmp_path):
    out = tmp_path / "out"
    result = run_ft("train", str(write_recipe(tiny_sft(out, max_steps=1, hub_token="hf_secret123"))))
    assert result.returncode == 0, result.stderr[-2000:]
    written = (out / "recipe.yaml").read_text()
    assert "hf_secret123" not in written and yaml.safe_load(written)["train"]["max_steps"] == 1
