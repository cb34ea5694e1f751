"""ft installed from its wheel, as both docker/ images install it (a regular, non-editable install), run from a folder
outside the repository, offline: everything it reads of its own (the train: field table, the smoke test's tiny family
assets) is package data, found through the installed package and never through the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """ft's wheel, built from a copy of the project files the Dockerfiles copy and installed (without its
    dependencies, which this environment has) into a folder of its own."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"),
                            str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next((work / "dist").glob("ft-*.whl"))
    site = work / "site"
    done = subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return site


def _ft(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m ft …`` with the installed copy first on the path, offline, in ``cwd``."""
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "ft", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_wheel_carries_the_package_data(installed):
    package = installed / "ft"
    assert (package / "recipe" / "train_fields.json").is_file()
    for family in ("tiny-llama3", "tiny-qwen2", "tiny-mistral", "tiny-gemma"):
        assert {p.name for p in (package / "smoke" / "assets" / family).iterdir()} >= {
            "config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"}, family


@pytest.mark.slow
def test_installed_ft_validates_prints_its_schema_and_smoke_tests_a_shipped_recipe_outside_the_repository(
        installed, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    recipe = outside / "llama-sft.yaml"
    shutil.copy(ROOT / "recipes" / "llama-sft.yaml", recipe)  # a hub model and hub data: neither is reachable
    where = subprocess.run([sys.executable, "-c", "import ft; print(ft.__file__)"], cwd=outside, capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(installed)}, timeout=120)
    assert Path(where.stdout.strip()).is_relative_to(installed), where.stdout  # the installed copy, not the checkout

    validated = _ft(installed, outside, "validate", recipe.name)
    assert validated.returncode == 0, validated.stderr[-3000:]
    assert "method: sft" in validated.stdout
    schema = _ft(installed, outside, "schema")
    assert schema.returncode == 0 and json.loads(schema.stdout)["title"] == "ft recipe"

    smoke = _ft(installed, outside, "train", recipe.name, "--smoke")
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    assert "smoke test passed" in smoke.stderr
    summary = json.loads((outside / "runs" / "llama-sft-smoke" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["smoke"]["model"]["config"].startswith("shipped assets/tiny-llama3")
    assert not (outside / "runs" / "llama-sft").exists()
