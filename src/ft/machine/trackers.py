"""Experiment trackers (``train.report_to``): ft's default, where each one writes, and the packages they need.

``train.report_to``, ``run_name``, ``project``, ``logging_steps``, ``logging_strategy``, ``log_level``,
``log_level_replica`` and ``log_on_each_node`` are TrainingArguments fields: ``train:`` passes them through verbatim.
ft adds three things (to the transformers and TRL releases docs/architecture.md names):

- **The default** (``defaults``, merged into ``hardware.device_defaults``, so a value the recipe writes wins):
  ``report_to: [tensorboard]`` where the ``tensorboard`` package imports, else transformers' own ``none``.
  TensorBoard writes small local event files and nothing leaves the machine; a smoke run reports to none.
- **Where they write** (``writing_under``, around the trainer's construction): inside the output directory.
  transformers 5 has no ``logging_dir`` argument any more: its ``TensorBoardCallback`` reads the environment variable
  ``TENSORBOARD_LOGGING_DIR`` when it is built, and otherwise writes to ``<output_dir>/runs/<date>_<host>`` (a new
  folder per start). ft sets it to ``<output_dir>/tb`` (one folder: a resumed run adds an event file next to the
  first ones, and TensorBoard shows one run). trackio keeps its local store (``<project>.db``, SQLite) in
  ``TRACKIO_DIR``, read once when ``trackio`` is first imported, otherwise ``$HF_HOME/trackio``: ft sets it to
  ``<output_dir>/trackio``. Either variable set by the user wins. (trackio is imported by transformers' callback, and
  by TRL's GRPO module as soon as it is installed; a program that imported trackio before ``ft.run.train`` keeps the
  directory it had then.) wandb keeps its own directory (``WANDB_DIR``) and account.
- **The packages** (``problems``, in ``hardware.check_hardware``): a tracker the recipe names that is not installed
  stops ``ft train`` before any model loads, naming ``train.report_to`` and the extra that installs it.

Imports nothing heavy: read by the machine checks before torch loads the model.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..recipe import Problem, Recipe
from ..recipe.optimizers import Package

TRACKERS: dict[str, Package] = {
    "tensorboard": Package("tensorboard", "ft[track]"),
    "trackio": Package("trackio", "ft[track]"),
    "wandb": Package("wandb", "ft[wandb]"),
}
# each tracker's environment variable for its local directory, and ft's folder for it under output_dir
LOCAL_DIRS = {"tensorboard": ("TENSORBOARD_LOGGING_DIR", "tb"), "trackio": ("TRACKIO_DIR", "trackio")}


def installed(name: str) -> bool:
    if name == "tensorboard":  # transformers' TensorBoardCallback takes tensorboardX where torch's writer cannot load
        return any(importlib.util.find_spec(module) is not None for module in ("tensorboard", "tensorboardX"))
    return importlib.util.find_spec(TRACKERS[name].module) is not None


def defaults(recipe: Recipe) -> dict:
    """``report_to: [tensorboard]`` where tensorboard is installed and the recipe does not say; else nothing
    (transformers' default, none)."""
    if "report_to" in recipe.train_args or importlib.util.find_spec("tensorboard") is None:
        return {}
    return {"report_to": ["tensorboard"]}


def named(report_to) -> list[str]:
    """The trackers ``report_to`` names (a string or a list; ``none`` and ``all`` are transformers')."""
    if report_to is None:
        return []
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    return [name for name in names if name not in ("none", "all")]


def problems(recipe: Recipe) -> list[Problem]:
    """Trackers the recipe names that are not installed here."""
    found = []
    for name in named(recipe.train_args.get("report_to")):
        if name in TRACKERS and not installed(name):
            extra = TRACKERS[name].install
            found.append(Problem("train.report_to", f"`{name}` needs the `{name}` package, which is not installed; run "
                                 f"`pip install '{extra}'` (or `pip install {name}`), or remove `{name}` from "
                                 "`train.report_to`."))
    return found


@contextmanager
def writing_under(output_dir: str | Path) -> Iterator[None]:
    """While the trainer's module is imported and the trainer built: TensorBoard and trackio write under
    ``output_dir`` (``LOCAL_DIRS``) unless their environment variable is set already. Each variable is read by its
    tracker alone, so both are set whichever trackers the run reports to; they are removed again afterwards."""
    added = []
    for variable, folder in LOCAL_DIRS.values():
        if not os.environ.get(variable):
            os.environ[variable] = str(Path(output_dir).expanduser() / folder)
            added.append(variable)
    try:
        yield
    finally:
        for variable in added:
            os.environ.pop(variable, None)
