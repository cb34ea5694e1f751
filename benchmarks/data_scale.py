"""Data at scale, measured side by side in one run: does preprocessing's cost grow only with the data, and does a
streamed run's memory stay flat as the corpus grows?

For chat corpora of 1× and 4× a size (``--mb``, the 1× size in MB; the issue's target run is ``--mb 256``: 1 GB at
4×), each in its own process, one at a time:

1. a raw batched tokenizer call on the rendered chats (the floor: no reading, checking, masking or writing);
2. ``ft preprocess`` with ``data.num_proc`` 1 and 2 (read → check rows → tokenize with masks → length column → write);
3. a streamed ``ft train`` (``data.streaming: true``) of ``--steps`` steps on the tiny model.

It prints, for each, peak resident memory (the largest process of its tree, from ``getrusage``) and tokens/s over the
whole command (start-up included: at the target sizes it is a few seconds of minutes), then the
targets: peak memory of preprocessing and of the streamed run grows by at most 10% from 1× to 4×; preprocessing
tokens/s ≥ 0.8× the raw tokenizer's at each size; ``num_proc: 2`` ≥ 1.6× ``num_proc: 1``. Results go in
benchmarks/README.md with the date. It exits 1 only when a command fails.

    python benchmarks/data_scale.py [--mb 256] [--steps 200] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets" / "tiny-llama"
WORDS = ("the model learns to add numbers and answer questions about short stories while the loss falls every step "
         "of training on a small machine with a long corpus read from disk").split()

# Runs one measured command in a child, then prints the children's peak RSS (kB) and the wall time as JSON: each
# measurement is its own process tree, so getrusage(RUSAGE_CHILDREN) is that command's peak alone.
MEASURE = """
import json, resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": done.returncode, "seconds": seconds, "peak_kb": peak, "stdout": done.stdout[-20000:],
                  "stderr": done.stderr[-3000:]}))
"""

RAW = """
import json, sys
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
tokens, batch = 0, []
def flush():
    global tokens, batch
    texts = tokenizer.apply_chat_template(batch, tokenize=False)
    tokens += sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    batch = []
with open(sys.argv[2], encoding="utf-8") as f:
    for line in f:
        batch.append(json.loads(line)["messages"])
        if len(batch) == 1000:
            flush()
if batch:
    flush()
