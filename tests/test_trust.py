"""The trust model of a recipe's ``module:function`` names (``loss:``, ``callbacks:``, reward ``fn:``,
``optimizer.class``, ``scheduler.class``): the recipe's folders are importable only while those names are imported,
after the installed packages (a stray ``datasets.py`` beside a recipe shadows nothing), ``sys.path`` is left as it
was, and Python's standard library is refused as a loss, callback or reward, naming the key."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import DATA, ROOT, run_ft, tiny_sft

from ft.recipe import load_recipe
from ft.trainers.hooks import resolve_hooks
from ft.trainers.plugins import PluginError

# a module that must never be imported: it stands where a library's name would be found first
RAISING = "raise RuntimeError('the datasets.py beside the recipe was imported instead of the datasets library')\n"

CALLBACK = """
from pathlib import Path

from transformers import TrainerCallback


class Marker(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        (Path(args.output_dir) / 'marked').write_text('{text}')
"""


def _module(folder: Path, name: str, code: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(code))


def _grpo(output_dir: Path, rewards: list[dict]) -> dict:
    """A minimal GRPO recipe whose rewards are all functions (nothing loads to resolve them)."""
    return {
        "method": "grpo",
        "model": {"name": str(ROOT / "assets" / "tiny-llama"), "init": "random"},
        "data": {"train": [{"path": str(DATA / "prompts.jsonl"), "format": "prompt"}]},
        "grpo": {"num_generations": 8, "max_completion_length": 8, "rewards": rewards},
        "train": {"output_dir": str(output_dir), "max_steps": 2, "per_device_train_batch_size": 16,
                  "report_to": "none"},
    }


def _refused(write_recipe, tmp_path, recipe: dict) -> PluginError:
    path = write_recipe(recipe)
    with pytest.raises(PluginError) as info:
        resolve_hooks(load_recipe(path).recipe, tmp_path)
    assert "Traceback" not in info.value.render()
    return info.value


# --- sys.path ------------------------------------------------------------------------------------------------------


def test_resolving_a_recipes_modules_leaves_sys_path_as_it_was(write_recipe, tmp_path):
    """A loss and a callback from one module next to the recipe, and a reward module that imports a sibling when it
    is imported: all resolve, and afterwards sys.path is the same list, without the recipe's folder."""
    _module(tmp_path, "trust_both", """
        from transformers import TrainerCallback

        def summed(outputs, labels, num_items_in_batch):
            return 0.0

        class Quiet(TrainerCallback):
            pass
    """)
    before = list(sys.path)
    recipe = tiny_sft(tmp_path / "out")
    recipe["loss"] = "trust_both:summed"
    recipe["callbacks"] = [{"cls": "trust_both:Quiet"}]
    hooks = resolve_hooks(load_recipe(write_recipe(recipe)).recipe, tmp_path)
    assert hooks.loss.__name__ == "summed" and type(hooks.callbacks[0]).__name__ == "Quiet"
    assert sys.path == before and str(tmp_path) not in sys.path


def test_a_module_that_imports_a_sibling_as_it_is_imported_still_works(write_recipe, tmp_path):
    _module(tmp_path, "trust_sibling_helpers", """
        def bonus(completion):
            return 2.0 if completion.endswith("!") else 0.0
    """)
    _module(tmp_path, "trust_sibling_rewards", """
        from trust_sibling_helpers import bonus

        def excited(prompts, completions, **kwargs):
            return [bonus(c) for c in completions]
    """)
    before = list(sys.path)
    recipe = _grpo(tmp_path / "out", [{"fn": "trust_sibling_rewards:excited"}])
    (reward,) = resolve_hooks(load_recipe(write_recipe(recipe)).recipe, tmp_path).rewards
    assert reward(prompts=["a", "b"], completions=["yes!", "no"]) == [2.0, 0.0]
    assert sys.path == before


def test_a_base_recipes_module_imports_from_its_folder_and_the_recipes_own_folder_comes_first(tmp_path):
    """The child's folder, then the base's (LoadedRecipe.folders): a module only the base's folder holds is found
    there; one both hold is the child's. sys.path is left as it was."""
    base, child = tmp_path / "base", tmp_path / "child"
    _module(base, "trust_base_marker", CALLBACK.format(text="base"))
    _module(base, "trust_which_loss", "def loss(outputs, labels, num_items_in_batch):\n    return 'base'\n")
    _module(child, "trust_which_loss", "def loss(outputs, labels, num_items_in_batch):\n    return 'child'\n")
    recipe = tiny_sft(tmp_path / "out")
    recipe["callbacks"] = [{"cls": "trust_base_marker:Marker"}]
    recipe["loss"] = "trust_which_loss:loss"
    (base / "base.yaml").write_text(yaml.safe_dump(recipe))
    (child / "child.yaml").write_text("extends: ../base/base.yaml\n")
    loaded = load_recipe(child / "child.yaml")
    before = list(sys.path)
    hooks = resolve_hooks(loaded.recipe, loaded.folders)
    assert Path(sys.modules[type(hooks.callbacks[0]).__module__].__file__).parent == base
    assert hooks.loss(None, None, 1) == "child"
    assert sys.path == before


# --- shadowing -----------------------------------------------------------------------------------------------------

SHADOW_CHECK = """
import sys
from ft.trainers.plugins import resolve

assert "datasets" not in sys.modules  # otherwise the imports below would look nowhere
score = resolve("trust_uses_datasets:score", "grpo.rewards.0.fn", sys.argv[1])
print(sys.modules[score.__module__].DATASETS)  # what the module beside the recipe imported as `datasets`
import datasets  # as the run imports it later
print(datasets.__file__)
"""


def test_a_datasets_py_beside_the_recipe_shadows_the_library_neither_while_resolving_nor_after(tmp_path):
    """In a fresh process, where nothing has imported `datasets` yet: a reward module beside the recipe imports it as
    it is imported, and the process imports it afterwards; both get the library, never the raising datasets.py."""
    folder = tmp_path / "recipes"
    _module(folder, "datasets", RAISING)
    _module(folder, "trust_uses_datasets", """
        import datasets

        DATASETS = datasets.__file__

        def score(prompts, completions, **kwargs):
            return [0.0 for _ in completions]
    """)
    elsewhere = tmp_path / "elsewhere"  # the working directory (first on sys.path with -c) holds nothing
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-c", SHADOW_CHECK, str(folder)], cwd=elsewhere, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    during, after = done.stdout.split()[-2:]
    for file in (during, after):
        assert Path(file).parent.name == "datasets" and Path(file).name == "__init__.py", done.stdout
        assert folder not in Path(file).parents


def test_a_module_beside_the_recipe_named_like_an_installed_one_is_refused(write_recipe, tmp_path):
    """`datasets:Marker` with a datasets.py beside the recipe: Python would import the library, so the recipe is told
    to rename the file, naming the key (not a puzzling "`datasets` has no `Marker`")."""
    _module(tmp_path, "datasets", CALLBACK.format(text="mine"))
    recipe = tiny_sft(tmp_path / "out")
    recipe["callbacks"] = [{"cls": "datasets:Marker"}]
    error = _refused(write_recipe, tmp_path, recipe)
    assert error.problem.path == "callbacks.0.cls"
    assert "datasets.py" in error.problem.message and "rename the file" in error.problem.message


def test_a_module_beside_the_recipe_named_like_a_standard_library_one_is_refused(write_recipe, tmp_path):
    _module(tmp_path, "code", "def loss(outputs, labels, num_items_in_batch):\n    return 0.0\n")
    recipe = tiny_sft(tmp_path / "out")
    recipe["loss"] = "code:loss"
    error = _refused(write_recipe, tmp_path, recipe)
    assert error.problem.path == "loss"
    assert "standard-library module `code`" in error.problem.message and "rename" in error.problem.message


@pytest.mark.slow
def test_ft_train_uses_the_libraries_beside_stray_modules_of_their_names(tmp_path):
    """End to end: a recipe folder holding a datasets.py, a trl.py and a statistics.py that raise on import, and a
    callback module; ft train resolves the callback, then prepares the data, builds TRL's trainer and trains its 2
    steps with the real libraries (TRL and statistics are first imported after the callback is resolved)."""
    folder = tmp_path / "recipes"
    for stray in ("datasets", "trl", "statistics"):
        _module(folder, stray, RAISING.replace("datasets", stray))
    _module(folder, "trust_train_marker", CALLBACK.format(text="trained"))
    recipe = tiny_sft(tmp_path / "out", max_steps=2)
    recipe["data"]["eval"] = []
    recipe["callbacks"] = [{"cls": "trust_train_marker:Marker"}]
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    done = run_ft("train", str(folder / "recipe.yaml"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "marked").read_text() == "trained"
    assert "beside the recipe was imported" not in done.stderr


# --- the standard library is no loss, callback or reward -----------------------------------------------------------


@pytest.mark.parametrize("key, reference", [
    ("loss", "os:system"),
    ("loss", "shutil:rmtree"),  # (path, ignore_errors, onerror): three positional parameters pass as a loss's
    ("grpo.rewards.0.fn", "builtins:eval"),
    ("grpo.rewards.0.fn", "subprocess:run"),  # (*popenargs, ..., **kwargs) passes as a reward's signature
    ("grpo.rewards.0.fn", "shutil:rmtree"),
    ("callbacks.0.cls", "os:system"),
    ("optimizer.class", "collections.OrderedDict"),
])
def test_a_standard_library_name_is_refused_naming_the_key(write_recipe, tmp_path, key, reference):
    if key == "loss":
        recipe = tiny_sft(tmp_path / "out")
        recipe["loss"] = reference
    elif key == "callbacks.0.cls":
        recipe = tiny_sft(tmp_path / "out")
        recipe["callbacks"] = [{"cls": reference}]
    elif key == "optimizer.class":
        recipe = tiny_sft(tmp_path / "out")
        recipe["optimizer"] = {"class": reference}
    else:
        recipe = _grpo(tmp_path / "out", [{"fn": reference}])
    error = _refused(write_recipe, tmp_path, recipe)
    assert error.problem.path == key
    message = error.problem.message
    assert "Python's standard library" in message and "you wrote" in message and "trust" in message, message


def test_a_standard_library_function_re_exported_by_a_users_module_is_refused(write_recipe, tmp_path):
    _module(tmp_path, "trust_reexport", "from subprocess import run as score\n")
    error = _refused(write_recipe, tmp_path, _grpo(tmp_path / "out", [{"fn": "trust_reexport:score"}]))
    assert error.problem.path == "grpo.rewards.0.fn"
    assert "subprocess.run" in error.problem.message and "standard library" in error.problem.message


def test_a_users_partial_and_a_librarys_class_are_accepted(write_recipe, tmp_path):
    """The rule looks at where the code was written: a functools.partial of the user's function is the user's, and
    a torch optimizer class is a library's."""
    _module(tmp_path, "trust_partial", """
        import functools

        def scaled(prompts, completions, scale, **kwargs):
            return [scale * len(c) for c in completions]

        doubled = functools.partial(scaled, scale=2.0)
    """)
    recipe = _grpo(tmp_path / "out", [{"fn": "trust_partial:doubled"}])
    recipe["optimizer"] = {"class": "torch.optim.SGD"}
    hooks = resolve_hooks(load_recipe(write_recipe(recipe)).recipe, tmp_path)
    assert hooks.rewards[0](prompts=["p"], completions=["abc"]) == [6.0]
    assert hooks.optimizer_class.__name__ == "SGD"


@pytest.mark.slow
def test_ft_train_refuses_a_standard_library_reward_before_anything_loads(write_recipe, tmp_path):
    """`ft validate` imports nothing a recipe names, so it passes; `ft train` exits 2 naming the key and its line."""
    path = write_recipe(_grpo(tmp_path / "out", [{"fn": "shutil:rmtree"}]))
    assert run_ft("validate", str(path)).returncode == 0
    result = run_ft("train", str(path))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "grpo.rewards.0.fn:" in result.stderr and "standard library" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
