"""Data at scale, measured side by side in one run: does preprocessing's cost grow only with the data, and does a
streamed run's memory stay flat as the corpus grows?

For chat corpora of 1× and 4× a size (``--mb``, the 1× size in MB; the issue's target run is ``--mb 256``: 1 GB at
4×), each in its own process, one at a time:

1. a raw batched tokenizer call on the rendered chats (the floor: no reading, checking, masking or writing), with
   the tokenizer's own threads (its default) and with one (``RAYON_NUM_THREADS=1``);
2. ``ft preprocess`` (read → check rows → tokenize with masks → length column → write) with ``data.num_proc`` 1 (this
   process: the tokenizer's threads as in 1, and with one thread) and 2 (two workers, each tokenizer single-threaded:
   datasets turns the threads off in workers); ``data.max_length`` keeps every token, so each counts the tokens the
   raw call counts;
3. a streamed ``ft train`` (``data.streaming: true``) of ``--steps`` steps on the tiny model.

It prints, for each, peak resident memory (the largest process of its tree, from ``getrusage``), peak anonymous memory
(the whole tree, sampled) and tokens/s over the whole command (start-up included: at the target sizes it is a few
seconds of minutes), then the targets: peak memory of preprocessing and of the streamed run grows by at most 10% from
1× to 4×; preprocessing tokens/s ≥ 0.8× the raw tokenizer's at each size, each with as many tokenizer threads;
``num_proc: 2`` ≥ 1.6× ``num_proc: 1`` (against both: where the tokenizer's threads already use the cores, two
processes can only share out the rest). Results go in benchmarks/README.md with the date. It exits 1 only when a
command fails; the corpora and runs are removed as it goes, unless ``--keep``.

    python benchmarks/data_scale.py [--mb 256] [--steps 200] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets" / "tiny-llama"
ONE_THREAD = {"RAYON_NUM_THREADS": "1"}  # the tokenizer's Rust thread pool: one thread, as in datasets' workers
MAX_LENGTH = 8192  # above the longest chat written here: every run counts the same tokens as the raw call
WORDS = ("the model learns to add numbers and answer questions about short stories while the loss falls every step "
         "of training on a small machine with a long corpus read from disk").split()

# Runs one measured command in a child, then prints as JSON: the wall time; the peak resident memory of the largest
# process of its tree (getrusage(RUSAGE_CHILDREN): each measurement is its own process tree); and the peak of the
# tree's anonymous memory (Pss_Anon, summed over its processes, so pages a forked worker shares with its parent count
# once; read from /proc every 100 ms): what the machine must hold. Resident memory also counts the pages of
# memory-mapped Arrow files a process has read, which the kernel drops under pressure; anonymous memory does not.
MEASURE = """
import json, os, resource, subprocess, sys, threading, time

def anonymous_kb(root):
    total, pids = 0, [root]
    while pids:
        pid = pids.pop()
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss_Anon:"))
            for task in os.listdir(f"/proc/{pid}/task"):  # a child started by any thread
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    pids += [int(child) for child in f.read().split()]
        except (OSError, StopIteration):
            pass
    return total

started = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
peak_anon, done = 0, threading.Event()

def sample():
    global peak_anon
    while not done.wait(0.1):
        peak_anon = max(peak_anon, anonymous_kb(child.pid))

sampler = threading.Thread(target=sample)
sampler.start()
stdout, stderr = child.communicate()
done.set()
sampler.join()
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": child.returncode, "seconds": seconds, "peak_kb": peak, "anon_kb": peak_anon,
                  "stdout": stdout[-20000:], "stderr": stderr[-3000:]}))
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


def measure(*command: str, cache: Path, **env: str) -> dict:
    """``command``'s wall time and peak memory, with a datasets cache of its own (``cache``, removed after unless
    --keep): no run reuses another's conversion of the corpus to Arrow."""
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "TQDM_DISABLE": "1", **env}
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
        "data": {"train": [{"path": str(corpus)}], "max_length": MAX_LENGTH, **data},
        "train": {"output_dir": str(folder / f"out-{name}"), "per_device_train_batch_size": 8, "logging_steps": 50,
                  "save_strategy": "no", "report_to": "none", "seed": 0}}))
    return path


