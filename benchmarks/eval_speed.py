"""`ft eval` next to the `lm_eval` command on the same model and task files, measured side by side.

Both score a saved model folder (the shipped tiny Llama config with seeded random weights, or `--model DIR`) on the
shipped arithmetic tasks (tasks/arithmetic/: generation scored by exact match, and a multiple choice by
log-likelihood), with the chat template, the same batch size and row limit. Each command runs ROUNDS times,
interleaved; the median walls are compared, and the scores of every round must agree (the benchmark stops
otherwise). Target: ft eval <= 1.0x the lm_eval command (ft indexes lm-eval's ~15k built-in tasks only when a task is
named from them; a run's in-process benchmarks add no model load at all).

    python benchmarks/eval_speed.py [--rounds 3] [--limit 100] [--model DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tasks" / "arithmetic"
METRICS = (("arithmetic_sums", "exact_match,none"), ("arithmetic_choice", "acc,none"))


def tiny_model(folder: Path) -> Path:
    """The shipped tiny Llama config with seeded random weights and its tokenizer, saved as a model folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    assets = ROOT / "assets" / "tiny-llama"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(assets)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(assets).save_pretrained(folder)
    return folder


def ft_eval(model: Path, limit: int, out: Path) -> tuple[float, dict]:
    command = [sys.executable, "-m", "ft", "eval", str(model), "--tasks", f"{TASKS / 'sums.yaml'},"
               f"{TASKS / 'choice.yaml'}", "--limit", str(limit), "--batch-size", "8", "--json"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=_env(), check=True)
    return time.perf_counter() - started, json.loads(done.stdout)[0]["results"]


def lm_eval(model: Path, limit: int, out: Path) -> tuple[float, dict]:
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={model}", "--tasks",
               "sums.yaml,choice.yaml", "--limit", str(limit), "--batch_size", "8", "--device", "cpu",
               "--apply_chat_template", "--output_path", str(out)]
    started = time.perf_counter()
    subprocess.run(command, cwd=TASKS, capture_output=True, text=True, env=_env(), check=True)
    wall = time.perf_counter() - started
    (written,) = out.rglob("results_*.json")
    results = json.loads(written.read_text())
    written.unlink()
    return wall, results


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--model", type=Path, help="a saved model folder (default: a random tiny Llama)")
    parser.add_argument("--quick", action="store_true", help="one round of 20 rows (what the tests run)")
    args = parser.parse_args()
    rounds, limit = (1, 20) if args.quick else (args.rounds, args.limit)
    with tempfile.TemporaryDirectory(prefix="ft-eval-speed-") as scratch:
        model = args.model or tiny_model(Path(scratch) / "model")
        walls: dict[str, list[float]] = {"ft eval": [], "lm_eval": []}
        agreed = 0
        for _ in range(rounds):
            ours_wall, ours = ft_eval(model, limit, Path(scratch))
            theirs_wall, theirs = lm_eval(model, limit, Path(scratch) / "lm_eval")
            walls["ft eval"].append(ours_wall)
            walls["lm_eval"].append(theirs_wall)
            same = all(ours["results"][task][key] == theirs["results"][task][key] for task, key in METRICS)
            if not same:
                sys.exit(f"the scores differ: ft eval {ours['results']}, lm_eval {theirs['results']}")
            agreed += 1
    medians = {name: statistics.median(values) for name, values in walls.items()}
    print(f"{'command':10} {'median s':>9}   ({limit} rows of each task, {rounds} rounds)")
    for name, median in medians.items():
        print(f"{name:10} {median:9.2f}")
    print(f"same scores in {agreed} of {rounds} rounds")
    print(f"ft eval / lm_eval = {medians['ft eval'] / medians['lm_eval']:.2f} (target <= 1.0)")


if __name__ == "__main__":
    main()
