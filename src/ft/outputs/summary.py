"""What a run did, read from the trainer's log history: ``summary.json`` and ``log_history.json`` (the PNGs under
``plots/`` are ``outputs.plots``). docs/outputs.md lists every field."""

from __future__ import annotations

import json
from pathlib import Path

from ..recipe.methods import METHODS
from .disk import write_whole


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


# the phases of ``ft train`` timed in summary.json's ``phase_seconds``, in the order they run (None: the phase did not
# run to its end, or the recipe does not ask for it): the scoring passes before and after training included, which
# can take minutes of their own
PHASES = ("prepare_data", "load_model", "exact_match_before", "benchmarks_before", "train", "evaluate", "save",
          "exact_match", "benchmarks")

# the packages whose versions summary.json records (``ft`` itself: ``ft.__version__``)
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


def versions() -> dict:
    """Python's version, ft's and each of ``PACKAGES``' installed version (None when one is not installed)."""
    import platform
    from importlib import metadata

    from .. import __version__

    found: dict = {"python": platform.python_version(), "ft": __version__}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def headline(method: str, log_history: list[dict]) -> dict:
    """Each of the method's headline figures (``Method.headlines``) at its first and last logged step (``{"first",
    "last", "first_step", "last_step"}``), and which log they come from: ``eval`` (the first evaluation, often before
    training with ``eval_on_start``, and the last: the final one) when the run evaluated, else ``train``. A method that
    generates (GRPO): the mean reward of every generation round's completions, and each reward function's
    (``rewards/<name>/mean``), from the training log. SFT: eval token accuracy and loss. Empty when the run logged
    none of them (e.g. stopped before a log line)."""
    generates = METHODS[method].generates
    figures = tuple((figure.name, figure.key) for figure in METHODS[method].headlines)
    if generates:
        names = dict.fromkeys(k for entry in log_history for k in entry if k.startswith("rewards/") and
                              k.endswith("/mean"))
        figures = (*figures, *((key[len("rewards/"):-len("/mean")], key) for key in names))
    source = "eval" if not generates and any(f"eval_{key}" in entry for entry in log_history
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
    """``summary.json``, written whole or not at all (``disk.write_whole``): a full disk or a kill leaves the previous
    one readable, never a file cut short that tools cannot parse."""
    return write_whole(output_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=False) + "\n")


LOG_HISTORY = "log_history.json"


def write_log_history(output_dir: Path, log_history: list[dict]) -> Path:
    """``log_history.json``: the trainer's log entries as the summary and plots read them (``ft report --plots``
    draws several runs from it)."""
    return write_whole(output_dir / LOG_HISTORY, json.dumps(log_history) + "\n")
