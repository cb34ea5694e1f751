"""What a run did, read from the trainer's log history: ``summary.json`` and the PNGs under ``plots/``."""

from __future__ import annotations

import json
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
        "first_eval_loss": eval_losses[0] if eval_losses else None,
        "eval_loss": (final_eval or {}).get("eval_loss", eval_losses[-1] if eval_losses else None),
        "train_seconds": round(train_seconds, 3),
    }
    first_eval = next((entry for entry in log_history if "eval_loss" in entry), None)
    if first_eval:
        summary["first_eval"] = first_eval
    if final_eval:
        summary["final_eval"] = final_eval
    summary.update(extra or {})
    return summary


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
}

LEGEND = {"loss": "train", "eval_loss": "eval"}


def write_plots(output_dir: Path, log_history: list[dict]) -> list[str]:
    """``plots/<name>.png`` for every entry of ``PLOTS`` the run logged, against the optimizer step; returns the
    files written, relative to ``output_dir``."""
    series = {key: [(entry["step"], entry[key]) for entry in log_history if key in entry and "step" in entry]
              for keys, _ in PLOTS.values() for key in keys}
    wanted = {name: spec for name, spec in PLOTS.items() if any(series[key] for key in spec[0])}
    if not wanted:
        return []
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, whatever the user's backend setting
    from matplotlib import pyplot as plt

    folder = output_dir / "plots"
    folder.mkdir(exist_ok=True)
    written = []
    for name, (keys, label) in wanted.items():
        figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
        for key in keys:
            if series[key]:
                steps, values = zip(*series[key], strict=True)
                axes.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3,
                          label=LEGEND.get(key, key))
        axes.set_xlabel("step")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
        if len(keys) > 1:
            axes.legend()
        figure.tight_layout()
        figure.savefig(folder / f"{name}.png")
        plt.close(figure)
        written.append(f"plots/{name}.png")
    return written
