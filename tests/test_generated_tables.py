"""Committed, generated files stay in step with the installed libraries and the schema code."""

from __future__ import annotations

import importlib.util
import json

import jsonschema
import pytest
import yaml
from conftest import ROOT

from ft.recipe.json_schema import recipe_json_schema
from ft.recipe.load import read_merged
from ft.recipe.train_section import TABLE_PATH


def _generator():
    spec = importlib.util.spec_from_file_location("gen_train_fields", ROOT / "scripts" / "gen_train_fields.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_field_table_matches_installed_transformers_and_trl():
    """The fields, their types and defaults, as the installed transformers/TRL define them. ``generated_from`` (the
    releases the table was written from) is left out of the comparison: a new release that changes no field (CI
    installs the newest) must not fail every landing; one that does change a field fails here."""
    generator = _generator()
    fresh = json.loads(generator.render(generator.build_table()))
    committed = json.loads(TABLE_PATH.read_text())
    written_from = committed.pop("generated_from")
    fresh.pop("generated_from")
    assert committed == fresh, (
        f"src/ft/recipe/train_fields.json (written from {written_from}) is stale for the installed "
        "transformers/TRL; run `python scripts/gen_train_fields.py` and commit the result"
    )


def test_committed_json_schema_is_current():
    committed = json.loads((ROOT / "docs" / "recipe.schema.json").read_text())
    assert committed == recipe_json_schema(), "run `ft schema > docs/recipe.schema.json`"


@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_satisfy_the_editor_schema(recipe):
    text = recipe.read_text()
    assert text.startswith("# yaml-language-server: $schema=../docs/recipe.schema.json")
    schema = json.loads((ROOT / "docs" / "recipe.schema.json").read_text())
    merged, _ = read_merged(recipe)  # what the editor sees across the `extends` chain
    merged.setdefault("method", "sft")
    jsonschema.validate(merged, schema)
    if "extends" in yaml.safe_load(text):  # the key itself is declared, so editors accept it
        assert all("extends" in branch["properties"] for name, branch in schema["$defs"].items()
                   if name.endswith("Recipe"))
