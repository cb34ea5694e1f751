"""``summary.json``: what a run did, read from the trainer's log history."""

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


def write_summary(output_dir: Path, summary: dict) -> Path:
    path = output_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    return path
