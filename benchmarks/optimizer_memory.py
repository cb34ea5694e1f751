"""Peak memory of a few `ft train` steps under each memory-saving optimizer, against AdamW.

One ~68M-parameter Llama (the shipped tiny-llama config widened to 1024 hidden / 2816 intermediate /
6 layers, vocabulary and tokenizer kept, random init, float32) trains 4 steps of SFT on
`data/arithmetic/train.jsonl` (batch 8, max_length 64, no eval, no checkpoints) through ft itself
(``ft.run.train`` on a recipe file) with each of: adamw_torch (the baseline), adamw_bnb_8bit, adafactor,
galore_adamw (rank 128 on every attention and MLP projection), apollo_adamw as APOLLO-Mini (rank 1,
scale 128, tensor-wise scaling, random projection, on the same modules), lomo and schedule_free_adamw.
Each optimizer runs in its own child process, so one's peak cannot hide another's. Two numbers per run,
each also given as a ratio to AdamW's:

  peak RSS        the child's whole-process peak resident set (``ru_maxrss``, what ft's summary.json
                  reports as ``peak_memory_gb`` on a CPU; CUDA max allocated is added when a GPU is
                  present). It is what a user sees, but it also holds Python, torch/transformers/TRL, the
                  data and the float32 weights (about 0.8 GB when training starts here, 0.25 GB of it
                  weights) and, for all but LOMO, a full set of gradients (another 0.25 GB): parts no
                  optimizer here shrinks. On a model this small they are most of the total, so these ratios
                  sit much closer to 1 than the state ratios; on a 7B model the state dominates instead.
                  "rise" is that peak minus the RSS at the start of training (model built, optimizer
                  created): what training added (gradients, activations, optimizer state, temporaries),
                  libraries and weights left out. The kernel's high-water mark is reset at the start of
                  training (/proc/self/clear_refs) to read it, so a higher peak while loading cannot mask it.
  optimizer state the memory the optimizer keeps between steps, counted after the last step: every tensor
                  reachable from ``optimizer.state`` (moments, 8-bit blocks and their scales, GaLore/APOLLO
                  projection matrices, schedule-free's z copy), each storage once and whole, because a slice
                  keeps all of its storage alive (galore-torch's projector is a slice of the full SVD factor,
                  so it holds about twice the bytes of its tensors here; the script prints both). This is
                  what the published savings are about: AdamW keeps 8 bytes per parameter; 8-bit AdamW about
                  2 (≈ 1/4); Adafactor (no first moment) factored second moments only; GaLore and APOLLO the
                  moments of the projected gradient plus the projector (the embedding, not a Linear, keeps
                  full AdamW state); LOMO none (it updates each parameter during backward and keeps no
                  gradients either); schedule-free AdamW z and the second moment, as many bytes as AdamW (it
                  removes the schedule, not memory: the one row expected not to go below 1).

GB and MB are GiB and MiB. CPU peaks move by tens of MB between runs (allocator, other processes); the
state bytes are exact and repeat. A measurement, not a test: it exits 1 only when a run failed (and
prints the error and the `ft train` command that reproduces it). Run from the repository root with the
project's virtual environment active:

    python benchmarks/optimizer_memory.py        # about 8 minutes on 2 busy cores

``--only NAME`` (repeatable) runs a subset (AdamW always runs, as the baseline); ``--steps`` changes the
number of steps; ``--verbose`` passes each run's trainer output through to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "arithmetic" / "train.jsonl"
WIDE = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 6,
        "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64}  # ~68M parameters
BATCH, MAX_LEN, LR, SEED = 8, 64, 1e-3, 0
PROJECTED = [r".*self_attn.*", r".*mlp.*"]  # GaLore/APOLLO: every attention and MLP projection
OPTIMIZERS = {  # label -> the recipe's optimizer section
    "adamw_torch": {"name": "adamw_torch"},
    "adamw_bnb_8bit": {"name": "adamw_bnb_8bit"},
    "adafactor": {"name": "adafactor"},
    "galore_adamw": {"name": "galore_adamw", "target_modules": PROJECTED,
                     "args": {"rank": 128, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"}},
    "apollo_mini": {"name": "apollo_adamw", "target_modules": PROJECTED,  # transformers' _get_apollo_optimizer keys
                    "args": {"rank": 1, "scale": 128, "scale_type": "tensor", "proj": "random",
                             "update_proj_gap": 200}},
    "lomo": {"name": "lomo"},
    "schedule_free_adamw": {"name": "schedule_free_adamw"},
}
BASELINE = "adamw_torch"
MARK = "OPTIMIZER_MEMORY_RESULT "


# --- the child: one ft run, measured from a callback ------------------------------------------------


def _status_kib(field: str) -> int | None:
    """VmRSS / VmHWM of this process in KiB (None off Linux)."""
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_rss_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM, and with it ru_maxrss) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _maxrss_kib() -> int:
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss // 1024 if sys.platform == "darwin" else rss


def state_bytes(optimizer, params) -> tuple[int, int, int]:
    """(held bytes, tensor bytes, tensors) of everything reachable from ``optimizer.state``: tensors in dicts,
    lists and plain objects such as GaLore/APOLLO projectors, the parameters themselves left out. Held bytes
    count each tensor's whole storage once (a slice keeps all of it alive); tensor bytes sum ``nbytes``."""
    while type(optimizer).__name__ == "AcceleratedOptimizer":  # accelerate's wrapper around the real one
        optimizer = optimizer.optimizer
    import torch

    skip = {p.untyped_storage().data_ptr() for p in params}
    seen_storages: set[int] = set()
    seen_tensors: set[tuple] = set()
    seen_objects: set[int] = set()
    held = logical = 0

    def walk(value) -> None:
        nonlocal held, logical
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            ptr = storage.data_ptr()
            if not ptr or ptr in skip:
                return
            if ptr not in seen_storages:
                seen_storages.add(ptr)
                held += storage.nbytes()
            key = (value.data_ptr(), tuple(value.shape), value.stride(), value.dtype)
            if key not in seen_tensors:
                seen_tensors.add(key)
                logical += value.nbytes
            return
        if isinstance(value, (str, bytes, int, float, bool, type(None), torch.nn.Module)) or id(value) in seen_objects:
            return
        seen_objects.add(id(value))
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple, set)):
            for item in value:
                walk(item)
        elif hasattr(value, "__dict__"):
            for item in vars(value).values():
                walk(item)

    walk(dict(optimizer.state))
    return held, logical, len(seen_tensors)


