"""``ft report``: what one run did, or several side by side, read from what each left in its output directory.

A finished run (completed, stopped or failed) is read from its ``summary.json`` (docs/outputs.md lists its fields)
and ``log_history.json``; a run still in progress (no ``summary.json`` yet, or checkpoints newer than the one a
stopped run's summary names, after it was resumed) from its newest complete checkpoint's ``trainer_state.json``.
Several runs are columns, labelled by their directory names, followed by the recipe keys that differ between them
(from each run's ``recipe.yaml``). ``--plots DIR`` draws their loss, eval loss, learning rate and tokens/s on shared
axes. No torch is imported: this reads files only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FtError
from .plots import NOT_EVAL_METRICS, log_points
from .summary import LOG_HISTORY, summarize

# the keys left out of the recipe comparison: every run has its own output directory
SAME_BY_DESIGN = ("train.output_dir",)

# ft report --plots: file stem -> (the log key drawn for every run, y-axis label)
OVERLAYS = {
    "loss": ("loss", "train loss"),
    "eval_loss": ("eval_loss", "eval loss"),
    "learning_rate": ("learning_rate", "learning rate"),
    "tokens_per_second": ("tokens_per_second", "tokens/s (non-padding, since the first batch)"),
}

EMPTY = "—"


class _Absent:
    """A recipe key one run's recipe.yaml does not have (where another's does)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


class ReportError(FtError, prefix="ft report: "):
    """A run directory ``ft report`` cannot read (exit 2)."""


@dataclass
class Run:
    path: Path
    label: str
    status: str  # completed | stopped | failed | in progress (step N) | in progress (no checkpoint yet)
    summary: dict  # summary.json; for a run in progress, the same figures read from its log history
    log_history: list[dict] = field(default_factory=list)
    recipe: dict | None = None  # recipe.yaml, parsed; None when the directory has none

    @property
    def in_progress(self) -> bool:
        return self.status.startswith("in progress")


def load_runs(paths: list[Path]) -> list[Run]:
    """Every run of ``paths``, labelled; one ``ReportError`` naming every directory that holds no run."""
    problems, found = [], []
    for path in paths:
        try:
            found.append(load_run(path))
        except ReportError as exc:
            problems.append(str(exc))
    if problems:
        raise ReportError(" ".join(problems) + " A run directory is a train.output_dir of `ft train`: it holds "
                          "summary.json once the run has ended, and checkpoint-N/ folders while it trains.")
    for run, label in zip(found, _labels([run.path for run in found]), strict=True):
        run.label = label
    return found


def load_run(path: Path) -> Run:
    from .checkpoints import complete_checkpoints

    if not path.exists():
        raise ReportError(f"{path} does not exist.")
    if not path.is_dir():
        raise ReportError(f"{path} is not a directory.")
    summary = _read_json(path / "summary.json")
    saved = complete_checkpoints(path)
    recipe = _read_recipe(path / "recipe.yaml")
    if summary is None and not saved and recipe is None:
        raise ReportError(f"{path} holds no ft run (no summary.json, checkpoint-N/ or recipe.yaml).")
    newest = _read_json(saved[-1] / "trainer_state.json") if saved else None
    newest_step = (newest or {}).get("global_step", 0)
    if summary is not None and (summary.get("status") == "completed" or newest_step <= (summary.get("steps") or 0)):
        history = _read_json(path / LOG_HISTORY, list)
        if history is None and newest is not None:  # written by an ft before log_history.json
            history = newest.get("log_history", [])
        return Run(path, path.name, str(summary.get("status")), summary, history or [], recipe)
    if newest is None:  # recipe.yaml alone: started, not yet at its first checkpoint (or ended before it)
        return Run(path, path.name, "in progress (no checkpoint yet)", {}, [], recipe)
    history = newest.get("log_history", [])
    status = f"in progress (step {newest_step})"
    return Run(path, path.name, status, progress_summary(status, history, newest), history, recipe)


def progress_summary(status: str, log_history: list[dict], state: dict) -> dict:
    """The figures of summary.json a run in progress already has, from a checkpoint's ``trainer_state.json``
    (``state``): steps, epochs, losses, evaluations, and the training log's latest tokens/s and padding efficiency."""
    summary = summarize(status, log_history, steps=state.get("global_step", 0), train_seconds=0.0, final_eval=None)
    summary["train_seconds"] = None  # not in a checkpoint
    summary["epochs"] = state.get("epoch")
    for key in ("tokens_per_second", "padding_efficiency"):
        points = log_points(log_history, key)
        summary[key] = points[-1][1] if points else None
    return summary