def run_size(folder: Path, corpus: Path, steps: int, keep: bool) -> dict:
    row = {}
    for name, env in (("raw", {}), ("raw_one_thread", ONE_THREAD)):
        raw = measure(sys.executable, "-c", RAW, str(ASSETS), str(corpus), cache=folder / f"cache-{name}", **env)
        tokens = json.loads(raw["stdout"])["tokens"]
        row[name] = {**_memory(raw), "seconds": raw["seconds"], "tokens_per_s": tokens / raw["seconds"]}
    for name, procs, env in (("preprocess_1", 1, {}), ("preprocess_1_one_thread", 1, ONE_THREAD),
                             ("preprocess_2", 2, {})):
        prepared = folder / f"prepared-{name}-{corpus.stem}"
        path = recipe(folder, corpus, f"{name}-{corpus.stem}", num_proc=procs, prepared_path=str(prepared))
        result = measure(sys.executable, "-m", "ft", "preprocess", str(path), cache=folder / f"cache-{name}", **env)
        stats = json.loads(result["stdout"][result["stdout"].index("{"):])
        if stats["train_tokens"] != tokens:
            raise SystemExit(f"ft preprocess kept {stats['train_tokens']} tokens, the raw call {tokens}: the two "
                             f"rates would not compare the same work")
        row[name] = {**_memory(result), "seconds": result["seconds"], "tokens_per_s": tokens / result["seconds"]}
        if not keep:
            shutil.rmtree(prepared)
    path = recipe(folder, corpus, f"stream-{corpus.stem}", streaming=True)
    yaml_recipe = yaml.safe_load(path.read_text())
    yaml_recipe["train"]["max_steps"] = steps
    path.write_text(yaml.safe_dump(yaml_recipe))
    result = measure(sys.executable, "-m", "ft", "train", str(path), cache=folder / "cache-stream")
    summary = json.loads((folder / f"out-stream-{corpus.stem}" / "summary.json").read_text())
    row["stream"] = {**_memory(result), "seconds": result["seconds"], "tokens_per_s": summary.get("tokens_per_second")}
    if not keep:
        for cache in folder.glob("cache-*"):
            shutil.rmtree(cache)
    return row


def _memory(result: dict) -> dict:
    return {"peak_mb": result["peak_kb"] / 1024, "anon_mb": result["anon_kb"] / 1024}


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
            rows[scale] = run_size(folder, corpus, options.steps, keep=options.keep is not None)
        print(f"\n(measured in {time.perf_counter() - started:.0f} s)\n")
        print("| size | what | peak RSS, largest process (MB) | peak anonymous memory, all processes (MB) | "
              "tokens/s | seconds |")
        print("|---|---|---|---|---|---|")
        for scale, row in rows.items():
            for name, figures in row.items():
                rate = "" if figures["tokens_per_s"] is None else f"{figures['tokens_per_s']:,.0f}"
                print(f"| {scale}× | {name} | {figures['peak_mb']:.0f} | {figures['anon_mb']:.0f} | {rate} | "
                      f"{figures['seconds']:.1f} |")
        print("\ntargets:")
        for name in ("preprocess_1", "preprocess_2", "stream"):
            for memory, what in (("peak_mb", "peak RSS"), ("anon_mb", "peak anonymous memory")):
                growth = rows[4][name][memory] / rows[1][name][memory]
                print(f"  {name}: {what} 4× / 1× = {growth:.2f} (target ≤ 1.10): "
                      f"{'met' if growth <= 1.10 else 'NOT met'}")
        pairs = (("preprocess_1", "raw", 0.8), ("preprocess_1_one_thread", "raw_one_thread", 0.8),
                 ("preprocess_2", "preprocess_1", 1.6), ("preprocess_2", "preprocess_1_one_thread", 1.6))
        for scale in (1, 4):
            for name, base, target in pairs:
                ratio = rows[scale][name]["tokens_per_s"] / rows[scale][base]["tokens_per_s"]
                print(f"  {scale}×: {name} / {base} tokens/s = {ratio:.2f} (target ≥ {target}): "
                      f"{'met' if ratio >= target else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