def _probe_class():
    from transformers import TrainerCallback

    class Probe(TrainerCallback):
        """Memory at the start and end of training, and the optimizer's state after the last step."""

        def __init__(self):
            self.result: dict = {}

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            import torch

            self.result.update(params=sum(p.numel() for p in model.parameters()),
                               start_rss_kib=_status_kib("VmRSS"), before_peak_kib=_maxrss_kib(),
                               peak_reset=_reset_rss_peak())
            if torch.cuda.is_available():
                self.result.update(cuda_start=torch.cuda.memory_allocated(),
                                   cuda_before_peak=torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()

        def on_train_end(self, args, state, control, model=None, optimizer=None, **kwargs):
            import torch

            train_peak = _status_kib("VmHWM") if self.result["peak_reset"] else None
            self.result.update(train_peak_kib=train_peak, peak_kib=max(_maxrss_kib(), train_peak or 0),
                               steps=state.global_step,
                               losses=[round(e["loss"], 4) for e in state.log_history if "loss" in e])
            if torch.cuda.is_available():
                self.result.update(cuda_train_peak=torch.cuda.max_memory_allocated())
                self.result["cuda_peak"] = max(self.result["cuda_train_peak"], self.result["cuda_before_peak"])
            held, logical, tensors = state_bytes(optimizer, list(model.parameters()))
            self.result.update(state_bytes=held, state_tensor_bytes=logical, state_tensors=tensors)

    return Probe()


def child(recipe_path: str) -> int:
    import ft.run.train
    from ft.recipe import load_recipe

    probe = _probe_class()
    with contextlib.redirect_stdout(sys.stderr):
        ft.run.train.train(load_recipe(recipe_path), resume="never", say=lambda line: print(line, file=sys.stderr),
                     callbacks=[probe])
    print(MARK + json.dumps(probe.result), flush=True)
    return 0


# --- the parent: workspace, one child per optimizer, the table ---------------------------------------


def make_model(tmp: Path) -> Path:
    model_dir = tmp / "model"
    shutil.copytree(ROOT / "assets" / "tiny-llama", model_dir)  # tokenizer files come along
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, **WIDE}, indent=2))
    return model_dir


