"""Property: any broken recipe gives exit 2 and a message naming a key — never a traceback.

Valid recipes are mutated with wrong types, unknown and misspelt keys, removed required keys and
keys moved into the wrong section; the real CLI (in process) must reject each one cleanly.
"""

from __future__ import annotations

import copy

import yaml
from conftest import ROOT, tiny_sft
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ft.cli import app
from ft.recipe.load import _fields_at
from ft.recipe.schema import recipe_model

BASES = [tiny_sft(ROOT / "runs" / "fuzz", eval_strategy="steps", eval_steps=2, logging_steps=1),
         yaml.safe_load((ROOT / "recipes" / "quickstart.yaml").read_text())]
REQUIRED = [("model",), ("data",), ("model", "name"), ("data", "train"), ("data", "train", 0, "path")]
WRONG_VALUES = [{"unexpected": [1]}, [{"a": None}], {"x": "y"}]


def leaves(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, (*path, key))
    elif isinstance(node, list) and node and isinstance(node[0], dict):
        for i, value in enumerate(node):
            yield from leaves(value, (*path, i))
    else:
        yield path


def mappings(node, path=()):
    if isinstance(node, dict):
        yield path
        for key, value in node.items():
            yield from mappings(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from mappings(value, (*path, i))


def get(node, path):
    for part in path:
        node = node[part]
    return node


def misspell(word: str, data) -> str:
    i = data.draw(st.integers(0, len(word) - 1))
    kind = data.draw(st.sampled_from(["drop", "double", "swap", "suffix"]))
    if kind == "drop":
        return word[:i] + word[i + 1:]
    if kind == "double":
        return word[:i] + word[i] + word[i:]
    if kind == "swap" and i + 1 < len(word):
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    return word + "s"


@st.composite
def broken_recipes(draw):
    """(recipe, dotted path of the mutation, kind of mutation)."""
    recipe = copy.deepcopy(draw(st.sampled_from(BASES)))
    kind = draw(st.sampled_from(["wrong_type", "unknown_key", "misspelt_key", "remove_required", "wrong_nesting"]))
    if kind == "wrong_type":
        path = draw(st.sampled_from(sorted(leaves(recipe), key=str)))
        get(recipe, path[:-1])[path[-1]] = draw(st.sampled_from(WRONG_VALUES))
    elif kind == "remove_required":
        path = draw(st.sampled_from(REQUIRED))
        del get(recipe, path[:-1])[path[-1]]
    elif kind == "wrong_nesting":  # a train key placed in another section
        section = draw(st.sampled_from(["model", "data", "optimizer", "scheduler"]))
        moved = draw(st.sampled_from(sorted(recipe["train"])))
        recipe.setdefault(section, {})[moved] = recipe["train"].pop(moved)
        path = (section, moved)
    else:
        parent = draw(st.sampled_from(sorted((p for p in mappings(recipe) if get(recipe, p)), key=str)))
        node = get(recipe, parent)
        if kind == "unknown_key":
            key = draw(st.text("abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=12))
            assume(key not in node)
            node[key] = draw(st.sampled_from([1, "x", True, None, [1]]))
        else:
            old = draw(st.sampled_from(sorted(node)))
            key = misspell(old, draw(st.data()))
            assume(key not in node)
            node[key] = node.pop(old)
        path = (*parent, key)
    return recipe, path, kind


def is_real_key(recipe: dict, path: tuple) -> bool:
    """A random or misspelt name that happens to be a valid key there is not a mistake."""
    return path[-1] in _fields_at(recipe_model(recipe.get("method", "sft")), path[:-1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=broken_recipes())
def test_broken_recipes_exit_2_naming_a_key(tmp_path_factory, case):
    recipe, path, kind = case
    assume(kind in ("wrong_type", "remove_required") or not is_real_key(recipe, path))
    dotted = ".".join(str(p) for p in path)
    file = tmp_path_factory.mktemp("fuzz") / "recipe.yaml"
    file.write_text(yaml.safe_dump(recipe, sort_keys=False))

    result = CliRunner().invoke(app, ["validate", str(file)])

    assert result.exit_code == 2, (kind, dotted, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    # problem lines look like "  - file:line: key.path: message"
    keys = [line.split(": ")[1] for line in result.output.splitlines() if line.startswith("  - ")]
    assert any(dotted.startswith(key) or key.startswith(dotted) for key in keys), (kind, dotted, result.output)
