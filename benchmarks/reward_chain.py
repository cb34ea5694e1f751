"""The preference pipeline end to end on the quickstart data: SFT → reward model → GRPO and RLOO scored by it.

1. SFT: the quickstart stopped at 700 of its 1200 steps (the half-trained model tests/conftest.py's ``sft_model``
   starts DPO, GRPO and RLOO tests from: about half the held-out sums right).
2. Reward model: ``recipes/smollm2-sft.yaml`` (LoRA on SmolLM2-135M-Instruct from its GGUF file), then
   ``recipes/smollm2-reward.yaml`` as shipped, started from that run (its adapter folded in, LoRA r 64 and a new score
   head, 720 steps on the arithmetic preference pairs); its held-out pair accuracy is read from summary.json.
3. GRPO: ``recipes/quickstart-grpo-rm.yaml`` from the step-1 model, its only reward the step-2 run (no reward reads
   the rows' answers).
4. RLOO: the same recipe with ``method: rloo`` (its section under ``rloo:``).

For 3 and 4 it prints the greedy exact match on the 200 held-out sums before and after (``exact_match_before`` /
``exact_match``), and the learned reward two ways: the reward model's mean score of those same greedy answers before
and after (the same 200 prompts at both ends: the figure that says whether the policy moved towards what the reward
model prefers), and the mean score of the sampled answers over the first and last 3 logged steps (the recipe logs
every 10 of its 600 steps; each logged step scores 8 other prompts, so it is noisy). The reward model's near-miss
share (the right answer scored above every near miss) is measured in float32 and in bfloat16, each timed: what a
reward entry's ``dtype: bfloat16`` (the GRPO recipe's) buys and costs. A measurement, not a test: it
exits 1 only when a run fails. From the repository root, with the project's virtual environment active and SmolLM2's
file in place (``python scripts/get_smollm2.py``):

    python benchmarks/reward_chain.py                    # about 70 minutes on 2 cores
    python benchmarks/reward_chain.py --out DIR          # keep the runs (default: a temporary folder)
    python benchmarks/reward_chain.py --out DIR --reuse  # read the runs already complete in DIR, train the rest
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
LOGGED = 3  # logged steps averaged at each end: the recipes log every 10 of 600 steps


def _train(recipe: Path, out: Path, *sets: str, reuse: bool = False) -> tuple[dict, float]:
    """``ft train recipe`` into ``out`` with ``--set``s; (summary.json, wall seconds). ``reuse``: a run already complete
    in ``out`` is read instead (its wall seconds from its summary.json)."""
    done = out / "summary.json"
    if reuse and done.is_file() and json.loads(done.read_text()).get("status") == "completed":
        summary = json.loads(done.read_text())
        return summary, summary["wall_seconds"]
    started = time.perf_counter()
    args = [sys.executable, "-m", "ft", "train", str(recipe), "--overwrite", "--set", f"train.output_dir={out}"]
    for change in sets:
        args += ["--set", change]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"{recipe.name} failed (exit {done.returncode})")
    return json.loads((out / "summary.json").read_text()), time.perf_counter() - started


def _learned(out: Path) -> tuple[float, float]:
    """The mean learned reward over the first and last ``LOGGED`` logged steps (TRL's ``reward``: the weighted sum of
    the rewards, here the reward model's score alone)."""
    values = [entry["reward"] for entry in json.loads((out / "log_history.json").read_text()) if "reward" in entry]
    return sum(values[:LOGGED]) / len(values[:LOGGED]), sum(values[-LOGGED:]) / len(values[-LOGGED:])


NEAR_MISSES = (-10, -3, -2, -1, 1, 2, 3, 10)  # the wrong answers of the preference pairs: the carry, the last digit


def _held_out_chats() -> dict:
    """The 200 held-out questions' chats (system and user turns), by the question."""
    chats = {}
    for line in (ROOT / "data/arithmetic/prompts-eval.jsonl").read_text().splitlines():
        row = json.loads(line)
        chats[row["prompt"][-1]["content"]] = (row["prompt"], row["answer"])
    return chats


def _scores(reward, chats: list, answers: list[str]) -> list[float]:
    """The reward model's score of each answer to its chat, rendered as GRPO renders it: the chat and the answer, in
    the reward model's own template."""
    import torch

    tokenizer = reward.tokenizer
    texts = [tokenizer.apply_chat_template(chat + [{"role": "assistant", "content": text}], tokenize=False)
             for chat, text in zip(chats, answers, strict=True)]
    scores = []
    for start in range(0, len(texts), 32):
        batch = tokenizer(texts[start:start + 32], return_tensors="pt", padding=True, padding_side="right")
        with torch.no_grad():
            scores += reward.model(**batch).logits[:, 0].tolist()
    return scores


def _near_miss_ceiling(reward) -> float:
    """The share of the held-out questions whose right answer the reward model scores above every near miss of the
    pairs' kinds: a policy that gave, for each question, the answer this reward model prefers would have this exact
    match; GRPO and RLOO push towards it."""
    right = 0
    for chat, answer in _held_out_chats().values():
        candidates = [answer] + [str(int(answer) + d) for d in NEAR_MISSES if int(answer) + d >= 0]
        scores = _scores(reward, [chat] * len(candidates), candidates)
        right += scores[0] > max(scores[1:])
    return right / len(_held_out_chats())


def _held_out_scores(run: Path, reward) -> tuple[float, float]:
    """The reward model's mean score of the greedy answers to the held-out prompts, before and after training (the
    run's exact_match.jsonl)."""
    chats = _held_out_chats()
    answered = [json.loads(line) for line in (run / "exact_match.jsonl").read_text().splitlines()]
    means = []
    for side in ("before", "after"):
        scores = _scores(reward, [chats[row["prompt"]][0] for row in answered], [row[side] for row in answered])
        means.append(sum(scores) / len(scores))
    return means[0], means[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--reuse", action="store_true", help="read the runs already complete in --out")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ft-reward-chain-") as scratch:
        out = (options.out or Path(scratch)).resolve()
        reuse = options.reuse
        sft, sft_s = _train(ROOT / "recipes/quickstart.yaml", out / "sft", "train.max_steps=700",
                            "train.eval_on_start=false", "train.eval_strategy='no'", "train.save_strategy='no'",
                            reuse=reuse)
        rm_start, rm_start_s = _train(ROOT / "recipes/smollm2-sft.yaml", out / "smollm2-sft", reuse=reuse)
        rm, rm_s = _train(ROOT / "recipes/smollm2-reward.yaml", out / "rm", f"model.name={out / 'smollm2-sft'}",
                          reuse=reuse)
        accuracy = rm["headline"]["pair_accuracy"]
        from ft.trainers.learned_reward import load_learned_reward

        scorers, timed = {}, {}
        for dtype in ("float32", "bfloat16"):  # side by side: what `dtype: bfloat16` on a reward entry buys
            scorers[dtype] = load_learned_reward(str(out / "rm"), "reward", "reward", dtype=dtype)
            started = time.perf_counter()
            timed[dtype] = (_near_miss_ceiling(scorers[dtype]), time.perf_counter() - started)
        ceiling, scorer = timed["float32"][0], scorers["float32"]  # float32 scores the policies' answers
        rows = [("sft (700 steps)", sft_s, "", sft["exact_match"]["exact_match"])]
        rows.append((f"smollm2-sft, the reward model's start ({rm_start['steps']} steps)", rm_start_s, "",
                     rm_start["exact_match"]["exact_match"]))
        rows.append((f"smollm2-reward ({rm['steps']} steps)", rm_s, f"held-out pair accuracy {accuracy['first']:.3f} → "
                     f"{accuracy['last']:.3f} ({rm['headline']['source']}); the right answer scored above all its near "
                     f"misses (±1–3, ±10) on {ceiling:.3f} of the held-out questions", None))
        rows.append(("the reward model scoring the 200 × 9 candidates in float32, then bfloat16", timed["float32"][1],
                     f"bfloat16 {timed['bfloat16'][1]:.0f} s ({timed['float32'][1] / timed['bfloat16'][1]:.1f}× "
                     f"faster), near-miss share {timed['bfloat16'][0]:.3f} (float32 {ceiling:.3f})", None))
        grpo_recipe = ROOT / "recipes/quickstart-grpo-rm.yaml"
        reward = f"grpo.rewards.0.model={out / 'rm'}"  # the recipe's entry otherwise as shipped (its dtype)
        policy = f"model.name={out / 'sft' / 'final'}"
        raw = yaml.safe_load(grpo_recipe.read_text())
        raw["method"], raw["rloo"] = "rloo", raw.pop("grpo")
        raw["train"].pop("scale_rewards")  # GRPO's advantage scaling; RLOOConfig has no such key
        rloo_recipe = out / "quickstart-rloo-rm.yaml"  # its paths are absolute below; the data's are made so here
        raw["data"]["train"][0]["path"] = str(ROOT / "data/arithmetic/prompts.jsonl")
        raw["data"]["eval_exact_match"]["source"]["path"] = str(ROOT / "data/arithmetic/prompts-eval.jsonl")
        rloo_recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
        for name, recipe, section in (("grpo", grpo_recipe, "grpo"), ("rloo", rloo_recipe, "rloo")):
            summary, seconds = _train(recipe, out / name, policy, reward.replace("grpo.", f"{section}."), reuse=reuse)
            first, last = _learned(out / name)
            held_before, held_after = _held_out_scores(out / name, scorer)
            before = summary.get("exact_match_before", {}).get("exact_match")
            rows.append((f"{name} scored by the reward model ({summary['steps']} steps)", seconds,
                         f"learned reward of the greedy held-out answers {held_before:.3f} → {held_after:.3f}, of "
                         f"the sampled ones {first:.3f} → {last:.3f}; exact match before {before}",
                         summary["exact_match"]["exact_match"]))
        print("| run | wall | what it shows | exact match (200 held-out sums) |")
        print("|---|---|---|---|")
        for label, seconds, shows, exact in rows:
            print(f"| {label} | {seconds:.0f} s | {shows} | {'' if exact is None else exact} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