def _read_json(path: Path, kind: type = dict):
    """The JSON file at ``path`` when it holds a ``kind``; None when it is missing, unreadable or holds another."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, kind) else None


def _read_recipe(path: Path) -> dict | None:
    from ..recipe.yaml_io import YamlSyntaxError, parse_yaml

    try:
        data, _ = parse_yaml(path.read_text(), str(path))
    except (OSError, YamlSyntaxError):
        return None
    return data if isinstance(data, dict) else None


def _labels(paths: list[Path]) -> list[str]:
    """Each run's directory name; where two share one, as many parent folders as tell them apart."""
    parts = [path.resolve().parts for path in paths]
    depth = 1
    while True:
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels) or depth >= max(len(p) for p in parts):
            return labels
        depth += 1


def recipe_differences(runs: list[Run]) -> dict[str, list]:
    """Dotted recipe key -> each run's value, for the keys whose values differ between the runs (``ABSENT`` for a
    run whose recipe lacks the key, or has no recipe.yaml). Empty when fewer than two runs have a recipe.yaml."""
    flat = [_flatten(run.recipe) if run.recipe is not None else None for run in runs]
    known = [f for f in flat if f is not None]
    if len(known) < 2:
        return {}
    keys = dict.fromkeys(key for f in known for key in f if key not in SAME_BY_DESIGN)
    differ = {}
    for key in keys:
        values = [f.get(key, ABSENT) if f is not None else ABSENT for f in flat]
        if len({"absent" if v is ABSENT else json.dumps(v, sort_keys=True, default=str) for v in values}) > 1:
            differ[key] = values
    return differ


def _flatten(value, prefix: str = "") -> dict:
    """``{"optimizer": {"lr": 0.001}}`` -> ``{"optimizer.lr": 0.001}``; list items by index (``data.train.0.path``);
    an empty map or list stays a value."""
    if isinstance(value, dict) and value:
        items = value.items()
    elif isinstance(value, list) and value:
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {prefix: value}
    out = {}
    for key, item in items:
        out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


def merged(runs: list[Run]) -> dict:
    """``ft report --json``: every run's directory, label, status and summary, and the recipe keys that differ (label
    -> value; a run whose recipe lacks the key is left out of its map)."""
    differences = recipe_differences(runs)
    return {"runs": [{"label": run.label, "dir": str(run.path), "status": run.status, "in_progress": run.in_progress,
                      "summary": run.summary} for run in runs],
            "recipe_differences": {key: {run.label: value for run, value in zip(runs, values, strict=True)
                                         if value is not ABSENT} for key, values in differences.items()}}


def render(runs: list[Run]) -> str:
    """The table ``ft report`` prints: one row per figure, one column per run, then the recipe keys that differ."""
    rows: list[tuple[str, list[str]]] = [("run", [run.label for run in runs])]
    for name, cells, always in _rows(runs):
        shown = [_cell(value) for value in cells]
        if always or any(cell != EMPTY for cell in shown):
            rows.append((name, shown))
    differences = recipe_differences(runs)
    if differences:
        rows.append(("", [""] * len(runs)))
        rows.append(("recipe keys that differ", [""] * len(runs)))
        rows += [(f"  {key}", [_recipe_value(v) for v in values]) for key, values in differences.items()]
    return _table(rows)


def _rows(runs: list[Run]):
    """(row name, one value per run, shown even when every run lacks it)."""
    summaries = [run.summary for run in runs]

    def each(key: str) -> list:
        return [summary.get(key) for summary in summaries]

    yield "status", [_status(run) for run in runs], True
    yield "failure", [_failure(summary.get("failure")) for summary in summaries], False
    yield "steps", each("steps"), True
    yield "epochs", each("epochs"), False
    yield "train loss (first)", each("first_train_loss"), True
    yield "train loss (last)", each("last_train_loss"), True
    yield "train loss (min)", each("min_train_loss"), True
    yield "eval loss", each("eval_loss"), True
    evals = [summary.get("final_eval") or summary.get("last_eval") or {} for summary in summaries]
    metrics = dict.fromkeys(key for found in evals for key in found
                            if key.startswith("eval_") and key not in NOT_EVAL_METRICS)
    for key in metrics:
        yield f"eval {key[len('eval_'):]}", [found.get(key) for found in evals], False
    yield "tokens/s", each("tokens_per_second"), True
    yield "samples/s", each("samples_per_second"), False
    yield "padding efficiency", each("padding_efficiency"), False
    yield "peak memory (GiB)", each("peak_memory_gb"), True  # GiB, as summary.json's peak_memory_gb
    yield "train time", [_duration(_all_parts(summary, "train_seconds")) for summary in summaries], False
    yield "wall time", [_duration(_all_parts(summary, "wall_seconds")) for summary in summaries], True
    headlines = [summary.get("headline") or {} for summary in summaries]
    names = dict.fromkeys(name for found in headlines for name in found if name != "source")
    for name in names:
        yield f"headline {name}", [_headline_figure(found, name) for found in headlines], False
    yield "exact match before", [_exact_match(summary.get("exact_match_before")) for summary in summaries], False
    yield "exact match", [_exact_match(summary.get("exact_match")) for summary in summaries], False
    grouped = [(summary.get("exact_match") or {}).get("groups") or {} for summary in summaries]
    for group in dict.fromkeys(name for found in grouped for name in found):  # data.eval_exact_match.group_by
        yield f"  {group}", [_exact_match(found.get(group)) for found in grouped], False
    benchmarks = [summary.get("benchmarks") or {} for summary in summaries]
    scored = dict.fromkeys((task, metric) for found in benchmarks for moment in ("before", "end")
                           for task, values in (found.get(moment) or {}).items() for metric in values)
    for task, metric in scored:
        yield f"{task} {metric}", [_benchmark(found, task, metric) for found in benchmarks], False


