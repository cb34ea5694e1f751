"""Careless and hostile YAML (issue 43): reading a recipe is bounded in time and memory whatever the file holds, and
every file ft cannot read is one paragraph (exit 2) naming its file and line, never a traceback.

The findings, each reproduced: an alias bomb (reading grew to 12 GB), an alias inside its own anchor (a
RecursionError), a ``!!python`` tag (a ConstructorError traceback), a file that is not UTF-8 (UnicodeDecodeError), a
directory (reported as missing), a key written twice (the last silently won), a file that is not a recipe echoed line
by line. Then a fuzz of generated hostile YAML through ``load_recipe`` and a few through the real ``ft validate``.
"""

from __future__ import annotations

import random
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_ft, tiny_sft

from ft.recipe import RecipeError, load_recipe
from ft.recipe.resolved import resolved_recipe_yaml
from ft.recipe.yaml_io import MAX_VALUES

SHIPPED = sorted((ROOT / "recipes").glob("*.yaml"))


def bomb(levels: int = 9, width: int = 9, indent: str = "") -> str:
    """The billion-laughs YAML: anchor ``a`` holds ``width`` scalars, each next anchor ``width`` aliases of the one
    before, ``levels`` anchors (a..i for nine): 354 bytes that expand to width**levels values."""
    names = [chr(ord("a") + i) for i in range(levels)]
    lines = [f"{indent}a: &a [{', '.join(['x'] * width)}]"]
    lines += [f"{indent}{cur}: &{cur} [{', '.join([f'*{prev}'] * width)}]" for prev, cur in pairwise(names)]
    return "\n".join(lines) + "\n"


def first_over_the_bound(width: int = 9) -> str:
    """The anchor of ``bomb()`` whose expansion first passes ``MAX_VALUES``: the one the error must name."""
    size, name = width + 1, "a"
    while size <= MAX_VALUES:
        size, name = 1 + width * size, chr(ord(name) + 1)
    return name


def refused(path: Path, overrides: tuple[str, ...] = ()) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, list(overrides))
    return info.value


