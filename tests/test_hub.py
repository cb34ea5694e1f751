"""The Hub: the `train:` hub settings reach every method's trainer arguments; a recipe that pushes is refused before
any model loads when this machine has no token (or the Hub is switched off); and tokens never travel inside the run's
files: `train.hub_token` is refused without repeating its value, and a real run, started with a token in its
environment and secrets in its recipe, writes none of them into any file of its output directory, its output or what
it pushes (to a local stand-in for the Hub, tests/fake_hub.py)."""

from __future__ import annotations

import importlib
import itertools
import json
import os
import subprocess
import sys
import zipfile

import pytest
from conftest import CPU, DATA, ROOT, hub_env, run_ft, tiny_sft

from ft.machine.hardware import device_defaults
from ft.recipe import RecipeError, load_recipe
from ft.recipe.methods import METHODS
from ft.recipe.train_section import method_fields

FILES = {"chat": "train.jsonl", "preference": "preference.jsonl", "prompt": "prompts.jsonl"}  # each method's first
# every hub_strategy, spread over the methods in turn
STRATEGY = dict(zip(METHODS, itertools.cycle(method_fields("sft")["hub_strategy"]["choices"])))
HUB = {"push_to_hub": True, "hub_model_id": "someone/tiny-run", "hub_private_repo": True, "hub_always_push": True,
       "hub_revision": "experiments"}
NO_TOKEN = {"HF_TOKEN": None, "HUGGING_FACE_HUB_TOKEN": None, "HF_TOKEN_PATH": None, "HF_OIDC_RESOURCE": None}


def _recipe(tmp_path, method: str, **train) -> dict:
    recipe = tiny_sft(tmp_path / "out", eval_strategy="no", **train)
    recipe["method"] = method
    fmt = METHODS[method].formats[0]
    recipe["data"] = {"train": [{"path": str(DATA / FILES[fmt]), "format": fmt}], "max_length": 48}
    if METHODS[method].generates:
        recipe[method] = {"num_generations": 4, "rewards": [{"name": "numeric_match"}]}
    return recipe


@pytest.mark.parametrize("method", METHODS)
def test_hub_settings_reach_each_methods_trainer_arguments(write_recipe, tmp_path, method):
    """Checked on the config: a Trainer built with push_to_hub would create the repository on the Hub."""
    settings = {**HUB, "hub_strategy": STRATEGY[method]}
    recipe = load_recipe(write_recipe(_recipe(tmp_path, method, **settings))).recipe
    config = importlib.import_module(f"ft.trainers.{method}").config(recipe, device_defaults(recipe, CPU))
    assert {key: getattr(config, key) for key in settings} == settings  # HubStrategy is a str enum
    assert config.hub_token is None  # transformers then pushes with the token huggingface_hub finds


def test_the_cases_cover_every_hub_strategy():
    assert set(STRATEGY.values()) == set(method_fields("sft")["hub_strategy"]["choices"])


def test_push_without_a_token_stops_before_any_model_loads(write_recipe, tmp_path):
    out = tmp_path / "out"
    path = write_recipe(tiny_sft(out, push_to_hub=True))
    home = tmp_path / "hf-home"
    home.mkdir()
    result = run_ft("train", str(path), env={**NO_TOKEN, "HF_HOME": str(home), "HF_HUB_OFFLINE": None})
    assert result.returncode == 2, result.stderr[-2000:]
    line = next(line for line in result.stderr.splitlines() if "train.push_to_hub" in line)
    assert f"{path}:" in line and "needs a Hugging Face token" in line
    assert "HF_TOKEN" in line and "hf auth login" in line
    assert "HF_HUB_OFFLINE" not in result.stderr
    assert not out.exists()  # stopped before the output directory, the data and the model


