"""The PNGs under a run's ``plots/``: one per logged series (loss, learning rate, gradient norm, reward, tokens/s), one
per evaluation metric and one per benchmark metric (``benchmark/<task>/<metric>``: a recipe's ``benchmarks`` scored
before training, at each checkpoint and at the end), against the optimizer step, drawn with ``outputs.charts``."""

from __future__ import annotations

import math
from pathlib import Path

# one PNG per entry: file stem -> (log keys drawn on it, y-axis label); a plot is drawn when a key was logged
PLOTS = {
    "loss": (("loss", "eval_loss"), "loss"),
    "learning_rate": (("learning_rate",), "learning rate"),
    "grad_norm": (("grad_norm",), "gradient norm (before clipping)"),
    "reward": (("reward",), "mean reward"),
    "tokens_per_second": (("tokens_per_second",), "tokens/s (non-padding, since the first batch)"),
}

LEGEND = {"loss": "train", "eval_loss": "eval"}

# eval_* log keys that get no figure of their own: the loss (on loss.png), the evaluation's own speed, and TRL's count
# of the tokens trained on so far; every other eval_* key (mean_token_accuracy, rewards/margins, …) gets one
NOT_EVAL_METRICS = frozenset({"eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second",
                              "eval_num_tokens"})
BENCHMARK = "benchmark/"  # the log keys of a recipe's benchmarks (ft.eval.in_run)


def log_points(log_history: list[dict], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every log entry holding ``key`` as a finite number, in log order."""
    return [(entry["step"], entry[key]) for entry in log_history if "step" in entry and _finite(entry.get(key))]


def plot_series(log_history: list[dict]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """What ``write_plots`` draws: file stem -> {log key -> its ``(step, value)`` points}, one line per key. The
    entries of ``PLOTS`` the run logged, then one figure per evaluation metric (``eval_<metric>``, a ``/`` in the
    name made ``_``) in the order they were first logged. Values that are not finite numbers (NaN) are left out."""
    figures: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for name, (keys, _) in PLOTS.items():
        lines = {key: points for key in keys if (points := log_points(log_history, key))}
        if lines:
            figures[name] = lines
    metrics = dict.fromkeys(key for entry in log_history for key in entry
                            if key.startswith(BENCHMARK) or key.startswith("eval_") and key not in NOT_EVAL_METRICS)
    for key in metrics:
        points = log_points(log_history, key)
        if points:
            figures[key.replace("/", "_")] = {key: points}
    return figures


def write_plots(output_dir: Path, log_history: list[dict]) -> list[str]:
    """``plots/<name>.png`` for every figure of ``plot_series``, against the optimizer step; returns the files
    written, relative to ``output_dir``."""
    figures = plot_series(log_history)
    if not figures:
        return []
    from .charts import line_chart  # Pillow: only when there is something to draw

    folder = output_dir / "plots"
    folder.mkdir(exist_ok=True)
    written = []
    for name, lines in figures.items():
        keys, label = PLOTS.get(name, ((name,), _label(next(iter(lines)))))
        line_chart(folder / f"{name}.png", [(LEGEND.get(key, key), points) for key, points in lines.items()], label,
                   legend=len(keys) > 1)
        written.append(f"plots/{name}.png")
    return written


def _label(key: str) -> str:
    """The y-axis label of a metric's own figure: ``mean_token_accuracy (eval)``, ``arithmetic_sums exact_match``."""
    if key.startswith(BENCHMARK):
        return key.removeprefix(BENCHMARK).replace("/", " ")
    return f"{key[len('eval_'):]} (eval)"


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