def limited(*args: str, cwd: Path, memory: int = 1 << 30) -> tuple[subprocess.CompletedProcess, float]:
    """The real ``ft`` run under an address-space limit (``RLIMIT_AS``, 1 GiB by default), and its wall time."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ft", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          preexec_fn=limit)
    return done, time.monotonic() - start


# --- 1. aliases: bounded whatever they expand to --------------------------------------------------------------------


def test_an_alias_bomb_is_refused_naming_its_anchor_and_line(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb())
    start = time.monotonic()
    error = refused(path)
    assert time.monotonic() - start < 5
    (problem,) = error.problems
    name = first_over_the_bound()
    line = ord(name) - ord("a") + 1
    assert f"anchor &{name} (line {line})" in problem.message and "alias" in problem.message
    assert problem.where == f"{path}:{line}"


def test_an_alias_bomb_under_free_form_kwargs_is_refused(tmp_path):
    """``scheduler.kwargs`` takes any mapping: the bound is the reader's, not the schema's."""
    path = tmp_path / "bomb.yaml"
    path.write_text(yaml.safe_dump(tiny_sft(tmp_path / "out")) + "scheduler:\n  kwargs:\n" + bomb(indent="    "))
    (problem,) = refused(path).problems
    assert problem.path == f"scheduler.kwargs.{first_over_the_bound()}" and "alias" in problem.message


@pytest.mark.parametrize("text", [
    "scheduler:\n  kwargs: &k {self: *k}\n",  # a mapping that contains itself
    "scheduler:\n  kwargs: &k\n    inner: [1, {deeper: *k}]\n",  # through a list
    "scheduler:\n  kwargs: &k\n    <<: *k\n",  # a merge of itself
])
def test_an_alias_inside_its_own_anchor_is_refused_at_its_line(tmp_path, text):
    path = tmp_path / "self.yaml"
    path.write_text(text)
    (problem,) = refused(path).problems
    alias_line = next(i for i, line in enumerate(text.splitlines(), 1) if "*k" in line)
    assert problem.where == f"{path}:{alias_line}"
    assert "*k" in problem.message and "&k (line 2)" in problem.message


def test_locations_are_recorded_for_the_written_nodes_only(tmp_path):
    """A recipe whose aliases expand to thousands of values (within the bound) is located by what was written: the
    old walk recorded a location for every expanded path."""
    kwargs = bomb(levels=4, indent="    ")  # 9**4 values under kwargs, 4 lines written
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_sft(tmp_path / "out")) + "scheduler:\n  type: linear\n  kwargs:\n" + kwargs)
    loaded = load_recipe(path)
    assert len(loaded.locations) < 100  # the written keys and items (the old walk: 7,400)
    assert len(loaded.recipe.scheduler.kwargs["d"]) == 9 and len(loaded.recipe.scheduler.kwargs["d"][0][0]) == 9


def test_aliased_values_are_copies_that_set_changes_one_at_a_time(tmp_path):
    """An alias gives the same value, not the same object: ``--set`` on one leaves the other as written."""
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_sft(tmp_path / "out")) +
                    "scheduler:\n  type: linear\n  kwargs: {a: &x [1, 2], b: *x}\n")
    kwargs = load_recipe(path, ["scheduler.kwargs.a.0=5"]).recipe.scheduler.kwargs
    assert kwargs == {"a": [5, 2], "b": [1, 2]}


def test_deep_nesting_is_refused_at_its_line(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("method: sft\nscheduler:\n  kwargs:\n    k: " + "[" * 200 + "]" * 200 + "\n")
    (problem,) = refused(path).problems
    assert problem.where == f"{path}:4" and "levels deep" in problem.message


def test_the_nine_level_bomb_through_ft_validate_stays_small_and_fast(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb())
    done, took = limited("validate", str(path), cwd=tmp_path)
    assert done.returncode == 2 and took < 5, (done.returncode, took, done.stderr[-2000:])
    assert f"anchor &{first_over_the_bound()}" in done.stderr and "Traceback" not in done.stderr


# --- 2. what cannot be read is exit 2 with its line -----------------------------------------------------------------


def test_a_python_tag_is_refused_at_its_line_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "tag.yaml"
    path.write_text(f"method: sft\nmodel: !!python/object/apply:os.system ['touch {marker}']\n")
    (problem,) = refused(path).problems
    assert problem.where == f"{path}:2" and problem.path == "model"
    assert "!!python/object/apply:os.system" in problem.message and "remove the tag" in problem.message
    assert not marker.exists()


@pytest.mark.parametrize(("content", "line", "column", "byte"), [
    (b"method: sft\nmodel:\n  name: caf\xe9\n", 3, 12, "0xe9"),  # Latin-1
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", 1, 1, "0x89"),  # a binary file
])
def test_a_file_that_is_not_utf8_is_refused_at_the_byte(tmp_path, content, line, column, byte):
    path = tmp_path / "r.yaml"
    path.write_bytes(content)
    (problem,) = refused(path).problems
    assert problem.where == f"{path}:{line}"
    assert f"byte {byte} at line {line}, column {column}" in problem.message and "UTF-8" in problem.message


def test_control_characters_are_refused_with_their_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("method: sft\nrun: a\x01b\n")
    (problem,) = refused(path).problems
    assert problem.where == f"{path}:2" and "#x0001" in problem.message


def test_a_directory_is_not_a_recipe(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    (problem,) = refused(tmp_path / "dir.yaml").problems
    assert "is a directory" in problem.message and "does not exist" not in problem.message
    child = tmp_path / "child.yaml"
    child.write_text("train: {max_steps: 3}\nextends: dir.yaml\n")
    (problem,) = refused(child).problems
    assert problem.path == "extends" and problem.where == f"{child}:2"
    assert "'dir.yaml'" in problem.message and "is a directory" in problem.message


@pytest.mark.parametrize("content", [
    b"method: sft\nmodel: !!python/object/apply:os.system ['true']\n",
    b"method: sft\nmodel:\n  name: caf\xe9\n",
    bytes(range(256)) * 4,
    b"scheduler:\n  kwargs: &k {self: *k}\n",
    b"train: {max_steps: 1}\ntrain: {max_steps: 2}\n",
    None,  # a directory
])
def test_ft_validate_says_one_paragraph_and_exits_2(tmp_path, content):
    path = tmp_path / "r.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    done = run_ft("validate", str(path), cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.startswith(f"{path}: 1 problem in the recipe:\n  - ")
    assert content is not None or "is a directory" in done.stderr  # not "does not exist"


# --- 3. a key written twice ------------------------------------------------------------------------------------------


def test_a_key_written_twice_names_both_lines(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_sft(tmp_path / "out")) + "scheduler:\n  warmup_steps: 1\n  warmup_steps: 2\n")
    lines = path.read_text().splitlines()
    second = len(lines)
    (problem,) = refused(path).problems
    assert problem.path == "scheduler.warmup_steps" and problem.where == f"{path}:{second}"
    assert f"at lines {second - 1} and {second}" in problem.message


def test_a_second_section_does_not_drop_the_first(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_sft(tmp_path / "out"), sort_keys=False) + "train:\n  max_steps: 5\n")
    lines = path.read_text().splitlines()
    first, second = lines.index("train:") + 1, len(lines) - 1
    (problem,) = refused(path).problems
    assert problem.path == "train" and problem.where == f"{path}:{second}"
    assert f"at lines {first} and {second}" in problem.message


@pytest.mark.parametrize(("text", "key", "lines"), [
    ("data:\n  train:\n  - path: a.jsonl\n    format: chat\n    path: b.jsonl\n", "data.train.0.path", (3, 5)),
    ("scheduler: {kwargs: {a: 1, b: 2, a: 3}}\n", "scheduler.kwargs.a", (1, 1)),
    ("scheduler:\n  kwargs:\n    1: x\n    01: y\n", "scheduler.kwargs.1", (3, 4)),  # one key as the dict holds it
])
def test_a_key_written_twice_at_any_depth(tmp_path, text, key, lines):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    problems = [p for p in refused(path).problems if p.path == key]
    assert problems and problems[0].where == f"{path}:{lines[1]}", refused(path)
    said = f"twice on line {lines[0]}" if lines[0] == lines[1] else f"at lines {lines[0]} and {lines[1]}"
    assert said in problems[0].message


def test_a_merge_key_overridden_by_a_written_key_is_not_a_duplicate(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_sft(tmp_path / "out")) +
                    "scheduler:\n  type: linear\n  kwargs:\n    base: &b {x: 1, y: 2}\n    mine: {<<: *b, y: 3}\n")
    assert load_recipe(path).recipe.scheduler.kwargs["mine"] == {"x": 1, "y": 3}


def test_set_with_a_value_that_writes_a_key_twice_names_the_flag(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_sft(tmp_path / "out")))
    (problem,) = refused(path, ("scheduler.kwargs={a: 1, a: 2}",)).problems
    assert problem.where == "--set scheduler.kwargs={a: 1, a: 2}" and "twice" in problem.message


@pytest.mark.parametrize("recipe", SHIPPED, ids=[p.name for p in SHIPPED])
def test_the_shipped_recipes_still_load(recipe):
    assert load_recipe(recipe).recipe.method


# --- 4. what a message shows ----------------------------------------------------------------------------------------

SHADOW = "root:$6$SALTsalt$HASHhashHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n"


@pytest.mark.parametrize(("content", "says", "line"), [
    (SHADOW, "is not a recipe", "child.yaml:2"),  # blamed on the extends: line
    (SHADOW.splitlines()[0] + "\n" + SHADOW, "is written twice, at lines 1 and 2", "shadow:2"),  # at the file's line
])
def test_extending_a_file_that_is_not_a_recipe_never_echoes_it(tmp_path, content, says, line):
    """A password file read as YAML is a mapping of its lines (``root:...:::`` ends in ``:``): each line was shown
    back as an unknown key (or, a line written twice, as the key written twice)."""
    shadow = tmp_path / "shadow"
    shadow.write_text(content)
    child = tmp_path / "child.yaml"
    child.write_text(f"method: sft\nextends: {shadow}\n")
    error = refused(child)
    text = str(error)
    assert "SALT" not in text and "HASH" not in text and "daemon" not in text
    (problem,) = error.problems
    assert problem.where == f"{tmp_path / line}" and says in problem.message
    done = run_ft("validate", str(shadow), cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "SALT" not in done.stderr and says in done.stderr


def test_a_file_that_is_not_a_mapping_is_named_by_line_and_column_without_its_text(tmp_path):
    passwd = tmp_path / "passwd"
    passwd.write_text("\n  root:x:0:0:SECRETNAME:/root:/bin/bash\n")
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {passwd}\n")
    (problem,) = refused(child).problems
    assert problem.where == f"{child}:1" and "SECRETNAME" not in problem.message
    assert "is not a YAML mapping" in problem.message and "line 2, column 3" in problem.message


@pytest.mark.parametrize(("extra", "secret"), [
    ("train: {run_name: {api_key: sk-AAAA}}", "sk-AAAA"),  # a mapping where a string goes
    ("train: {report_to: {api_key: sk-BBBB}}", "sk-BBBB"),
    ("data: {train: {path: {hf_token: sk-CCCC}}}", "sk-CCCC"),
])
def test_values_nested_under_keys_no_schema_knows_are_not_echoed(tmp_path, extra, secret):
    path = tmp_path / "r.yaml"
    path.write_text(f"extends: {ROOT / 'recipes' / 'quickstart.yaml'}\n{extra}\n")
    text = str(refused(path))
    assert secret not in text and "Input should be" in text


def test_a_huge_value_is_shown_cut_short(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_sft(tmp_path / "out")) +
                    f"scheduler: {{warmup_steps: '{'9' * 500_000}'}}\n")
    assert len(str(refused(path))) < 2_000


def test_a_mapping_under_a_credential_key_is_redacted_in_the_resolved_recipe(tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    recipe["callbacks"] = [{"cls": "my_callbacks:Logger", "kwargs": {"api_key": {"value": "sk-DDDD"}}}]
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    text = resolved_recipe_yaml(load_recipe(path).recipe)
    assert "sk-DDDD" not in text and "<redacted>" in text


# --- 5. the fuzz ----------------------------------------------------------------------------------------------------

TAGS = ["!!python/object/apply:os.system ['true']", "!!python/name:os.system", "!!python/object:object {}",
        "!local x", "!!binary aGVsbG8=", "!!set {a, b}", "!!omap [a: 1]", "!!timestamp 2024-13-45", "!!int x",
        "!!float x", "!!bool maybe", "!<tag:yaml.org,2002:str> text", "!!str 5", "!!map {a: 1}", "!!seq [1]",
        "!!null ''", "!!pairs [a: 1]", "2024-02-30"]
ALPHABET = ":-[]{}&*!|>'\"#%@`,?\t\n \\abcxyz019."


@dataclass
class Case:
    label: str
    content: bytes
    overrides: tuple[str, ...] = ()


def hostile_cases(rng: random.Random, count: int, texts: list[str]):
    makers = [_bomb, _recursive, _tagged, _deep, _huge, _bad_bytes, _duplicate, _mutated, _mutated, _odd]
    for i in range(count):
        maker = makers[i % len(makers)]
        yield maker(rng, rng.choice(texts))


def _bomb(rng, text):
    levels, width = rng.randint(2, 12), rng.randint(2, 12)
    where = rng.choice(["top", "kwargs", "train", "merge"])
    if where == "merge":  # merge keys that repeat a mapping
        lines = ["  m0: &m0 {k: v}"] + [f"  m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * width)}], k{i}: v}}"
                                          for i in range(1, levels)]
        return Case(f"merge bomb {levels}x{width}", (text + "scheduler:\n  kwargs:\n" + "\n".join(lines)).encode())
    body = bomb(levels, width, "    " if where == "kwargs" else "  " if where == "train" else "")
    head = {"top": "", "kwargs": "scheduler:\n  kwargs:\n", "train": "train:\n"}[where]
    if where == "top":
        return Case(f"bomb {levels}x{width} at the top", (text + body).encode())
    return Case(f"bomb {levels}x{width} under {where}", (_without(text, where) + head + body).encode())


def _without(text: str, section: str) -> str:
    """``text`` without its top-level ``section`` (the case writes its own: a second one is a duplicate key)."""
    top = {"kwargs": "scheduler", "train": "train"}[section]
    keep, skipping = [], False
    for line in text.splitlines():
        if line.startswith(f"{top}:"):
            skipping = True
            continue
        if skipping and (line.startswith((" ", "\t")) or not line.strip()):
            continue
        skipping = False
        keep.append(line)
    return "\n".join(keep) + "\n"


def _recursive(rng, text):
    shapes = ["&r {self: *r}", "&r [1, *r]", "&r {a: [{b: *r}]}", "&r {<<: *r}", "&r\n    x: *r", "&r {a: &s [*r]}",
              "&r {a: &s {b: *s}}"]
    shape = rng.choice(shapes)
    return Case(f"recursive {shape!r}", (_without(text, "kwargs") + f"scheduler:\n  kwargs: {shape}\n").encode())


def _tagged(rng, text):
    lines = text.splitlines()
    i = rng.randrange(len(lines))
    tag = rng.choice(TAGS)
    if ": " in lines[i]:
        key, _, _ = lines[i].partition(": ")
        lines[i] = f"{key}: {tag}"
    else:
        lines.insert(i, f"zz: {tag}")
    return Case(f"tag {tag!r} at line {i + 1}", "\n".join(lines).encode())


def _deep(rng, text):
    depth = rng.choice([10, 60, 64, 65, 100, 1000, 20000])
    style = rng.choice(["flow list", "flow map", "block map", "block list"])
    if style == "flow list":
        value = "[" * depth + "1" + "]" * depth
    elif style == "flow map":
        value = "{a: " * depth + "1" + "}" * depth
    elif style == "block map":
        levels = min(depth, 3000)
        value = "\n" + "".join("    " + "  " * i + "a:\n" for i in range(levels)) + "    " + "  " * levels + "1"
    else:
        value = "\n" + "".join("    " + "  " * i + "-\n" for i in range(min(depth, 3000)))
    text = _without(text, "kwargs") + f"scheduler:\n  kwargs:\n    k: {value}\n"
    return Case(f"{style} {depth} deep", text.encode())


def _huge(rng, text):
    size = rng.choice([10_000, 200_000, 1_100_000])
    kind = rng.choice(["value", "key", "known key", "comment"])
    blob = rng.choice("xy9") * size
    extra = {"value": f"zz: {blob}\n", "key": f"{blob}: 1\n", "known key": f"train: {{run_name: {blob}}}\n",
             "comment": f"# {blob}\n"}[kind]
    base = _without(text, "train") if kind == "known key" else text
    return Case(f"huge {kind} of {size}", (base + extra).encode())


def _bad_bytes(rng, text):
    data = bytearray(text.encode())
    kind = rng.choice(["random bytes", "latin-1", "nul", "bom", "binary", "utf-16"])
    if kind == "random bytes":
        for _ in range(rng.randint(1, 5)):
            data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
    elif kind == "latin-1":
        data = bytearray(text.replace("e", "\xe9", 1).encode("latin-1", "replace"))
    elif kind == "nul":
        data.insert(rng.randrange(len(data) + 1), 0)
    elif kind == "bom":
        data = bytearray(b"\xef\xbb\xbf") + data
    elif kind == "binary":
        data = bytearray(rng.randbytes(rng.randint(1, 4000)))
    else:
        data = bytearray(text.encode("utf-16"))
    return Case(kind, bytes(data))


def _duplicate(rng, text):
    lines = text.splitlines()
    candidates = [i for i, line in enumerate(lines) if re.match(r"^\s*[\w-]+:", line)]
    i = rng.choice(candidates)
    lines.insert(i + 1, lines[i] if rng.random() < 0.5 else re.sub(r":.*", ": 1", lines[i]))
    return Case(f"line {i + 1} written twice", "\n".join(lines).encode())


def _mutated(rng, text):
    chars = list(text)
    for _ in range(rng.randint(1, 8)):
        op = rng.choice(["insert", "delete", "replace", "swap lines", "indent"])
        if op == "insert":
            chars.insert(rng.randrange(len(chars) + 1), rng.choice(ALPHABET))
        elif op == "delete" and chars:
            del chars[rng.randrange(len(chars))]
        elif op == "replace" and chars:
            chars[rng.randrange(len(chars))] = rng.choice(ALPHABET)
        else:
            lines = "".join(chars).splitlines()
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            if op == "swap lines":
                lines[i], lines[j] = lines[j], lines[i]
            else:
                lines[i] = " " * rng.randint(1, 4) + lines[i]
            chars = list("\n".join(lines) + "\n")
    return Case("mutated", "".join(chars).encode())


def _odd(rng, text):
    cases = [("empty", b"", ()), ("null", b"~\n", ()), ("a list", b"- a\n- b\n", ()), ("a scalar", b"just text\n", ()),
             ("two documents", (text + "---\nmethod: sft\n").encode(), ()),
             ("undefined alias", (text + "zz: *nowhere\n").encode(), ()),
             ("anchor twice", (text + "zz: &q 1\nzy: &q 2\n").encode(), ()),
             ("complex key", (text + "? [a, b]\n: 1\n").encode(), ()),
             ("extends itself", b"extends: case.yaml\n", ()),
             ("extends a directory", b"extends: .\n", ()),
             ("extends nothing", b"extends: ''\n", ()),
             ("extends a number", b"extends: 5\n", ()),
             ("extends a NUL", b"extends: \"a\\0b\"\n", ()),
             ("set bomb", text.encode(), ("scheduler.kwargs.x=[&a [1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a],"
                                          " &c [*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c],"
                                          " &e [*d,*d,*d,*d,*d,*d,*d,*d,*d], [*e,*e,*e,*e,*e,*e,*e,*e,*e]]",)),
             ("set tag", text.encode(), ("model.name=!!python/object/apply:os.system ['true']",)),
             ("set recursive", text.encode(), ("scheduler.kwargs=&k {a: *k}",)),
             ("set nothing", text.encode(), ("nosuch.key=", "=1", "train.", "data.train.9.path=x")),
             ("set deep", text.encode(), ("scheduler.kwargs.x=" + "[" * 3000 + "]" * 3000,))]
    label, content, overrides = rng.choice(cases)
    return Case(label, content, overrides)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    """A folder laid out like the repository (assets/ and data/ linked), so the shipped recipes' relative paths and
    their ``extends:`` resolve from a copy in its recipes/."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "recipes").mkdir()
    for name in ("assets", "data"):
        (root / name).symlink_to(ROOT / name)
    for recipe in SHIPPED:
        (root / "recipes" / recipe.name).write_text(recipe.read_text())
    return root / "recipes"


