"""The CPU a fresh ``ft train`` process spends, with the CLI's way of importing the libraries (ft.run.stack:
collections paused, then frozen) and without it, measured side by side.

Both run the same one-step run of the tiny model in a fresh interpreter: ``python -m ft train`` as a user runs it,
and ``ft.run.train.train`` called from ``python -c`` (the library call, which leaves the collector as Python set it).
Each reports its CPU seconds and the seconds its garbage collections took (``gc.callbacks``); rounds interleave.
Target: the CLI's CPU ≤ 0.9× the library call's (the collections were 2 s of a 12-13 s process on 2 cores).

    python benchmarks/train_startup.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

# run in each fresh process before ft: time the collections; print CPU and collection seconds at exit
PROBE = """
import atexit, gc, json, sys, time
spent = [0.0, 0.0]
def _timed(phase, info):
    if phase == "start":
        spent[1] = time.process_time()
    else:
        spent[0] += time.process_time() - spent[1]
gc.callbacks.append(_timed)
atexit.register(lambda: print("STARTUP " + json.dumps({"cpu": time.process_time(), "gc": spent[0]}), file=sys.stderr))
"""

LIBRARY = """
from ft.recipe import load_recipe
from ft.run.train import train
train(load_recipe({path!r}), resume="never", say=lambda _: None)
"""

CLI = """
import sys
from ft.cli import main
sys.argv = ["ft", "train", {path!r}, "--resume", "never"]
main()
"""


def recipe(folder: Path, name: str) -> Path:
    """The tiny model's one-step run (the arithmetic chats, no evaluation, no checkpoint) into folder/name."""
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "method": "sft", "model": {"name": str(ROOT / "assets/tiny-llama"), "init": "random"},
        "data": {"train": [{"path": str(ROOT / "data/arithmetic/train.jsonl"), "format": "chat"}], "max_length": 64},
        "train": {"output_dir": str(folder / name), "max_steps": 1, "per_device_train_batch_size": 8,
                  "save_strategy": "no", "eval_strategy": "no", "report_to": "none"}}))
    return path


def measure(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    line = next((line for line in done.stderr.splitlines() if line.startswith("STARTUP ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"the run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(line.removeprefix("STARTUP "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    ways = {"ft train (the CLI)": ("cli", CLI), "ft.run.train.train (library call)": ("library", LIBRARY)}
    results: dict[str, list[dict]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory(prefix="ft-startup-") as folder:
        for round_ in range(rounds):
            for name, (short, code) in ways.items():
                path = recipe(Path(folder), f"{short}-{round_}")
                results[name].append(measure(code.format(path=str(path))))
    print(f"{'how':36} {'CPU s (median)':>15} {'collections s':>14}")
    medians = {}
    for name, runs in results.items():
        medians[name] = statistics.median(run["cpu"] for run in runs)
        print(f"{name:36} {medians[name]:15.2f} {statistics.median(run['gc'] for run in runs):14.2f}")
    cli, library = medians.values()
    print(f"\nCLI / library call = {cli / library:.2f} (target ≤ 0.90)")


if __name__ == "__main__":
    main()
