"""``ft import axolotl CONFIG.yml``: an Axolotl config → an ft recipe, with an account of every key.

The config is read as Axolotl reads it (PyYAML, YAML 1.1). Empty keys are recorded as ignored; then each handler
(``axolotl_model``, ``axolotl_vision``, ``axolotl_data``, ``axolotl_train``, ``axolotl_method``,
``axolotl_distributed``, ``axolotl_other``) maps the keys it owns, knowing the method (``rl``) and what the rows hold
(``processor_type``: text, images or audio), both decided first; Axolotl's defaults that differ from ft's are
written out for keys the config leaves unset; every key or nested key still unaccounted for is recorded as not
carried. The recipe is then validated with ft's own loader (``ledger.check``) and written with a header naming the
source and a trailer listing what was not carried and why. Imports nothing heavy: no torch, transformers or datasets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FtError
from ..recipe import Problem, RecipeError
from ..recipe.methods import METHOD_SECTIONS
from ..recipe.yaml_io import YamlSyntaxError, load_yaml
from . import (  # noqa: F401  (each registers its handlers)
    axolotl_data,
    axolotl_distributed,
    axolotl_method,
    axolotl_model,
    axolotl_other,
    axolotl_train,
    axolotl_vision,
)
from .axolotl_keys import EXPECTED, HANDLERS, Ctx, misfit
from .axolotl_method import method_of
from .ledger import CARRIED, IGNORED, NOT_CARRIED, Entry, Ledger, Verdict, check, trailer

# the sections of a written recipe, in order (every method's section, as METHODS lists them)
SECTIONS = ("method", "model", "adapter", "data", "optimizer", "scheduler", *METHOD_SECTIONS, "distributed",
            "callbacks", "train")
ORDER = (*SECTIONS, "model.name")  # and the model's name first in its section, whichever handler wrote it first


class ConfigError(FtError, prefix="ft import axolotl: "):
    """The Axolotl config cannot be read as one (exit 2): missing, not YAML, not a mapping, not a training config."""


@dataclass
class Imported:
    text: str  # the recipe file: header comment, YAML, trailer comment
    ledger: Ledger
    verdict: Verdict
    out_of_scope: bool = False  # refused for what ft does not train at all (an audio model), not for a key
    modality: str = "text"  # what the config's rows hold: text, vision or audio (``axolotl_vision.modality_of``)

    @property
    def valid(self) -> bool:
        return not self.verdict.errors


def read_config(path: Path) -> dict:
    """The config as Axolotl reads it (YAML 1.1, as ``yaml.safe_load``), through ft's bounded reader
    (``recipe.yaml_io``: an alias bomb, an alias inside its own anchor, a key written twice, a ``!!python`` tag are
    refused at their line, in time and memory that the file's size bounds), or ConfigError with one paragraph saying
    why not."""
    try:
        config, _ = load_yaml(path, yaml11=True)
    except YamlSyntaxError as exc:
        said = [_said(problem, path) for problem in exc.problems]
        raise ConfigError(said[0] if len(said) == 1 else "\n".join(["the config cannot be read:", *said])) from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: an Axolotl config is a mapping of keys (base_model:, datasets:, …); this file "
                          f"holds {type(config).__name__ if config is not None else 'nothing'}.")
    if "base_model" not in config and "datasets" not in config:
        raise ConfigError(f"{path}: not an Axolotl training config: it has neither `base_model` nor `datasets` (a "
                          "launcher's config, such as Axolotl's cloud/modal.yaml, is not a training config).")
    return {str(key): value for key, value in config.items()}


def _said(problem: Problem, path: Path) -> str:
    """One problem reading the config as a line: the file as a whole (missing, a directory) cannot be read; any other
    is at its line, with its key."""
    if problem.where == str(path):
        return f"{path}: cannot read it ({problem.message.rstrip('.')})."
    key = f"{problem.path}: " if problem.path else ""
    return f"{problem.where}: {key}{problem.message.rstrip('.')}."


def empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def map_config(config: dict) -> Ctx:
    """The recipe draft and the ledger for an Axolotl config (no validation yet)."""
    ctx = Ctx({key: value for key, value in config.items() if not empty(value) and not misfit(EXPECTED, key, value)})
    for key, value in config.items():
        if empty(value):
            ctx.ledger.record(Entry(key, value, IGNORED, why="empty: Axolotl's default applies"))
        elif misfit(EXPECTED, key, value):
            ctx.ledger.record(Entry(key, value, NOT_CARRIED, why=misfit(EXPECTED, key, value)))
    ctx.method = method_of(ctx.cfg)
    ctx.modality = axolotl_vision.modality_of(ctx.cfg)
    ctx.draft.set("method", ctx.method)
    for handler in HANDLERS:
        if any(ctx.has(key) for key in handler.keys):
            handler.run(ctx)
    axolotl_train.write_defaults(ctx)
    for key, value in ctx.cfg.items():
        _account(ctx, key, value)
    return ctx


def _account(ctx: Ctx, key: str, value: Any) -> None:
    """Record ``key`` (and whatever inside it no handler recorded) as not carried: nothing is dropped silently."""
    ledger = ctx.ledger
    if ledger.seen(key):
        return
    if not any(name.startswith(key + ".") for name in ledger.entries):
        if value is False:
            ledger.record(Entry(key, value, IGNORED, why="false: switches off a feature ft does not have"))
        else:
            ledger.record(Entry(key, value, NOT_CARRIED, why=axolotl_other.reason(key.split(".")[-1])))
        return
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for child, inner in children:
        _account(ctx, f"{key}.{child}", inner)


def import_axolotl(path: Path, out: Path | None = None) -> Imported:
    """Import the Axolotl config at ``path`` into a recipe to be written at ``out`` (None: stdout, whose relative
    paths are read from the working directory). Raises ConfigError when the config cannot be read."""
    ctx = map_config(read_config(path))
    base_dir = (out.parent if out is not None else Path(".")).resolve()
    size = len(_header(path, ctx))
    verdict = check(ctx.draft, ctx.ledger, base_dir, str(out or "<stdout>"), ORDER, header_lines=size)
    if ctx.refusals:  # what ft cannot train at all, ahead of what validation found
        errors = [*ctx.refusals, *verdict.errors]
        verdict = Verdict(verdict.text, errors, verdict.warnings, str(RecipeError(errors, str(out or "<stdout>"))))
    refused = [f"# ft does not accept this recipe yet: {p.render()}" for p in verdict.errors] + [
        "# Fix it by hand (`ft validate` checks it again)."] if verdict.errors else []
    lines = [*_header(path, ctx), verdict.text.rstrip("\n"), *([""] + refused if refused else []), *trailer(ctx.ledger)]
    return Imported("\n".join(lines) + "\n", ctx.ledger, verdict, out_of_scope=bool(ctx.refusals),
                    modality=ctx.modality)


def _header(path: Path, ctx: Ctx) -> list[str]:
    """The comment lines above the recipe (their number does not depend on validation: problems name lines)."""
    counts = ctx.ledger.counts()
    lines = [f"# Imported by `ft import axolotl` from the Axolotl config {path}.",
             f"# Keys: {counts[CARRIED]} carried, {counts[NOT_CARRIED]} not carried, {counts[IGNORED]} ignored (empty "
             "or switched off); the lists are at the end of this file."]
    rl = ctx.ledger.entries.get("rl")
    if rl is not None and rl.status == NOT_CARRIED:
        lines.append(f"# WARNING: rl: {rl.value} is not carried; this recipe trains method `{ctx.method}` instead.")
    return lines
