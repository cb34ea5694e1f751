"""The house by stage: imports go one way, packages share only public names, and a method is its METHODS entry and
its trainer module. Read from the source itself (``ast``), so a new module is checked without being listed here."""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from ft.recipe.methods import METHODS

SRC = ROOT / "src" / "ft"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str, path: Path) -> str:
    """The package a module belongs to: itself for a package's ``__init__``, else its parent."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


MODULES = {_module_name(path): path for path in sorted(SRC.rglob("*.py"))}


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once for the tests here (they only read it)."""
    return ast.parse(path.read_text(), str(path))


def _imports(module: str, path: Path):
    """(line, imported ft module, names imported from it) for every import statement of ``module``, at any depth
    (function-local imports included)."""
    package = _package(module, path)
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "ft" or alias.name.startswith("ft."):
                    yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "ft" or target.startswith("ft."):
                yield node.lineno, target, tuple(alias.name for alias in node.names)


def _ancestor(package: str, module: str) -> bool:
    """``package`` is ``module``'s own package or one above it: Python has started running it before ``module``."""
    return module == package or module.startswith(package + ".")


def _edges() -> dict[str, set[str]]:
    """Module -> the ft modules importing it runs: the ones it names, a submodule imported by name from a package,
    and the ``__init__`` of every package above them that is not above the importer too (Python runs it first)."""
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for module in MODULES:
        for _, target, names in _imports(module, MODULES[module]):
            found = {target} | {f"{target}.{name}" for name in names if f"{target}.{name}" in MODULES}
            for name in list(found):
                parts = name.split(".")
                found |= {".".join(parts[:i]) for i in range(1, len(parts))}
            graph[module] |= {name for name in found if name in MODULES and not _ancestor(name, module)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for node in graph:
        if node not in index:
            visit(node)
    return out


def test_no_import_circle_anywhere():
    graph = _edges()
    assert graph["ft.run.train"] >= {"ft.trainers.build", "ft.model.loading", "ft.outputs.summary"}  # it sees them
    assert _cycles(graph) == []
    hidden = [f"{path.relative_to(ROOT)}" for path in MODULES.values() if "TYPE_CHECKING" in path.read_text()]
    assert hidden == [], "an import under TYPE_CHECKING hides a circle from this test"


# The floors of the house, top first. A module imports its own package and the packages of the floors below its own,
# never one beside it or above it: what a command runs is on a higher floor than what it is built from. A package or
# top-level module of ft not listed here fails the test until it is given a floor.
FLOORS = (
    ("__main__",),
    ("cli",),  # the commands alone: parse, call one function, map every failure to one paragraph and an exit code
    ("smoke", "importers"),  # ft train --smoke rehearses a run; ft import axolotl writes a recipe
    ("run",),  # the ordered run of ft train / ft preprocess, and its launch
    ("trainers", "inference", "export"),  # a run's trainer; using what a run left (merge, generate); writing it out
    ("eval",),  # benchmarks through lm-eval: ft eval, and (from a run's trainer) the model being trained scored
    ("plan",),  # the memory model (read by the trainers' preflight) and ft plan's report
    ("model", "data"),  # the models a recipe names (loading, a run's model, adapters); its rows and tokens
    ("outputs",),  # the run directory: checkpoints, summary.json, plots, report
    ("machine",),  # what this machine can do: hardware, device defaults, trackers installed
    ("recipe",),  # YAML -> the frozen Recipe; imports no torch
    ("errors", "units", "caching"),  # the error root; byte formatting; the folder of ft's cache and its switches
)


def _floor_of(module: str) -> tuple[int, str]:
    name = module.split(".")[1] if module != "ft" else "ft"
    for level, names in enumerate(FLOORS):
        if name in names:
            return level, name
    raise AssertionError(f"{module}: its package `{name}` has no floor in tests/test_layout.py FLOORS")


def test_imports_go_down_the_floors():
    """Every import of every module (function-local ones included) runs down the floors or stays in its package."""
    graph = _edges()
    up = []
    for module, targets in graph.items():
        if module == "ft":
            continue
        level, package = _floor_of(module)
        for target in targets:
            if target == "ft":  # the root package (``__version__``): above every module, run first
                continue
            their_level, their_package = _floor_of(target)
            if their_package != package and their_level <= level:
                up.append(f"{module} -> {target} ({'beside' if their_level == level else 'up'})")
    assert up == []
    assert [module for module, targets in graph.items() if "ft.cli" in targets] == ["ft.__main__"]  # python -m ft


def test_the_floors_name_every_package():
    names = {module.split(".")[1] for module in MODULES if module != "ft"}
    listed = {name for floor in FLOORS for name in floor}
    assert names == listed


def test_no_module_imports_a_private_name_from_another_package():
    found = []
    for module, path in MODULES.items():
        own = _package(module, path)
        imported_modules = {}
        for line, target, names in _imports(module, path):
            other = _package(target, MODULES.get(target, Path("x.py"))) if target in MODULES else target
            for name in names:
                full = f"{target}.{name}"
                if full in MODULES:  # a module imported from its package: its attributes are checked below
                    imported_modules[name] = _package(full, MODULES[full])
                elif name.startswith("_") and not name.startswith("__") and other != own:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {name} from {target}")
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and node.value.id in imported_modules
                    and imported_modules[node.value.id] != own):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert found == []


# --- a method is its entry and its trainer module --------------------------------------------------------------------

# tables keyed by names that are Axolotl's own, which happen to be ft's method names too
AXOLOTL_NAMES = {"ft.importers.axolotl_types": "STRATEGIES: Axolotl's prompt strategies by its own `rl:` families"}


