"""How long `ft validate` takes next to `python -c "import torch"`, measured side by side.

A recipe mistake should cost the user a second on a laptop, not a model download on a GPU; the
yardstick is the import of torch itself, which every training tool pays before it can check anything.
Target: validate ≤ 0.3× import torch. Each command runs ROUNDS times, interleaved, and the medians
are compared.

    python benchmarks/validate_speed.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "ft validate recipes/quickstart.yaml": [sys.executable, "-m", "ft", "validate", "recipes/quickstart.yaml"],
    "ft validate recipes/llama-sft.yaml": [sys.executable, "-m", "ft", "validate", "recipes/llama-sft.yaml"],
    'python -c "import torch"': [sys.executable, "-c", "import torch"],
}


def wall(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(rounds):
        for name, command in COMMANDS.items():
            times[name].append(wall(command))
    medians = {name: statistics.median(values) for name, values in times.items()}
    torch_time = medians['python -c "import torch"']
    print(f"{'command':42} {'median s':>9} {'× import torch':>15}")
    for name, median in medians.items():
        print(f"{name:42} {median:9.3f} {median / torch_time:15.2f}")
    ratio = medians["ft validate recipes/quickstart.yaml"] / torch_time
    print(f"\nft validate / import torch = {ratio:.2f} (target ≤ 0.30)")


if __name__ == "__main__":
    main()