def write_recipe(tmp: Path, model_dir: Path, label: str, optimizer: dict, steps: int) -> Path:
    import yaml

    recipe = {
        "method": "sft",
        "model": {"name": str(model_dir), "init": "random"},
        "data": {"train": [{"path": str(DATA), "format": "chat"}], "eval": [], "max_length": MAX_LEN},
        "optimizer": {"lr": LR, **optimizer},
        "scheduler": {"type": "constant"},  # schedule-free wants it; the schedule costs no memory for the rest
        "train": {"output_dir": str(tmp / "runs" / label), "max_steps": steps, "per_device_train_batch_size": BATCH,
                  "logging_steps": 1, "eval_strategy": "no", "save_strategy": "no", "report_to": "none",
                  "enable_jit_checkpoint": False, "seed": SEED},
    }
    path = tmp / f"{label}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def run_child(recipe: Path, verbose: bool) -> tuple[dict | None, float, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", str(recipe)], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=None if verbose else subprocess.PIPE)
    seconds = time.perf_counter() - started
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):]), seconds, ""
    command = f"{sys.executable} -m ft train {recipe}"
    tail = "\n".join(((done.stderr or "") + done.stdout).strip().splitlines()[-25:])
    return None, seconds, f"exit {done.returncode}; same recipe through the CLI: {command}\n{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per run")
    parser.add_argument("--only", action="append", choices=list(OPTIMIZERS), help="run only these (repeatable)")
    parser.add_argument("--verbose", action="store_true", help="pass each run's trainer output to stderr")
    parser.add_argument("--child", metavar="RECIPE", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        return child(opts.child)
    labels = [BASELINE, *[name for name in OPTIMIZERS if name != BASELINE and (not opts.only or name in opts.only)]]

    results: dict[str, dict] = {}
    failed: dict[str, str] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ft-optmem-") as tmp_name:
        tmp = Path(tmp_name)
        model_dir = make_model(tmp)
        for label in labels:
            recipe = write_recipe(tmp, model_dir, label, OPTIMIZERS[label], opts.steps)
            result, seconds, error = run_child(recipe, opts.verbose)
            if result is None:
                failed[label] = error
                print(f"{label:<20} FAILED after {seconds:.0f}s: {error}", flush=True)
                continue
            results[label] = result
            print(f"{label:<20} {seconds:5.0f}s  steps {result['steps']}  losses {result['losses']}  "
                  f"peak RSS {result['peak_kib'] / 2**20:.3f} GB (start {result['start_rss_kib'] / 2**20:.3f})  "
                  f"state {result['state_bytes'] / 2**20:.1f} MB held, {result['state_tensor_bytes'] / 2**20:.1f} MB "
                  f"in its {result['state_tensors']} tensors", flush=True)
    total = time.perf_counter() - started
    if BASELINE not in results:
        print("\nAdamW failed: no ratios.")
        return 1

    base = results[BASELINE]
    params = base["params"]
    cuda = "cuda_peak" in base
    print(f"\nmodel: {params / 1e6:.1f}M parameters ({params:,}), float32; batch {BATCH}, max_length {MAX_LEN}, "
          f"{opts.steps} steps; each optimizer in its own process; total {total:.0f}s")

    def ratio(value, baseline):
        return f"{value / baseline:.2f}" if baseline else "—"

    def rise(r):  # peak during training above the RSS when training began
        return None if r.get("train_peak_kib") is None else (r["train_peak_kib"] - r["start_rss_kib"]) / 2**20

    header = (f"{'optimizer':<20}{'peak RSS GB':>12}{'×AdamW':>8}{'rise GB':>9}{'×AdamW':>8}"
              f"{'state MB':>10}{'×AdamW':>8}{'B/param':>9}")
    if cuda:
        header += f"{'CUDA peak GB':>14}{'×AdamW':>8}"
    print(header)
    for label in labels:
        if label not in results:
            print(f"{label:<20}{'failed':>12}")
            continue
        r = results[label]
        peak, state = r["peak_kib"] / 2**20, r["state_bytes"] / 2**20
        up, base_up = rise(r), rise(base)
        up_text = f"{up:>9.3f}{ratio(up, base_up):>8}" if up is not None and base_up else f"{'—':>9}{'—':>8}"
        line = (f"{label:<20}{peak:>12.3f}{ratio(peak, base['peak_kib'] / 2**20):>8}{up_text}"
                f"{state:>10.1f}{ratio(state, base['state_bytes'] / 2**20):>8}{r['state_bytes'] / params:>9.2f}")
        if cuda:
            line += f"{r['cuda_peak'] / 2**30:>14.3f}{ratio(r['cuda_peak'], base['cuda_peak']):>8}"
        print(line)
    print("peak RSS: whole process (libraries, data, weights included); rise: peak during training minus RSS at its "
          "start; state: tensors kept in optimizer.state after the last step (AdamW: 8 B/param).")
    for label, r in results.items():
        if r["state_bytes"] > 1.05 * r["state_tensor_bytes"]:
            print(f"{label}: its state tensors are {r['state_tensor_bytes'] / 2**20:.1f} MB "
                  f"(×AdamW {r['state_tensor_bytes'] / base['state_bytes']:.2f}) but keep "
                  f"{r['state_bytes'] / 2**20:.1f} MB of storage alive (slices of larger tensors).")
    for label, error in failed.items():
        print(f"\n{label} failed: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
