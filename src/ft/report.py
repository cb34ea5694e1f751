"""What a run did, read from the trainer's log history: ``summary.json`` and the PNGs under ``plots/``."""

from __future__ import annotations

import json
import math
from pathlib import Path


def summarize(status: str, log_history: list[dict], *, steps: int, train_seconds: float,
              final_eval: dict | None, extra: dict | None = None) -> dict:
    train_losses = [entry["loss"] for entry in log_history if "loss" in entry]
    eval_losses = [entry["eval_loss"] for entry in log_history if "eval_loss" in entry]
    summary = {
        "status": status,
        "steps": steps,
        "first_train_loss": train_losses[0] if train_losses else None,
        "last_train_loss": train_losses[-1] if train_losses else None,
        "min_train_loss": min(train_losses) if train_losses else None,
        "first_eval_loss": eval_losses[0] if eval_losses else None,
        "eval_loss": (final_eval or {}).get("eval_loss", eval_losses[-1] if eval_losses else None),
        "train_seconds": round(train_seconds, 3),
    }
    first_eval = next((entry for entry in log_history if "eval_loss" in entry), None)
    if first_eval:
        summary["first_eval"] = first_eval
    if final_eval:
        summary["final_eval"] = final_eval
    summary["last_eval"] = last_eval(log_history)
    summary.update(extra or {})
    return summary


def last_eval(log_history: list[dict]) -> dict | None:
    """The newest evaluation's log entry (its ``eval_*`` metrics, ``epoch`` and ``step``), whatever the run's status;
    None before the first evaluation."""
    return next((entry for entry in reversed(log_history) if "eval_loss" in entry), None)


# the phases of ``ft train`` timed in summary.json's ``phase_seconds`` (None: the phase did not run to its end)
PHASES = ("prepare_data", "load_model", "train", "evaluate", "save")

# the packages whose versions summary.json records (``ft`` itself: ``ft.__version__``)
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


def versions() -> dict:
    """Python's version, ft's and each of ``PACKAGES``' installed version (None when one is not installed)."""
    import platform
    from importlib import metadata

    from . import __version__

    found: dict = {"python": platform.python_version(), "ft": __version__}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


# method -> (summary name, logged key) of the figures that show what the method did; for the preference methods the
# evaluation's (eval_ + key) when the run evaluated, else the training log's
HEADLINES = {
    "sft": (("token_accuracy", "mean_token_accuracy"), ("loss", "loss")),
    "dpo": (("reward_accuracy", "rewards/accuracies"), ("reward_margin", "rewards/margins")),
    "orpo": (("reward_accuracy", "rewards/accuracies"), ("reward_margin", "rewards/margins")),
    "kto": (("reward_margin", "rewards/margins"),),
    "grpo": (("reward", "reward"),),
}


def headline(method: str, log_history: list[dict]) -> dict:
    """Each of the method's headline figures at its first and last logged step (``{"first", "last", "first_step",
    "last_step"}``), and which log they come from: ``eval`` (the first evaluation, often before training with
    ``eval_on_start``, and the last: the final one) when the run evaluated, else ``train``. GRPO: the mean reward
    of every generation round's completions, and each reward function's (``rewards/<name>/mean``), from the training
    log. SFT: eval token accuracy and loss. Empty when the run logged none of them (e.g. stopped before a log line)."""
    figures = HEADLINES.get(method, ())
    if method == "grpo":
        names = dict.fromkeys(k for entry in log_history for k in entry if k.startswith("rewards/") and
                              k.endswith("/mean"))
        figures = (*figures, *((key[len("rewards/"):-len("/mean")], key) for key in names))
    source = "eval" if method != "grpo" and any(f"eval_{key}" in entry for entry in log_history
                                                for _, key in figures) else "train"
    out: dict = {}
    for name, key in figures:
        key = f"eval_{key}" if source == "eval" else key
        points = [(entry.get("step"), entry[key]) for entry in log_history if key in entry]
        if points:
            (first_step, first), (last_step, last) = points[0], points[-1]
            out[name] = {"first": first, "last": last, "first_step": first_step, "last_step": last_step}
    return {"source": source, **out} if out else {}


def best_checkpoint(state, args) -> dict | None:
    """The best evaluation transformers tracked for ``metric_for_best_model`` (``trainer.state``, ``trainer.args``):
    its step, the metric (with the ``eval_`` prefix transformers adds), its value, the checkpoint saved at that step
    (None when no checkpoint was saved there) and whether the trainer loaded it back at the end
    (``load_best_model_at_end``: then ``final/`` holds its weights). None when the run tracked no best step (no
    metric, no evaluation yet, or ``save_strategy: no``)."""
    step = state.best_global_step
    if not step or args.metric_for_best_model is None:
        return None
    metric = args.metric_for_best_model
    metric = metric if metric.startswith("eval_") else f"eval_{metric}"
    # transformers points best_model_checkpoint at checkpoint-<best step> only when that folder was saved; otherwise
    # it keeps naming an earlier best
    saved = state.best_model_checkpoint
    checkpoint = saved if saved and Path(saved).name == f"checkpoint-{step}" else None
    return {"step": step, "metric": metric, "value": state.best_metric, "checkpoint": checkpoint,
            "loaded_at_end": bool(args.load_best_model_at_end and checkpoint)}


def write_summary(output_dir: Path, summary: dict) -> Path:
    path = output_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    return path


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
                            if key.startswith("eval_") and key not in NOT_EVAL_METRICS)
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
        keys, label = PLOTS.get(name, ((name,), f"{name[len('eval_'):]} (eval)"))
        line_chart(folder / f"{name}.png", [(LEGEND.get(key, key), points) for key, points in lines.items()], label,
                   legend=len(keys) > 1)
        written.append(f"plots/{name}.png")
    return written


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


LOG_HISTORY = "log_history.json"


def write_log_history(output_dir: Path, log_history: list[dict]) -> Path:
    """``log_history.json``: the trainer's log entries as the summary and plots read them (``ft report --plots``
    draws several runs from it)."""
    path = output_dir / LOG_HISTORY
    path.write_text(json.dumps(log_history) + "\n")
    return path
