"""The CLI contract: exit codes, errors on stderr naming key and file:line, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_ft, tiny_sft

RECIPES = sorted(p for p in (ROOT / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_validates(recipe, smollm2):
    """Each shipped recipe validates where what it reads is in place (``smollm2``: the real model's GGUF file, put
    where the smollm2-* recipes read it). vlm-colours.yaml reads a model folder its script writes
    (scripts/make_smollm2_vlm.py; tests/test_vlm_colours.py trains it from a copy): until then ``ft validate`` warns
    that the folder is missing."""
    result = run_ft("validate", str(recipe))
    vlm = ROOT / "assets" / "smollm2-vlm"
    if recipe.name == "vlm-colours.yaml" and not vlm.is_dir():  # validates, and says the folder is not there yet
        assert "warning:" in result.stderr and "model.name: ../assets/smollm2-vlm does not exist" in result.stderr
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["method"]


def test_validate_names_local_inputs_that_are_not_there(write_recipe, tmp_path):
    """A misspelt data file fails ``ft validate`` at its key, and a model folder that does not exist is warned of at
    its key, each with the close name beside it; a model folder another recipe next to it writes is a warning that
    names that recipe."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"]["train"][0]["path"] = "data/trian.jsonl"
    recipe["model"]["name"] = "./models/tinny"
    path = write_recipe(recipe, name="mine.yaml")
    result = run_ft("validate", str(path), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "data.train.0.path: data/trian.jsonl does not exist" in result.stderr
    assert "Did you mean `data/train.jsonl`?" in result.stderr
    assert "model.name: ./models/tinny does not exist" in result.stderr and "`models/tiny`" in result.stderr
    assert result.stdout == ""

    first = write_recipe(tiny_sft(tmp_path / "runs" / "first"), name="first.yaml")
    second = tiny_sft(tmp_path / "runs" / "second")
    second["model"]["name"] = str(tmp_path / "runs" / "first" / "final")
    result = run_ft("validate", str(write_recipe(second, name="second.yaml")), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"does not exist yet: it is what {first.name} writes; train that recipe first" in result.stderr


def test_validate_prints_resolved_recipe_with_defaults(write_recipe, tmp_path):
    path = write_recipe(tiny_sft(tmp_path / "out"))
    result = run_ft("validate", str(path), "--set", "train.max_steps=7")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["train"]["max_steps"] == 7
    assert resolved["optimizer"]["name"] == "adamw_torch"  # a default, filled in


def test_invalid_recipe_exits_2_naming_key_and_line(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    recipe["train"]["num_train_epoch"] = 1
    path = write_recipe(recipe)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "num_train_epoch:" in text)
    for command in ("validate", "train"):
        result = run_ft(command, str(path))
        assert result.returncode == 2
        assert f"{path}:{line}: train.num_train_epoch: unknown key. Did you mean 'num_train_epochs'?" in result.stderr
        assert "Traceback" not in result.stderr


def test_yaml_syntax_error_names_line(write_recipe):
    path = write_recipe("method: sft\nmodel:\n  name: [unclosed\n")
    result = run_ft("validate", str(path))
    assert result.returncode == 2
    assert f"{path}:" in result.stderr and "not valid YAML" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_missing_data_file_exits_2_before_training(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"]["train"][0]["path"] = "no/such/file.jsonl"
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 2
    assert "data.train.0.path" in result.stderr and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_does_not_import_torch(write_recipe, tmp_path):
    path = write_recipe(tiny_sft(tmp_path / "out"))
    code = (
        "import sys\n"
        "from ft.cli import app\n"
        "try:\n"
        f"    app(['validate', {str(path)!r}], prog_name='ft')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'trl', 'datasets', 'peft') if m in sys.modules)\n"
        "print(json.dumps(heavy), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stderr.strip().splitlines()[-1]) == []


def test_schema_is_json_with_every_section():
    result = run_ft("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    sft = schema["$defs"]["SFTRecipe"]["properties"]
    assert {"method", "model", "adapter", "data", "train", "optimizer", "scheduler"} <= set(sft)


def test_output_dir_defaults_next_to_cwd_by_recipe_name(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    del recipe["train"]["output_dir"]
    result = run_ft("validate", str(write_recipe(recipe, name="my-run.yaml")))
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["train"]["output_dir"] == str(Path("runs") / "my-run")


@pytest.mark.slow
def test_an_unexpected_failure_is_one_paragraph_with_the_traceback_in_error_log(write_recipe, tmp_path):
    (tmp_path / "exploding.py").write_text(
        "from transformers import TrainerCallback\n\n"
        "class Explode(TrainerCallback):\n"
        "    def on_step_end(self, args, state, control, **kwargs):\n"
        "        if state.global_step == 2:\n"
        "            raise RuntimeError('disk quota exceeded on step 2')\n"
    )
    recipe = tiny_sft(tmp_path / "out", max_steps=3)
    recipe["callbacks"] = [{"cls": "exploding:Explode"}]
    path = write_recipe(recipe)
    result = run_ft("train", str(path))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert "training failed with RuntimeError: disk quota exceeded on step 2" in message
    log = tmp_path / "out" / "error.log"
    assert str(log) in message and "FT_DEBUG=1" in message
    assert "Traceback" in log.read_text() and "exploding.py" in log.read_text()
    assert not (tmp_path / "out" / "final").exists()

    debug = subprocess.run([sys.executable, "-m", "ft", "train", str(path), "--resume", "never"], cwd=ROOT,
                           env={**os.environ, "FT_DEBUG": "1", "TQDM_DISABLE": "1"},
                           capture_output=True, text=True, timeout=600)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "disk quota exceeded" in debug.stderr


def test_the_objects_alive_at_exit_are_frozen_so_shutdown_does_not_collect_them():
    # after `ft train`, the interpreter's last collections walk every object of torch/transformers/TRL (1.5 s on a
    # CPU, benchmarks/side_by_side.py); ft freezes them when its command returns, however it returns
    code = ("import gc, sys; from ft.cli import main; sys.argv = ['ft'] + sys.argv[1:]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nprint(gc.get_freeze_count())")
    for args in (["schema"], ["validate", "no-such-recipe.yaml"]):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)
        assert int(done.stdout.strip().splitlines()[-1]) > 1000, (args, done.stderr[-2000:])


def test_the_cli_catches_ft_error_alone_and_imports_no_other_error_class():
    """Every failure ft explains reaches the CLI as an FtError; the commands map it, and nothing else by name."""
    import ast

    tree = ast.parse((ROOT / "src" / "ft" / "cli.py").read_text())
    caught = [ast.unparse(node.type) for node in ast.walk(tree) if isinstance(node, ast.ExceptHandler)]
    assert caught.count("FtError") == 1
    assert set(caught) <= {"FtError", "Exception", "KeyboardInterrupt", "SystemExit", "OSError"}, caught
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert {name for name in imported if name.endswith(("Error", "Failed", "Full", "OutOfMemory"))} == {"FtError"}


def test_each_failure_keeps_its_exit_code_and_the_words_before_its_message():
    """What `ft` prints for each error class (``render``) and the status it exits with, as before they shared a root:
    a recipe's problem list starts with its file, a run that started and then failed on the disk or the Hub exits 1."""
    from ft.data.rows import DataError
    from ft.data.stream import StreamFailed
    from ft.errors import FtError
    from ft.importers.axolotl import ConfigError
    from ft.model.loading import ModelLoadError
    from ft.outputs.checkpoints import ResumeError
    from ft.outputs.disk import DiskFull
    from ft.outputs.hub_push import PushFailed
    from ft.outputs.report import ReportError
    from ft.plan.shape import PlanError
    from ft.recipe import Problem, RecipeError
    from ft.recipe.yaml_io import YamlSyntaxError
    from ft.run.drift import DriftError
    from ft.trainers.plugins import PluginError
    from ft.trainers.preflight import PreflightOutOfMemory

    said = {cls: (cls("why").render(), cls("why").exit_code) for cls in (
        DataError, StreamFailed, ModelLoadError, ResumeError, DriftError, PreflightOutOfMemory, PlanError,
        YamlSyntaxError)}
    assert said == dict.fromkeys(said, ("ft: why", 2))
    assert (DiskFull("why").render(), DiskFull("why").exit_code) == ("ft: why", 1)
    assert (PushFailed("why", {}).render(), PushFailed("why", {}).exit_code) == ("ft: why", 1)
    assert (ReportError("why").render(), ReportError("why").exit_code) == ("ft report: why", 2)
    assert (ConfigError("why").render(), ConfigError("why").exit_code) == ("ft import axolotl: why", 2)
    plugin = PluginError(Problem("loss", "no module `x`"))
    assert plugin.render() == "ft: loss: no module `x`" and plugin.problem.path == "loss"
    recipe = RecipeError([Problem("train.max_steps", "must be positive", "r.yaml:3")], "r.yaml")
    assert recipe.render() == str(recipe) == ("r.yaml: 1 problem in the recipe:\n"
                                              "  - r.yaml:3: train.max_steps: must be positive")
    assert recipe.exit_code == 2 and isinstance(recipe, FtError)
    assert FtError("why", exit_code=1).exit_code == 1 and FtError("why").exit_code == 2