def _status(run: Run) -> str:
    """``completed``, ``stopped (SIGTERM)``; a run resumed after stops says how many parts it trained in."""
    stopped_by = run.summary.get("stopped_by")
    status = f"{run.status} ({stopped_by})" if run.status == "stopped" and stopped_by else run.status
    earlier = run.summary.get("earlier_parts") or []
    return f"{status}, in {len(earlier) + 1} parts" if earlier else status


def _all_parts(summary: dict, key: str):
    """``key`` (train or wall seconds) summed over the run's parts: a resumed run's summary counts only the part
    after its resume, and lists the parts before it (``earlier_parts``)."""
    value = summary.get(key)
    if not isinstance(value, int | float):
        return value
    return value + sum(part.get(key) or 0 for part in summary.get("earlier_parts") or [])


def _failure(failure) -> str | None:
    if not isinstance(failure, dict):
        return None
    text = f"{failure.get('type')}: {failure.get('message')}"
    return text if len(text) <= 48 else text[:47] + "…"


def _headline_figure(found: dict, name: str) -> str | None:
    figure = found.get(name)
    if not isinstance(figure, dict):
        return None
    return f"{_cell(figure.get('first'))} → {_cell(figure.get('last'))} ({found.get('source', '?')})"


def _exact_match(result) -> str | None:
    """``0.965 (n=200, ended 1)``: the share right, of how many, and the share that ended their turn themselves."""
    if not isinstance(result, dict) or result.get("exact_match") is None:
        return None
    ended = f", ended {_cell(result['ended_turn'])}" if result.get("ended_turn") is not None else ""
    return f"{_cell(result['exact_match'])} (n={result.get('n', '?')}{ended})"


def _benchmark(found: dict, task: str, metric: str) -> str | None:
    """A benchmark's score before training → at the end (either alone where the run scored one)."""
    before, end = ((found.get(moment) or {}).get(task, {}).get(metric) for moment in ("before", "end"))
    if before is None and end is None:
        return None
    if before is None or end is None:
        return _cell(end if before is None else before) + (" (before)" if end is None else "")
    return f"{_cell(before)} → {_cell(end)}"


def _duration(seconds) -> str | None:
    if not isinstance(seconds, int | float):
        return None
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m {rest:02d}s" if minutes < 60 else f"{minutes // 60}h {minutes % 60:02d}m"


def _cell(value) -> str:
    if value is None:
        return EMPTY
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"


def _recipe_value(value) -> str:
    if value is ABSENT:
        return "(absent)"
    return value if isinstance(value, str) else json.dumps(value)


def _table(rows: list[tuple[str, list[str]]]) -> str:
    first = max(len(name) for name, _ in rows)
    widths = [max(len(cells[i]) for _, cells in rows) for i in range(len(rows[0][1]))]
    lines = []
    for index, (name, cells) in enumerate(rows):
        line = "  ".join([name.ljust(first), *(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))])
        lines.append(line.rstrip())
        if index == 0:
            lines.append("  ".join(["-" * first, *("-" * width for width in widths)]))
    return "\n".join(lines)


def write_overlay_plots(runs: list[Run], folder: Path) -> list[Path]:
    """``folder/<name>.png`` for each of ``OVERLAYS`` any run logged: one line per run, labelled as its column."""
    from .charts import line_chart

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (key, label) in OVERLAYS.items():
        lines = [(run.label, log_points(run.log_history, key)) for run in runs]
        if any(points for _, points in lines):
            path = folder / f"{name}.png"
            line_chart(path, lines, label)
            written.append(path)
    return written