def test_hostile_yaml_is_a_recipe_error_or_a_recipe_in_bounded_time(fuzz_dir):
    """500 generated inputs through ``load_recipe``: each ends as a Recipe or a RecipeError (exit 2) whose message
    is short, never another exception, each in well under the time the bomb took."""
    texts = [recipe.read_text() for recipe in SHIPPED]
    outcomes = {"loaded": 0, "refused": 0}
    slowest = (0.0, "")
    started = time.monotonic()
    for case in hostile_cases(random.Random(43), 500, texts):
        path = fuzz_dir / "case.yaml"
        path.write_bytes(case.content)
        start = time.monotonic()
        try:
            load_recipe(path, list(case.overrides))
            outcomes["loaded"] += 1
        except RecipeError as exc:
            outcomes["refused"] += 1
            assert exc.problems and len(exc.render()) < 100_000, (case.label, exc.render()[:2000])
        except Exception as exc:  # noqa: BLE001 - the property under test: nothing else escapes
            pytest.fail(f"{case.label}: {type(exc).__name__}: {exc}\n{case.content[:1000]!r} {case.overrides}")
        took = time.monotonic() - start
        slowest = max(slowest, (took, case.label))
        assert took < 5, (case.label, took)
    assert time.monotonic() - started < 60, slowest
    assert outcomes["loaded"] > 10 and outcomes["refused"] > 300, outcomes  # the generator makes both


def test_hostile_yaml_through_the_real_cli(fuzz_dir):
    """A few generated inputs through ``ft validate`` itself: exit 0 or 2, one paragraph, no traceback."""
    texts = [recipe.read_text() for recipe in SHIPPED]
    cases = [maker(random.Random(seed), texts[seed % len(texts)]) for seed, maker in enumerate(
        [_bomb, _recursive, _tagged, _deep, _huge, _bad_bytes, _duplicate, _mutated])]
    for case in cases:
        path = fuzz_dir / "cli-case.yaml"
        path.write_bytes(case.content)
        sets = [arg for item in case.overrides for arg in ("--set", item)]
        done, took = limited("validate", str(path), *sets, cwd=fuzz_dir)
        assert done.returncode in (0, 2) and "Traceback" not in done.stderr, (case.label, done.stderr[-2000:])
        assert took < 10, (case.label, took)
