"""What the worst-batch probe (``train.preflight``) costs, against the training step it precedes.

The quickstart recipe, shortened, trains through ``ft.run.train`` with ``train.preflight: true``: the probe's seconds
(summary.json ``preflight.seconds``: one forward and backward of the largest batch, no optimizer step) against the
mean step of the same run (train seconds less the probe, over the steps). Target: the probe costs at most two steps.
Each configuration runs twice in one process, and the second (warm) run is the one reported: the first pays the
process's one-time warm-up, which the first step pays anyway without a probe.

A measurement, not a test. From the repository root, with the project's virtual environment active:

    python benchmarks/preflight_cost.py            # about a minute on 2 cores
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
CONFIGS = {  # label -> --set changes to the quickstart
    "quickstart, batch 32 × 128 tokens": [],
    "batch 8, LoRA r 16": ["train.per_device_train_batch_size=8", "adapter.kind=lora", "adapter.r=16"],
}
STEPS = 30


def run(changes: list[str], out: Path) -> dict:
    from ft.recipe import load_recipe
    from ft.run.train import train

    sets = [f"train.output_dir={out}", f"train.max_steps={STEPS}", "train.preflight=true", "train.eval_strategy=no",
            "train.eval_on_start=false", "train.save_strategy=no", "data.eval_exact_match=null", "train.report_to=none",
            *changes]
    summary = train(load_recipe(ROOT / "recipes" / "quickstart.yaml", sets), resume="never", say=lambda _: None,
                    overwrite=True).summary
    probe = summary["preflight"]["seconds"]
    step = (summary["train_seconds"] - probe) / summary["steps"]
    return {"probe": probe, "step": step, "ratio": probe / step}


def main() -> int:
    print(f"{'configuration':<38}{'probe s':>9}{'step s':>9}{'probe / step':>14}")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="ft-preflight-cost-") as tmp:
        for label, changes in CONFIGS.items():
            for attempt in range(2):
                figures = run(changes, Path(tmp) / f"{label.split(',')[0].replace(' ', '-')}-{attempt}")
            worst = max(worst, figures["ratio"])
            print(f"{label:<38}{figures['probe']:>9.3f}{figures['step']:>9.3f}{figures['ratio']:>14.2f}", flush=True)
    print(f"worst probe / step: {worst:.2f} (target: at most 2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
