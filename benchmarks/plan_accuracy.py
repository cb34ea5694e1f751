"""`ft plan`'s estimate of peak training memory against the peak measured while ft trains.

One ~65M-parameter Llama (the shipped tiny-llama config and tokenizer, widened to hidden 512 / intermediate 1408 /
10 layers / 8 heads of 64, vocabulary 32000, untied head; random init, float32) trains a few SFT steps through ft
itself (``ft.run.train`` on a generated recipe) on rows of generated text longer than ``max_length``, so every
sequence is full (``ft plan`` estimates for full sequences). Each configuration runs in its own child process:

  measured   CPU: the child's peak RSS minus its RSS after the libraries are imported, before the tokenizer, data
             and model load (the kernel's high-water mark is reset there, /proc/self/clear_refs). The children run
             with glibc's ``MALLOC_MMAP_THRESHOLD_=65536``, so every tensor of 64 KiB or more is its own mapping and
             freed memory leaves the RSS: the peak then follows the live tensors, as CUDA's
             ``max_memory_allocated`` does. The last row runs with glibc's default instead, to show what the
             allocator adds on top (freed heap kept for reuse).
             CUDA: ``torch.cuda.max_memory_allocated()`` when a GPU is present.
  estimate   ``ft plan``'s total for the same recipe (``--device cpu``, or ``cuda`` on a GPU), computed in the parent.

Configurations: full fine-tuning with adamw_torch, adamw_8bit (bitsandbytes), galore_adamw (rank 64 on every
attention and MLP projection) and lomo, with and without gradient checkpointing; LoRA (r 16, all-linear) with and
without; a short batch (1 × 64 tokens) whose peak is the optimizer step; and, only when asked for on a CPU
(``--only bf16``, ``--only qlora``: about 6-7 minutes each there), bf16 autocast over float32 weights and LoRA on a
4-bit base (bitsandbytes).
Batch 4 × 256 tokens otherwise, 3 steps. Target: every ratio estimate / measured within 0.85-1.15.

A measurement, not a test: it exits 1 only when a run failed. Run from the repository root with the project's
virtual environment active:

    python benchmarks/plan_accuracy.py          # about 7-8 minutes on 2 cores

``--only LABEL`` (repeatable, a substring of the label) runs a subset; ``--verbose`` shows each run's output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
WIDE = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 10, "num_attention_heads": 8,
        "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 32000, "tie_word_embeddings": False}
BATCH, MAX_LEN, STEPS = 4, 256, 3
PROJECTED = [r".*self_attn.*", r".*mlp.*"]
LORA = {"kind": "lora", "r": 16}
CONFIGS = {  # label -> changes to the base recipe (section -> keys), and whether glibc keeps its default
    "full adamw_torch": {},
    "full adamw_torch +ckpt": {"train": {"gradient_checkpointing": True}},
    "full adamw_8bit": {"optimizer": {"name": "adamw_8bit"}},
    "full adamw_8bit +ckpt": {"optimizer": {"name": "adamw_8bit"}, "train": {"gradient_checkpointing": True}},
    "full galore_adamw r64": {"optimizer": {"name": "galore_adamw", "target_modules": PROJECTED,
                                            "args": {"rank": 64}}},
    "full lomo": {"optimizer": {"name": "lomo"}, "train": {"max_grad_norm": 0}},
    "full lomo +ckpt": {"optimizer": {"name": "lomo"}, "train": {"max_grad_norm": 0, "gradient_checkpointing": True}},
    "lora r16 adamw_torch": {"adapter": LORA},
    "lora r16 adamw_torch +ckpt": {"adapter": LORA, "train": {"gradient_checkpointing": True}},
    "qlora r16 (4-bit base)": {"adapter": LORA, "model": {"quantization": {"bits": 4}}},  # slow on a CPU
    "full adamw_torch 1×64 tokens": {"data": {"max_length": 64}, "train": {"per_device_train_batch_size": 1}},
    "full adamw_torch, glibc malloc": {"glibc": True},
    "full adamw_torch bf16 autocast": {"train": {"bf16": True}},  # slow on a CPU: only with --only bf16
}
# about 6-7 minutes each on 2 cores (bfloat16 matmuls and 4-bit dequantization are slow on most CPUs)
SLOW = {"full adamw_torch bf16 autocast", "qlora r16 (4-bit base)"}
MARK = "PLAN_ACCURACY_RESULT "


# --- the child: one ft run, measured ---------------------------------------------------------------------------------


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


def child(recipe_path: str) -> int:
    """Import what training imports, take the RSS, train, and print the peak above it."""
    import bitsandbytes  # noqa: F401  (optimizers and quantization import it while training)
    import datasets  # noqa: F401
    import galore_torch  # noqa: F401
    import lomo_optim  # noqa: F401
    import peft  # noqa: F401
    import torch
    import transformers.models.llama.modeling_llama  # noqa: F401
    import trl  # noqa: F401

    import ft.run.train
    import ft.trainers.sft  # noqa: F401
    from ft.recipe import load_recipe

    torch.ones(64, 64) @ torch.ones(64, 64)  # start torch's thread pool before the baseline
    cuda = torch.cuda.is_available()
    baseline = _status_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS mark to the current RSS (Linux >= 4.0)
    with contextlib.redirect_stdout(sys.stderr):
        result = ft.run.train.train(load_recipe(recipe_path), resume="never", overwrite=True,
                              say=lambda line: print(line, file=sys.stderr))
    measured = torch.cuda.max_memory_allocated() if cuda else _status_bytes("VmHWM") - baseline
    print(MARK + json.dumps({"measured": measured, "steps": result.summary.get("steps"), "cuda": cuda}), flush=True)
    return 0


# --- the parent -----------------------------------------------------------------------------------------------------


def make_workspace(tmp: Path) -> tuple[Path, Path]:
    model = tmp / "model"
    shutil.copytree(ROOT / "assets" / "tiny-llama", model)  # tokenizer files come along
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **WIDE}, indent=2))
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "seven", "nine", "the", "of", "and", "what", "is", "calculator"]
    data = tmp / "text.jsonl"
    with data.open("w") as f:  # rows far longer than max_length: every sequence is full
        for _ in range(64):
            f.write(json.dumps({"text": " ".join(f"{rng.choice(words)}{rng.randint(0, 99)}" for _ in range(400))})
                    + "\n")
    return model, data


def write_recipe(tmp: Path, model: Path, data: Path, label: str, changes: dict) -> Path:
    import yaml

    recipe = {
        "method": "sft",
        "model": {"name": str(model), "init": "random"},
        "data": {"train": [{"path": str(data), "format": "text"}], "max_length": MAX_LEN, "train_on": "all"},
        "optimizer": {"name": "adamw_torch", "lr": 1e-4},
        "scheduler": {"type": "constant"},
        "train": {"output_dir": str(tmp / "runs" / re.sub(r"\W+", "-", label)), "max_steps": STEPS,
                  "per_device_train_batch_size": BATCH, "logging_steps": 1, "eval_strategy": "no",
                  "save_strategy": "no", "report_to": "none", "enable_jit_checkpoint": False, "seed": 0,
                  "gradient_checkpointing": False},
    }
    for section, keys in changes.items():
        if section != "glibc":
            recipe[section] = {**recipe.get(section, {}), **keys}
    path = tmp / (re.sub(r"\W+", "-", label) + ".yaml")
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def plan_estimate(recipe: Path, device: str):
    from ft.plan.memory import estimate, setup_for
    from ft.plan.shape import read_shape
    from ft.recipe import load_recipe

    loaded = load_recipe(recipe).recipe
    shape = read_shape(loaded)
    return estimate(shape, setup_for(loaded, shape, device=device))


def run_child(recipe: Path, glibc_default: bool, verbose: bool) -> tuple[dict | None, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if not glibc_default:
        env.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    done = subprocess.run([sys.executable, __file__, "--child", str(recipe)], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=None if verbose else subprocess.PIPE)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):]), ""
    tail = "\n".join(((done.stderr or "") + done.stdout).strip().splitlines()[-20:])
    return None, f"exit {done.returncode}; reproduce with: {sys.executable} -m ft train {recipe}\n{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="run the configurations whose label contains this")
    parser.add_argument("--verbose", action="store_true", help="pass each run's output through to stderr")
    parser.add_argument("--child", metavar="RECIPE", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        return child(opts.child)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    labels = [label for label in CONFIGS if any(part in label for part in opts.only)] if opts.only else [
        label for label in CONFIGS if label not in SLOW or device == "cuda"]
    if device == "cuda":  # the allocator row is about glibc
        labels = [label for label in labels if "glibc" not in CONFIGS[label]]
    rows, failed, started = [], [], time.perf_counter()
    header = f"{'configuration':<34}{'estimate MiB':>13}{'measured MiB':>13}{'ratio':>7}  {'peak in':<16}{'s':>5}"
    with tempfile.TemporaryDirectory(prefix="ft-plan-accuracy-") as tmp_name:
        tmp = Path(tmp_name)
        model, data = make_workspace(tmp)
        print(header, flush=True)
        for label in labels:
            recipe = write_recipe(tmp, model, data, label, CONFIGS[label])
            est = plan_estimate(recipe, device)
            t0 = time.perf_counter()
            result, error = run_child(recipe, "glibc" in CONFIGS[label], opts.verbose)
            seconds = time.perf_counter() - t0
            if result is None:
                failed.append((label, error))
                print(f"{label:<34}{est.total / 2**20:>13.0f}{'failed':>13}", flush=True)
                continue
            ratio = est.total / result["measured"]
            rows.append(ratio)
            print(f"{label:<34}{est.total / 2**20:>13.0f}{result['measured'] / 2**20:>13.0f}{ratio:>7.2f}  "
                  f"{est.phase:<16}{seconds:>5.0f}", flush=True)
    params = est.params if labels else 0
    measured = "CUDA max allocated" if device == "cuda" else "peak RSS above the imported libraries"
    print(f"\nmodel: {params / 1e6:.1f}M parameters, float32, random init; batch {BATCH} × {MAX_LEN} tokens unless "
          f"noted, {STEPS} steps; measured: {measured}; total {time.perf_counter() - started:.0f}s")
    if rows:
        within = sum(0.85 <= r <= 1.15 for r in rows)
        print(f"ratios {min(rows):.2f}-{max(rows):.2f}; {within} of {len(rows)} within 0.85-1.15 (target: all)")
    for label, error in failed:
        print(f"\n{label} failed: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
