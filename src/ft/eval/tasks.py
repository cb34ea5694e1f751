"""What ``--tasks`` names, resolved into what lm-eval loads, and checked before any model loads.

A path ending in ``.yaml``/``.yml`` is a task file, read with lm-eval's own YAML loader (its ``include:`` and
``!function`` tags) and handed to lm-eval as the config it holds, its relative ``dataset_kwargs.data_files`` resolved
against the file's folder: lm-eval resolves them against the working directory, so a task file kept beside its data
(the shipped ``tasks/``) would work from one folder only. Anything else is a name in lm-eval's registry (its built-in
tasks, groups and tags); indexing the registry takes seconds (about 15k entries), so it is read only when a name is
given. Refused here, by name: a task file or name that does not exist (a name with lm-eval's closest ones), a task
file without a ``task:`` or whose local data file is missing, a registry task whose data is on the Hub while the Hub
is switched off (``HF_HUB_OFFLINE``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import FtError
from ..recipe.benchmarks import is_task_file
from ..recipe.errors import did_you_mean, first_line

MISSING = ("scoring benchmarks needs lm-evaluation-harness, which is not installed here; run "
           "`pip install 'ft[eval]'` (or `pip install lm-eval`).")
# datasets' builders that read local files: a task whose dataset_path is one of these (or a folder) needs no Hub
LOCAL_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "pandas"}


class TaskError(FtError):
    """A task that cannot be loaded or run here (exit code 2)."""


@dataclass(frozen=True)
class Tasks:
    """The tasks of one command or recipe: ``specs`` as lm-eval's ``TaskManager.load`` takes them (registry names,
    and task files' configs), ``shown`` what the user wrote for each, ``registry`` whether any is a name."""

    specs: tuple
    shown: tuple[str, ...]
    registry: bool

    def manager(self):
        """lm-eval's task manager: the built-in registry indexed only when a task is named from it."""
        from lm_eval.tasks import TaskManager

        return TaskManager(include_defaults=self.registry)


def require_lm_eval(key: str) -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise TaskError(f"{key}: {MISSING}") from None


def resolve(names: Sequence[str], base: Path, key: str) -> Tasks:
    """``names`` (task names and task files, files relative to ``base``) as lm-eval loads them; TaskError for a file
    that is missing or holds no task."""
    require_lm_eval(key)
    specs = [_task_file(base / spec if not Path(spec).expanduser().is_absolute() else Path(spec).expanduser(), spec,
                        key) if is_task_file(spec) else spec for spec in names]
    return Tasks(tuple(specs), tuple(names), any(isinstance(spec, str) for spec in specs))


def _task_file(path: Path, shown: str, key: str) -> dict:
    """A task file's config, its relative data files made absolute against its folder."""
    if not path.is_file():
        raise TaskError(f"{key}: {shown}: no such task file ({path}). Name a task YAML that exists, or a task of "
                        "lm-eval's registry by name (`lm-eval ls tasks` lists them).")
    from lm_eval.tasks._yaml_loader import load_yaml  # lm-eval's own reader: include: and !function, as it reads them

    try:
        config = load_yaml(path, resolve_func=True)
    except Exception as exc:  # noqa: BLE001 (YAML errors, a bad include or !function: one paragraph naming the file)
        raise TaskError(f"{key}: {shown}: lm-eval cannot read this task file: {first_line(exc)}. Fix the file "
                        "(docs/eval.md shows a complete one).") from None
    if not isinstance(config.get("task"), str):
        raise TaskError(f"{key}: {shown}: the file names no `task:` (one task per file; a group of tasks is named "
                        "by its group's name from a folder lm-eval indexes). Add `task: <name>`.")
    kwargs = config.get("dataset_kwargs") or {}
    if "data_files" in kwargs:
        files = _absolute(kwargs["data_files"], path.parent)
        config["dataset_kwargs"] = {**kwargs, "data_files": files}
        missing = [name for name in _local_files(files)  # a glob is datasets' to expand
                   if not any(c in name for c in "*?[") and not Path(name).is_file()]
        if missing:
            raise TaskError(f"{key}: {shown}: its data file {missing[0]} does not exist (`dataset_kwargs.data_files`, "
                            "read relative to the task file); point it at the file, or put the file there.")
    return config


def _local_files(files) -> list[str]:
    """The local paths among resolved ``data_files`` (URLs left out)."""
    if isinstance(files, dict):
        return [name for value in files.values() for name in _local_files(value)]
    if isinstance(files, (list, tuple)):
        return [name for value in files for name in _local_files(value)]
    return [] if "://" in str(files) else [str(files)]


def _absolute(files, folder: Path):
    """``data_files`` (a path, a list, or a split -> path(s) mapping) with each relative path made absolute against
    ``folder``; URLs and absolute paths kept."""
    if isinstance(files, dict):
        return {split: _absolute(value, folder) for split, value in files.items()}
    if isinstance(files, (list, tuple)):
        return [_absolute(value, folder) for value in files]
    text = str(files)
    if "://" in text or Path(text).expanduser().is_absolute():
        return text
    return str(folder / text)


def problems(tasks: Tasks, manager, key: str) -> list[str]:
    """What stops ``tasks`` here, each a sentence: a name lm-eval does not know (with its closest names), a task
    whose data is on the Hub while the Hub is switched off."""
    found = []
    offline = _offline()
    for spec, shown in zip(tasks.specs, tasks.shown, strict=True):
        if isinstance(spec, dict):
            path = spec.get("dataset_path")
            if offline and path and not _local(path):
                found.append(f"{key}: {shown}: its data is the Hub dataset `{path}` and the Hub is switched off here "
                             "(HF_HUB_OFFLINE is set); point the file at local files (`dataset_path: json` with "
                             "`dataset_kwargs: {data_files: ...}`), or unset HF_HUB_OFFLINE.")
            continue
        entry = manager.task_index.get(spec)
        if entry is None:
            matched = manager.match_tasks([spec]) if any(c in spec for c in "*?[") else []
            if not matched:
                close = did_you_mean(spec, manager.all_tasks)
                found.append(f"{key}: `{spec}` is not a task, group or tag lm-eval knows.{close} Name one of "
                             "lm-eval's (`lm-eval ls tasks`), or a task YAML file (ending in .yaml).")
            continue
        path = (entry.cfg or {}).get("dataset_path")
        if offline and (path is None or not _local(path)):
            where = f"the Hub dataset `{path}`" if path else "on the Hub (it is a group or tag of lm-eval's tasks)"
            found.append(f"{key}: `{spec}`: its data is {where} and the Hub is switched off here (HF_HUB_OFFLINE is "
                         "set), so it cannot be read. Unset HF_HUB_OFFLINE on a machine that reaches the Hub, or copy "
                         "the task's YAML, point it at local files (`dataset_path: json`, `dataset_kwargs: "
                         "{data_files: ...}`) and name that file.")
    return found


def check(tasks: Tasks, key: str):
    """lm-eval's task manager for ``tasks``, once ``problems`` found none (TaskError with every one otherwise)."""
    manager = tasks.manager()
    found = problems(tasks, manager, key)
    if found:
        raise TaskError("\n".join(found))
    return manager


def _local(dataset_path: str) -> bool:
    return dataset_path in LOCAL_BUILDERS or Path(dataset_path).expanduser().is_dir()


def _offline() -> bool:
    return any(os.environ.get(name, "").upper() in {"1", "ON", "YES", "TRUE"}
               for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
