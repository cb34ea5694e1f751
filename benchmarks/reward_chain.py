"""The preference pipeline end to end on the quickstart data: SFT → reward model → GRPO and RLOO scored by it.

1. SFT: the quickstart stopped at 700 of its 1200 steps (the half-trained model tests/conftest.py's ``sft_model``
   starts DPO, GRPO and RLOO tests from: about half the held-out sums right).
2. Reward model: ``recipes/smollm2-reward.yaml`` as shipped (SmolLM2-135M-Instruct from its GGUF file, LoRA and a new
   score head, 240 steps on the arithmetic preference pairs); its held-out pair accuracy is read from summary.json.
3. GRPO: ``recipes/quickstart-grpo-rm.yaml`` from the step-1 model, its only reward the step-2 run (no reward reads
   the rows' answers).
4. RLOO: the same recipe with ``method: rloo`` (its section under ``rloo:``).

For 3 and 4 it prints the mean learned reward of the sampled answers over the first and last 3 logged steps (the
recipe logs every 10 of its 100 steps), and the greedy exact match on the 200 held-out sums before and after
(``exact_match_before`` / ``exact_match``). A measurement, not a test: it exits 1 only when a run fails. From the
repository root, with the project's virtual environment active and SmolLM2's file in place
(``python scripts/get_smollm2.py``):

    python benchmarks/reward_chain.py            # about 16 minutes on 2 cores
    python benchmarks/reward_chain.py --out DIR  # keep the runs (default: a temporary folder)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LOGGED = 3  # logged steps averaged at each end: the recipes log every 10 of 100 steps


def _train(recipe: Path, out: Path, *sets: str) -> tuple[dict, float]:
    """``ft train recipe`` into ``out`` with ``--set``s; (summary.json, wall seconds)."""
    started = time.perf_counter()
    args = [sys.executable, "-m", "ft", "train", str(recipe), "--overwrite", "--set", f"train.output_dir={out}"]
    for change in sets:
        args += ["--set", change]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"{recipe.name} failed (exit {done.returncode})")
    return json.loads((out / "summary.json").read_text()), time.perf_counter() - started


def _learned(out: Path, name: str) -> tuple[float, float]:
    """The mean learned reward over the first and last ``LOGGED`` logged steps."""
    values = [entry[f"rewards/{name}/mean"] for entry in json.loads((out / "log_history.json").read_text())
              if f"rewards/{name}/mean" in entry]
    return sum(values[:LOGGED]) / len(values[:LOGGED]), sum(values[-LOGGED:]) / len(values[-LOGGED:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ft-reward-chain-") as scratch:
        out = (options.out or Path(scratch)).resolve()
        sft, sft_s = _train(ROOT / "recipes/quickstart.yaml", out / "sft", "train.max_steps=700",
                            "train.eval_on_start=false", "train.eval_strategy='no'", "train.save_strategy='no'")
        rm, rm_s = _train(ROOT / "recipes/smollm2-reward.yaml", out / "rm")
        accuracy = rm["headline"]["pair_accuracy"]
        rows = [("sft (700 steps)", sft_s, "", sft["exact_match"]["exact_match"])]
        rows.append((f"smollm2-reward ({rm['steps']} steps)", rm_s, f"held-out pair accuracy {accuracy['first']:.3f} → "
                     f"{accuracy['last']:.3f} ({rm['headline']['source']})", None))
        grpo_recipe = ROOT / "recipes/quickstart-grpo-rm.yaml"
        reward = f"grpo.rewards=[{{model: {out / 'rm'}, weight: 1.0}}]"
        policy = f"model.name={out / 'sft' / 'final'}"
        raw = yaml.safe_load(grpo_recipe.read_text())
        raw["method"], raw["rloo"] = "rloo", raw.pop("grpo")
        raw["train"].pop("scale_rewards")  # GRPO's advantage scaling; RLOOConfig has no such key
        rloo_recipe = out / "quickstart-rloo-rm.yaml"  # its paths are absolute below; the data's are made so here
        raw["data"]["train"][0]["path"] = str(ROOT / "data/arithmetic/prompts.jsonl")
        raw["data"]["eval_exact_match"]["source"]["path"] = str(ROOT / "data/arithmetic/prompts-eval.jsonl")
        rloo_recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
        for name, recipe, section in (("grpo", grpo_recipe, "grpo"), ("rloo", rloo_recipe, "rloo")):
            summary, seconds = _train(recipe, out / name, policy, reward.replace("grpo.", f"{section}."))
            first, last = _learned(out / name, "rm")
            before = summary.get("exact_match_before", {}).get("exact_match")
            rows.append((f"{name} scored by the reward model ({summary['steps']} steps)", seconds,
                         f"mean learned reward {first:.3f} → {last:.3f}; exact match before {before}",
                         summary["exact_match"]["exact_match"]))
        print("| run | wall | what it shows | exact match (200 held-out sums) |")
        print("|---|---|---|---|")
        for label, seconds, shows, exact in rows:
            print(f"| {label} | {seconds:.0f} s | {shows} | {'' if exact is None else exact} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