def _check_hub(recipe_path, env: dict) -> list[str]:
    """check_hub in a fresh process: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when it is imported."""
    code = ("import json, sys; from ft.run.hub import check_hub; from ft.recipe import load_recipe; "
            "print(json.dumps([p.render() for p in check_hub(load_recipe(sys.argv[1]).recipe)]))")
    full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    done = subprocess.run([sys.executable, "-c", code, str(recipe_path)], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_check_hub_wants_a_token_and_the_hub_switched_on(write_recipe, tmp_path):
    home = tmp_path / "hf-home"
    home.mkdir()
    pushing = write_recipe(tiny_sft(tmp_path / "out", push_to_hub=True), name="pushing.yaml")
    quiet = write_recipe(tiny_sft(tmp_path / "out"), name="quiet.yaml")
    base = {**NO_TOKEN, "HF_HOME": str(home)}
    online, offline = {"HF_HUB_OFFLINE": "0"}, {"HF_HUB_OFFLINE": "1"}
    token = {"HF_TOKEN": "hf_plantedForCheckHub0123456789"}

    assert _check_hub(pushing, {**base, **online, **token}) == []
    assert _check_hub(quiet, {**base, **offline}) == []  # a recipe that does not push needs neither
    [missing] = _check_hub(pushing, {**base, **online})
    assert "train.push_to_hub" in missing and "none" in missing
    (home / "token").write_text("hf_plantedStoredLogin0123456789")  # where `hf auth login` stores it
    assert _check_hub(pushing, {**base, **online}) == []
    [switched_off] = _check_hub(pushing, {**base, **offline, **token})
    assert "HF_HUB_OFFLINE" in switched_off and "hf_planted" not in switched_off


@pytest.mark.parametrize("how", ["file", "--set"])
def test_a_hub_token_in_the_recipe_is_refused_without_repeating_it(write_recipe, tmp_path, how):
    token = "hf_plantedRecipeToken0123456789"
    out = tmp_path / "out"
    recipe = tiny_sft(out)
    if how == "file":
        recipe["train"]["hub_token"] = token
    path = write_recipe(recipe)
    result = run_ft("train", str(path), *(["--set", f"train.hub_token={token}"] if how == "--set" else []))
    assert result.returncode == 2, result.stderr[-2000:]
    line = next(line for line in result.stderr.splitlines() if "train.hub_token" in line)
    assert "HF_TOKEN" in line and "hf auth login" in line and "training_args.bin" in line
    assert (f"{path}:" in line) if how == "file" else ("--set train.hub_token=<redacted>" in line)
    assert token not in result.stderr + result.stdout
    assert not out.exists()


def test_a_credential_inside_a_train_value_is_refused(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out", accelerator_config={"tracker": {"api_key": "sk-planted0123456789"}})
    with pytest.raises(RecipeError) as caught:
        load_recipe(write_recipe(recipe))
    [problem] = caught.value.problems
    assert problem.path == "train.accelerator_config.tracker.api_key" and "training_args.bin" in problem.message
    assert "sk-planted" not in str(caught.value)


def test_hub_settings_without_a_push_are_a_warning(write_recipe, tmp_path):
    warned = load_recipe(write_recipe(tiny_sft(tmp_path / "out", hub_model_id="someone/x", hub_strategy="checkpoint")))
    assert {w.path for w in warned.warnings} >= {"train.hub_model_id", "train.hub_strategy"}
    assert all("push_to_hub" in w.message for w in warned.warnings if w.path.startswith("train.hub_"))
    pushing = tiny_sft(tmp_path / "out", push_to_hub=True, hub_model_id="someone/x", hub_strategy="checkpoint")
    assert not [w for w in load_recipe(write_recipe(pushing)).warnings if w.path.startswith("train.hub_")]


CALLBACK = '''
from transformers import TrainerCallback


class KeepsKeys(TrainerCallback):
    """Like a logging service's callback: it keeps its credentials on itself."""

    def __init__(self, api_key, auth):
        self.api_key, self.auth = api_key, auth
'''


def _found_in(path, secrets: dict[str, bytes]) -> list[str]:
    """The names of the secrets whose bytes occur in the file, or in any member of it if it is a zip (torch.save)."""
    blobs = [path.read_bytes()]
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            blobs += [archive.read(member) for member in archive.namelist()]
    return [name for name, secret in secrets.items() if any(secret in blob for blob in blobs)]


@pytest.mark.slow
def test_no_token_or_secret_reaches_any_file_of_the_run_its_output_or_the_hub(write_recipe, tmp_path, fake_hub):
    """A real push (to the local stand-in for the Hub) of every save and the last checkpoint: the token is read and
    sent (in the Authorization header), and no secret is in any file written here or uploaded."""
    secrets = {"HF_TOKEN": "hf_plantedEnvToken0123456789abcdef", "api_key (--set)": "sk-plantedSetKey0123456789",
               "auth.password (file)": "plantedPassword0123456789"}
    out = tmp_path / "out"
    (tmp_path / "keeps_keys.py").write_text(CALLBACK)
    recipe = tiny_sft(out, max_steps=2, save_strategy="steps", save_steps=1, eval_strategy="steps", eval_steps=1,
                      per_device_eval_batch_size=64, logging_steps=1, push_to_hub=True, hub_model_id="someone/keys",
                      hub_strategy="checkpoint", hub_always_push=True)
    recipe["callbacks"] = [{"cls": "keeps_keys:KeepsKeys",
                            "kwargs": {"api_key": "overridden", "auth": {"password": secrets["auth.password (file)"]}}}]
    override = f"callbacks.0.kwargs.api_key={secrets['api_key (--set)']}"
    result = run_ft("train", str(write_recipe(recipe)), "--set", override,
                    env=hub_env(tmp_path, fake_hub, secrets["HF_TOKEN"]))
    assert result.returncode == 0, result.stderr[-3000:]

    files = sorted(path for path in out.rglob("*") if path.is_file())
    names = {path.relative_to(out).as_posix() for path in files}
    assert {"recipe.yaml", "summary.json", "final/model.safetensors", "final/training_args.bin", "plots/loss.png",
            "checkpoint-2/training_args.bin", "checkpoint-2/optimizer.pt", "checkpoint-2/rng_state.pth",
            "checkpoint-2/trainer_state.json"} <= names, names
    # the search sees strings a run pickles: the output directory is in training_args.bin
    assert _found_in(out / "final" / "training_args.bin", {"output_dir": str(out).encode()}) == ["output_dir"]
    assert "<redacted>" in (out / "recipe.yaml").read_text()
    pushed = fake_hub.files("someone/keys")
    assert {"summary.json", "model.safetensors", "training_args.bin", "recipe.yaml",
            "last-checkpoint/training_args.bin", "last-checkpoint/optimizer.pt"} <= set(pushed), sorted(pushed)
    assert set(fake_hub.authorizations) - {None} == {f"Bearer {secrets['HF_TOKEN']}"}  # read, and sent

    planted = {name: secret.encode() for name, secret in secrets.items()}
    leaks = {path.relative_to(out).as_posix(): found for path in files if (found := _found_in(path, planted))}
    uploads = tmp_path / "uploaded"
    for name, content in pushed.items():
        (uploads / name).parent.mkdir(parents=True, exist_ok=True)
        (uploads / name).write_bytes(content)
        if found := _found_in(uploads / name, planted):
            leaks[f"hub:{name}"] = found
    leaks.update({stream: found for stream, text in (("stdout", result.stdout), ("stderr", result.stderr))
                  if (found := [name for name, secret in secrets.items() if secret in text])})
    assert leaks == {}