print(json.dumps({"tokens": tokens}))
"""


def write_corpus(path: Path, megabytes: float, seed: int) -> int:
    """Chats of 1-4 turns with answers of 20-400 words, to ``megabytes``; returns the rows written."""
    rng, limit, rows = random.Random(seed), int(megabytes * 1_000_000), 0
    with path.open("w", encoding="utf-8") as f:
        while f.tell() < limit:
            messages = []
            for _ in range(rng.randint(1, 4)):
                messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 40)))})
                messages.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(20, 400)))})
            f.write(json.dumps({"messages": messages}) + "\n")
            rows += 1
    return rows


def measure(*command: str, cache: Path) -> dict:
    """``command``'s wall time and peak memory, with a datasets cache of its own (``cache``): no run reuses another's
    conversion of the corpus to Arrow."""
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, cwd=ROOT, env=env)
    result = json.loads(done.stdout)
    if result["rc"] != 0:
        sys.stderr.write(result["stderr"])
        raise SystemExit(f"failed: {' '.join(command)}")
    return result


def recipe(folder: Path, corpus: Path, name: str, **data) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "method": "sft", "model": {"name": str(ASSETS), "init": "random"},
        "data": {"train": [{"path": str(corpus)}], "max_length": 1024, **data},
        "train": {"output_dir": str(folder / f"out-{name}"), "per_device_train_batch_size": 8, "logging_steps": 50,
                  "save_strategy": "no", "report_to": "none", "seed": 0}}))
    return path


def run_size(folder: Path, corpus: Path, steps: int) -> dict:
    row = {}
    raw = measure(sys.executable, "-c", RAW, str(ASSETS), str(corpus), cache=folder / f"cache-raw-{corpus.stem}")
    tokens = json.loads(raw["stdout"])["tokens"]
    row["raw"] = {"seconds": raw["seconds"], "peak_mb": raw["peak_kb"] / 1024, "tokens_per_s": tokens / raw["seconds"]}
    for procs in (1, 2):
        path = recipe(folder, corpus, f"pre{procs}-{corpus.stem}", num_proc=procs,
                      prepared_path=str(folder / f"prepared{procs}-{corpus.stem}"))
        result = measure(sys.executable, "-m", "ft", "preprocess", str(path),
                         cache=folder / f"cache-pre{procs}-{corpus.stem}")
        stats = json.loads(result["stdout"][result["stdout"].index("{"):])
        row[f"preprocess_{procs}"] = {"seconds": result["seconds"], "peak_mb": result["peak_kb"] / 1024,
                                      "tokens_per_s": stats["train_tokens"] / result["seconds"],
                                      "tokens": stats["train_tokens"]}
    path = recipe(folder, corpus, f"stream-{corpus.stem}", streaming=True)
    yaml_recipe = yaml.safe_load(path.read_text())
    yaml_recipe["train"]["max_steps"] = steps
    path.write_text(yaml.safe_dump(yaml_recipe))
    result = measure(sys.executable, "-m", "ft", "train", str(path), cache=folder / f"cache-stream-{corpus.stem}")
    summary = json.loads((folder / f"out-stream-{corpus.stem}" / "summary.json").read_text())
    row["stream"] = {"seconds": result["seconds"], "peak_mb": result["peak_kb"] / 1024,
                     "tokens_per_s": summary.get("tokens_per_second")}
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=256, help="the 1× corpus in MB (4× is four times it)")
    parser.add_argument("--steps", type=int, default=200, help="steps of the streamed run")
    parser.add_argument("--keep", type=Path, help="keep the corpora and runs here")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ft-data-scale-") as scratch:
        folder = (options.keep or Path(scratch)).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        rows, started = {}, time.perf_counter()
        for scale in (1, 4):
            corpus = folder / f"corpus-{scale}x.jsonl"
            count = write_corpus(corpus, options.mb * scale, seed=scale)
            print(f"{corpus.name}: {corpus.stat().st_size / 1e6:.0f} MB, {count} chats", flush=True)
            rows[scale] = run_size(folder, corpus, options.steps)
        print(f"\n(measured in {time.perf_counter() - started:.0f} s)\n")
        print("| size | what | peak memory (MB) | tokens/s | seconds |")
        print("|---|---|---|---|---|")
        for scale, row in rows.items():
            for name, figures in row.items():
                rate = figures["tokens_per_s"]
                print(f"| {scale}× | {name} | {figures['peak_mb']:.0f} | {rate:,.0f} | {figures['seconds']:.1f} |"
                      if rate is not None else f"| {scale}× | {name} | {figures['peak_mb']:.0f} | | "
                      f"{figures['seconds']:.1f} |")
        print("\ntargets:")
        for name in ("preprocess_1", "preprocess_2", "stream"):
            growth = rows[4][name]["peak_mb"] / rows[1][name]["peak_mb"]
            print(f"  {name}: peak memory 4× / 1× = {growth:.2f} (target ≤ 1.10): "
                  f"{'met' if growth <= 1.10 else 'NOT met'}")
        for scale in (1, 4):
            ratio = rows[scale]["preprocess_1"]["tokens_per_s"] / rows[scale]["raw"]["tokens_per_s"]
            print(f"  {scale}×: preprocess tokens/s / raw tokenizer = {ratio:.2f} (target ≥ 0.8): "
                  f"{'met' if ratio >= 0.8 else 'NOT met'}")
            speedup = rows[scale]["preprocess_2"]["tokens_per_s"] / rows[scale]["preprocess_1"]["tokens_per_s"]
            print(f"  {scale}×: num_proc 2 / num_proc 1 = {speedup:.2f} (target ≥ 1.6): "
                  f"{'met' if speedup >= 1.6 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
