"""Loading: extends chains and cycles, deep merge, --set, float parsing, redaction, all errors at once."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ASSETS, DATA, ROOT, run_ft, tiny_sft

from ft.recipe import RecipeError, load_recipe
from ft.recipe.redact import REDACTED
from ft.recipe.resolved import resolved_recipe_yaml


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


@pytest.mark.parametrize(("base", "says"), [
    ("nope.yaml", "which does not exist"), ("folder", "which is a directory"), ("list.yaml", "is not a YAML mapping"),
    ("loop.yaml", "forms a cycle"),
])
def test_extends_problems_are_blamed_on_the_extends_line(tmp_path, base, says):
    """Not on the recipe's line 1: the `extends:` line is what to fix."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "loop.yaml").write_text("extends: a.yaml\n")
    (tmp_path / "a.yaml").write_text(f"method: sft\ntrain: {{max_steps: 3}}\nextends: {base}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "a.yaml")
    (problem,) = info.value.problems
    where = f"{tmp_path / 'loop.yaml'}:1" if base == "loop.yaml" else f"{tmp_path / 'a.yaml'}:3"
    assert problem.path == "extends" and problem.where == where and says in problem.message
    assert info.value.source == str(tmp_path / "a.yaml")  # listed under the recipe the user named


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


# --- extends: every relative path is relative to the file that wrote it ---------------------------------------------

QUICKSTART = ROOT / "recipes" / "quickstart.yaml"


def test_a_recipe_in_another_folder_extends_a_shipped_one(tmp_path, monkeypatch):
    """The quickstart's `../assets/tiny-llama` and `../data/arithmetic/...` are relative to recipes/, not to the folder
    of a recipe that extends it (nor to the working directory); its output path stays relative to where ft runs."""
    monkeypatch.chdir(tmp_path)
    child = tmp_path / "mine.yaml"
    child.write_text(f"extends: {QUICKSTART}\ntrain: {{max_steps: 2}}\n")
    recipe = load_recipe(child).recipe
    assert recipe.model.name == str(ASSETS)
    assert [source.path for source in recipe.data.train] == [str(DATA / "train.jsonl")]
    assert [source.path for source in recipe.data.eval] == [str(DATA / "eval.jsonl")]
    assert recipe.data.eval_exact_match.source.path == str(DATA / "prompts-eval.jsonl")
    assert recipe.train_args["output_dir"] == "runs/quickstart" and recipe.train_args["max_steps"] == 2
    saved = yaml.safe_load(resolved_recipe_yaml(recipe))  # recipe.yaml as ft train writes it
    assert saved["model"]["name"] == str(ASSETS) and saved["data"]["train"][0]["path"] == str(DATA / "train.jsonl")
    done = run_ft("validate", str(child), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["model"]["name"] == str(ASSETS)


def test_each_path_is_relative_to_the_file_that_wrote_it(tmp_path, monkeypatch):
    """A chain over three folders that each hold a rows.jsonl: a key a base wrote names the file next to that base; a
    key the recipe itself writes, and a --set value, the file next to the recipe (else in the working directory)."""
    tmp_path = tmp_path.resolve()
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "rows.jsonl").write_text((DATA / "train.jsonl").read_text())
    root = tiny_sft(tmp_path / "out")
    root["data"]["train"] = [{"path": "rows.jsonl", "format": "chat"}]
    (tmp_path / "a" / "root.yaml").write_text(yaml.safe_dump(root))
    (tmp_path / "b" / "mid.yaml").write_text("extends: ../a/root.yaml\n"
                                             "data: {eval: [{path: rows.jsonl, format: chat}]}\n")
    child = tmp_path / "c" / "child.yaml"
    child.write_text("extends: ../b/mid.yaml\ntrain: {max_steps: 2}\n")
    monkeypatch.chdir(tmp_path)

    loaded = load_recipe(child)
    assert loaded.recipe.data.train[0].path == str(tmp_path / "a" / "rows.jsonl")
    assert loaded.recipe.data.eval[0].path == str(tmp_path / "b" / "rows.jsonl")
    assert loaded.folders == [tmp_path / "c", tmp_path / "b", tmp_path / "a"]  # where modules it names are looked up

    recipe = load_recipe(child, ["data.eval.0.path=rows.jsonl"]).recipe  # --set: next to the recipe, as before
    assert recipe.data.eval[0].path == str(tmp_path / "c" / "rows.jsonl")
    recipe = load_recipe(child, ["data.eval.0.path=a/rows.jsonl"]).recipe  # else in the working directory
    assert recipe.data.eval[0].path == str(tmp_path / "a" / "rows.jsonl")

    child.write_text("extends: ../b/mid.yaml\ndata: {train: [{path: rows.jsonl, format: chat}]}\n")
    overridden = load_recipe(child).recipe  # the recipe's own key: next to it
    assert overridden.data.train[0].path == str(tmp_path / "c" / "rows.jsonl")
    assert overridden.data.eval[0].path == str(tmp_path / "b" / "rows.jsonl")


@pytest.mark.slow
def test_a_recipe_in_another_folder_that_extends_the_quickstart_trains(tmp_path):
    """`ft train` on a recipe outside recipes/ that extends the quickstart: its model and data come from the
    repository, its output goes under the working directory."""
    child = tmp_path / "mine.yaml"
    child.write_text(f"extends: {QUICKSTART}\ndata: {{eval_exact_match: null}}\n"
                     "train: {max_steps: 2, eval_on_start: false, eval_strategy: 'no', save_strategy: 'no', "
                     "output_dir: out}\n")
    done = run_ft("train", str(child), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = yaml.safe_load((tmp_path / "out" / "recipe.yaml").read_text())
    assert saved["model"]["name"] == str(ASSETS) and saved["data"]["eval"][0]["path"] == str(DATA / "eval.jsonl")
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_a_module_a_base_recipe_names_is_found_next_to_it(tmp_path):
    """A callback module next to a base recipe, extended from a recipe in another folder: ft train imports it."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "marker.py").write_text(
        "from pathlib import Path\n\nfrom transformers import TrainerCallback\n\n\n"
        "class Marker(TrainerCallback):\n"
        "    def on_train_begin(self, args, state, control, **kwargs):\n"
        "        (Path(args.output_dir) / 'marked').write_text('base')\n")
    base = tiny_sft(tmp_path / "out", max_steps=1)
    base["callbacks"] = [{"cls": "marker:Marker"}]
    (tmp_path / "base" / "base.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "child").mkdir()
    (tmp_path / "child" / "child.yaml").write_text("extends: ../base/base.yaml\n")
    done = run_ft("train", str(tmp_path / "child" / "child.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "marked").read_text() == "base"


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


def test_a_section_set_creates_is_blamed_on_the_flag(write_recipe, tmp_path):
    """`--set nosuch.key=1` makes a top-level key the recipe never wrote: its problem is the flag's, not line 1's."""
    path = write_recipe(tiny_sft(tmp_path / "out"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["nosuch.key=1"])
    (problem,) = info.value.problems
    assert problem.path == "nosuch" and problem.where == "--set nosuch.key=1"


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
    recipe = tiny_sft(tmp_path / "out", push_to_hub=False)  # (train.hub_token itself is refused: test_hub.py)
    recipe["callbacks"] = [{"cls": "my_callbacks:Logger", "kwargs": {"api_key": "hf_secret123"}}]
    loaded = load_recipe(write_recipe(recipe))
    text = resolved_recipe_yaml(loaded.recipe)
    assert "hf_secret123" not in text and REDACTED in text
    assert yaml.safe_load(text)["train"]["push_to_hub"] is False


@pytest.mark.slow
def test_training_writes_the_redacted_recipe(write_recipe, tmp_path):
    out = tmp_path / "out"
    (tmp_path / "my_callbacks.py").write_text("from transformers import TrainerCallback\n\n\n"
                                              "class Logger(TrainerCallback):\n"
                                              "    def __init__(self, api_key):\n"
                                              "        self.api_key = api_key\n")
    recipe = tiny_sft(out, max_steps=1)
    recipe["callbacks"] = [{"cls": "my_callbacks:Logger", "kwargs": {"api_key": "hf_secret123"}}]
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-2000:]
    written = (out / "recipe.yaml").read_text()
    assert "hf_secret123" not in written and yaml.safe_load(written)["train"]["max_steps"] == 1


def unquoted(recipe: dict) -> str:
    """The recipe as people write it: ``no`` without the quotes yaml.safe_dump puts around it."""
    return yaml.safe_dump(recipe, sort_keys=False).replace("'no'", "no")


def test_no_yes_on_off_are_strings_as_in_yaml_1_2(write_recipe, tmp_path):
    path = write_recipe(unquoted(tiny_sft(tmp_path / "out", eval_strategy="no", logging_strategy="steps")))
    assert "eval_strategy: no\n" in path.read_text() and "save_strategy: no\n" in path.read_text()
    args = load_recipe(path).recipe.train_args
    assert args["eval_strategy"] == "no" and args["save_strategy"] == "no"
    args = load_recipe(path, ["train.eval_strategy=steps", "train.save_strategy=steps"]).recipe.train_args
    assert args["eval_strategy"] == "steps"
    args = load_recipe(path, ["train.eval_strategy=no", "train.save_strategy=no"]).recipe.train_args
    assert args["eval_strategy"] == "no" and args["save_strategy"] == "no"
    assert load_recipe(path, ["data.packing=true"]).recipe.data.packing is True  # true/false stay booleans
    result = run_ft("validate", str(path), "--set", "train.eval_strategy=no", "--set", "train.logging_strategy=no")
    assert result.returncode == 0, result.stderr
    assert "eval_strategy: 'no'" in result.stdout and "logging_strategy: 'no'" in result.stdout


def test_yes_on_a_true_false_key_says_to_write_true_or_false(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"]["packing"] = "PLACEHOLDER"
    path = write_recipe(yaml.safe_dump(recipe, sort_keys=False).replace("PLACEHOLDER", "yes"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    (problem,) = info.value.problems
    assert problem.path == "data.packing" and "'yes'" in problem.message
    assert "`true` or `false`" in problem.message
    assert problem.where == f"{path}:{path.read_text().splitlines().index('  packing: yes') + 1}"
    with pytest.raises(RecipeError, match="`true` or `false`") as info:
        load_recipe(path, ["data.packing=false", "train.bf16=on"])
    assert [p.path for p in info.value.problems] == ["train.bf16"]


def test_a_boolean_on_a_string_key_says_to_quote_it(write_recipe, tmp_path):
    path = write_recipe(tiny_sft(tmp_path / "out"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["train.eval_strategy=false", "data.train.0.split=true"])
    found = {p.path: p.message for p in info.value.problems}
    assert set(found) == {"train.eval_strategy", "data.train.0.split"}
    assert "got False; allowed: no, steps, epoch." in found["train.eval_strategy"]
    assert all("quote the value" in message for message in found.values())


def test_null_means_the_default(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out", bf16=None)
    recipe["data"]["eval"] = None
    recipe["optimizer"] = None
    path = write_recipe(recipe)
    loaded = load_recipe(path).recipe
    assert loaded.data.eval == [] and not loaded.data.has_eval
    assert loaded.optimizer.name == "adamw_torch" and loaded.optimizer.lr is None
    assert "bf16" not in loaded.train_args  # unset: ft picks bf16 for the machine, TRL gets nothing
    full = write_recipe(tiny_sft(tmp_path / "out", eval_strategy="steps"), name="full.yaml")
    assert load_recipe(full).recipe.data.has_eval
    loaded = load_recipe(full, ["data.eval=null", "train.eval_strategy=null", "data.max_length=null"]).recipe
    assert loaded.data.eval == [] and loaded.data.max_length == 1024
    assert "eval_strategy" not in loaded.train_args and "eval_strategy" not in loaded.train.model_fields_set
    (tmp_path / "child.yaml").write_text("extends: full.yaml\ndata: {eval: null}\ntrain: {eval_strategy: null}\n")
    loaded = load_recipe(tmp_path / "child.yaml").recipe  # null takes the base's value away
    assert not loaded.data.has_eval and "eval_strategy" not in loaded.train_args


def test_nulls_inside_free_form_maps_are_values(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    recipe["optimizer"] = {"class": "torch.optim.SGD", "kwargs": {"foreach": None}}
    recipe["scheduler"] = {"type": "linear", "kwargs": {"bar": None}}
    recipe["callbacks"] = [{"cls": "my_callbacks:Logger", "kwargs": {"level": None}}]
    loaded = load_recipe(write_recipe(recipe)).recipe
    assert loaded.optimizer.kwargs == {"foreach": None} and loaded.scheduler.kwargs == {"bar": None}
    assert loaded.callbacks[0].kwargs == {"level": None}
    with pytest.raises(RecipeError) as info:  # a column name mapped to null is no mapping
        load_recipe(write_recipe(recipe), ["data.train.0.fields={messages: null}"])
    assert [p.path for p in info.value.problems] == ["data.train.0.fields.messages"]


def test_null_on_a_required_key_says_it_is_required(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    recipe["model"]["name"] = None
    recipe["data"]["packin"] = None  # a misspelt key stays an error, null or not
    path = write_recipe(recipe)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    found = {p.path: p for p in info.value.problems}
    assert set(found) == {"model.name", "data.packin"}
    assert "required" in found["model.name"].message and "null" in found["model.name"].message
    assert found["model.name"].where == f"{path}:{path.read_text().splitlines().index('  name: null') + 1}"
    assert "unknown key" in found["data.packin"].message
    with pytest.raises(RecipeError, match="data: is required and cannot be null"):
        load_recipe(write_recipe(tiny_sft(tmp_path / "out")), ["data=null"])


def test_a_key_in_the_wrong_section_is_sent_home_and_a_set_key_is_blamed_on_the_flag(write_recipe, tmp_path):
    """A key written in another section than its own (``train.eval_exact_match``, ``model.max_steps``) names the key
    where it lives, rather than a look-alike of the section it was written in; a close name here comes first, one of
    another section after it; the problem of a key ``--set`` wrote is located on the flag, not on a line of the file."""
    recipe = tiny_sft(tmp_path / "out")
    recipe["train"]["eval_exact_match"] = {"n": 20}
    recipe["model"]["max_steps"] = 3
    path = write_recipe(recipe)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    found = {p.path: p for p in info.value.problems}
    assert "another section: `data.eval_exact_match`; move it there" in found["train.eval_exact_match"].message
    assert "eval_do_concat_batches" not in found["train.eval_exact_match"].message
    assert "`train.max_steps`" in found["model.max_steps"].message
    lines = path.read_text().splitlines()
    assert found["model.max_steps"].where == f"{path}:{lines.index('  max_steps: 3') + 1}"

    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(tiny_sft(tmp_path / "out")), ["data.max_step=3", "lr=0.1"])
    found = {p.path: p for p in info.value.problems}
    assert "Did you mean 'mix_stop' or `train.max_steps`?" in found["data.max_step"].message
    assert found["data.max_step"].where == "--set data.max_step=3"
    assert "`optimizer.lr`; move it there" in found["lr"].message and found["lr"].where == "--set lr=0.1"