def _method_names(node: ast.AST) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [item.value for item in items if isinstance(item, ast.Constant) and item.value in METHODS]


def _is_method(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "method") or (isinstance(node, ast.Name)
                                                                            and node.id == "method")


def test_no_module_keeps_a_list_of_methods_of_its_own():
    """Outside recipe/methods.py and trainers/<method>.py no code compares a recipe's method with a method's name,
    keys a table by method names, lists them, or reads a method's section by its name."""
    own = {"ft.recipe.methods", *(f"ft.trainers.{name}" for name in METHODS)}
    sectioned = {name for name, method in METHODS.items() if method.section is not None}
    found = []
    for module, path in MODULES.items():
        if module in own:
            continue
        for node in ast.walk(_tree(path)):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_is_method(side) for side in sides) and any(_method_names(side) for side in sides):
                    found.append(f"{where}: compares a method with {ast.unparse(node)}")
            elif isinstance(node, ast.Dict) and len([k for k in node.keys if k is not None and _method_names(k)]) > 1:
                if module not in AXOLOTL_NAMES:
                    found.append(f"{where}: a table keyed by methods")
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(_method_names(node)) > 1:
                found.append(f"{where}: a list of methods {ast.unparse(node)}")
            elif isinstance(node, ast.Attribute) and node.attr in sectioned and isinstance(node.value, ast.Name) \
                    and node.value.id == "recipe":
                found.append(f"{where}: reads the `{node.attr}:` section by name")
    assert found == []


def test_the_consumers_read_each_methods_entry():
    """What summary.json, the console, ft plan and the importers say of each method is what its entry says."""
    from dataclasses import replace

    from ft.importers.axolotl import SECTIONS
    from ft.importers.axolotl_method import method_of
    from ft.outputs.summary import headline
    from ft.plan.memory import setup_for
    from ft.plan.shape import read_shape
    from ft.recipe import load_recipe
    from ft.trainers.console import labels

    quickstart = load_recipe(ROOT / "recipes" / "quickstart.yaml").recipe
    setup = setup_for(quickstart, read_shape(quickstart))
    for name, method in METHODS.items():
        log = [{"step": 1, **{f.key: 0.25 for f in method.headlines}}, {"step": 2, **{f.key: 0.5 for f in
                                                                                         method.headlines}}]
        figures = headline(name, log)
        assert {key for key in figures if key != "source"} == {f.name for f in method.headlines}, name
        assert {label for key, (label, _) in labels(name).items()} == {"loss", "lr", "grad", "tok/s"} | {
            f.label for f in method.headlines if f.label}, name
        assert replace(setup, method=name).sequences == method.sequences_per_row  # what ft plan multiplies by
        assert all(method_of({"rl": rl}) == name for rl in method.axolotl)
        assert (name in SECTIONS) == (method.section is not None)


NEW_METHOD = '''
from typing import ClassVar
from pydantic import Field
from ft.recipe import methods

class CpoSection(methods.MethodSection):
    CONFIG_FIELDS: ClassVar[dict[str, str]] = {"beta": "beta"}
    beta: float = Field(0.1, description="CPO beta.")

methods.METHODS["cpo"] = methods.Method(
    CpoSection, ("preference",), "trl.experimental.cpo:CPOConfig", ft_tokenizes=False,
    headlines=(methods.Headline("reward_accuracy", "rewards/accuracies", "acc"),), sequences_per_row=2,
    axolotl=("simpo",))
methods.METHOD_SECTIONS["cpo"] = CpoSection

from ft.importers.axolotl import SECTIONS
from ft.importers.axolotl_method import method_of
from ft.outputs.summary import headline
from ft.plan.memory import activations, setup_for
from ft.plan.shape import read_shape
from ft.recipe import load_recipe
from ft.trainers.console import format_log
from dataclasses import replace

log = [{"step": 1, "eval_rewards/accuracies": 0.5}, {"step": 9, "eval_rewards/accuracies": 0.75}]
assert headline("cpo", log)["reward_accuracy"]["last"] == 0.75, headline("cpo", log)
assert format_log({"loss": 0.5, "rewards/accuracies": 0.75}, 1, 9, method="cpo").endswith("acc 0.750")
recipe = load_recipe("recipes/quickstart.yaml").recipe
shape = read_shape(recipe)
sft = setup_for(recipe, shape)
params = []
assert activations(shape, replace(sft, method="cpo"), params).saved == 2 * activations(shape, sft, params).saved
assert method_of({"rl": "simpo"}) == "cpo"
assert "cpo" in SECTIONS
print("ok")
'''


@pytest.mark.slow
def test_a_new_method_entry_reaches_every_table():
    """A method added to METHODS alone (before the consumers are imported) is known to summary.json's headline, the
    console line, ft plan and the importer, with no other file edited."""
    result = subprocess.run([sys.executable, "-c", NEW_METHOD], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


@pytest.mark.slow
def test_a_method_with_a_teacher_model_reaches_the_hub_check_plan_smoke_and_its_trainer(tmp_path):
    """TRL's GKD shape, a section with a teacher model declared through ``MethodSection.models`` and three TRL fields,
    registered from outside ft with its trainer module (``Method.trainer``): the Hub check asks for the teacher,
    ``ft plan`` counts its weights at its own shape, the smoke run puts the tiny model in its place and trains, and
    TRL's GKDTrainer is built with it, with no file of ft edited (``tests/new_method_gkd.py``)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "new_method_gkd.py"), str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_each_method_has_its_trainer_module(name):
    path = SRC / "trainers" / f"{name}.py"
    tree = ast.parse(path.read_text())
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {"config", "build"} <= functions
