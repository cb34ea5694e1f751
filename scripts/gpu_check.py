#!/usr/bin/env python3
"""ft's GPU-only paths, each a short step with its own time limit, on one CUDA machine, with a results table.

Steps (``--dry-run`` prints them with the exact commands): bf16 training of the quickstart; 4- and 8-bit QLoRA;
``ft merge`` and ``ft generate`` of the 4-bit run; one throughput figure (a ~0.47B random-init Llama through ft's
real training path: tokens/s and MFU); the CUDA-only and GPU-relevant optimizers; ``ft train RECIPE --smoke`` of
every shipped recipe. Each step is one subprocess under its own timeout and ends PASS, FAIL or SKIP with the reason
and its seconds. A global deadline (``--deadline``, 450 s by default, counted from ``FT_GPU_CHECK_STARTED`` when
``scripts/gpu-check.sh`` set it) skips what no longer fits, marked ``SKIP (deadline)``, rather than overrun.

The table (step, result, seconds, note), with the date, the GPU and the library versions, goes to stdout and, when
``$OUT`` (or ``--out``) is set, to ``$OUT/gpu-results.md`` with ``gpu-results.json`` and the output tails of failed
steps. Every step's full output is kept under ``<workdir>/logs/``. See docs/gpu-results.md.

    bash scripts/gpu-check.sh                      # environment check and install, then this script
    python scripts/gpu_check.py --dry-run [--json] # the steps and their commands; no CUDA needed, nothing run
    python scripts/gpu_check.py --only qlora-4bit,merge,optim

Exit: 0 no step failed; 1 a step failed; 2 bad arguments; 3 no CUDA device (or torch) in this interpreter.
Only the standard library is imported here; torch, transformers and ft run in the subprocesses (and in the
throughput worker, ``--throughput-worker``, which this script starts as one of them).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
QUICKSTART = "recipes/quickstart.yaml"
TINY_LLAMA = ROOT / "assets" / "tiny-llama"
PROMPT = "What is 12 + 7?"
EXIT_FAILED, EXIT_USAGE, EXIT_NO_CUDA = 1, 2, 3
DEFAULT_DEADLINE = 450  # seconds for the whole check (wrapper included when it set FT_GPU_CHECK_STARTED): 8 min - 30 s
MIN_START = 20  # a step starts only with this much time left (or its whole budget, if smaller)
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"

# dense bf16 peak FLOP/s by GPU name (regex searched in torch.cuda.get_device_name), first match wins; else MFU n/a
PEAK_BF16 = [
    (r"H200 NVL", 835e12), (r"H200", 989e12), (r"GH200", 989e12),
    (r"H100 PCIe", 756e12), (r"H100 NVL", 835e12), (r"H100|H800", 989e12),
    (r"B200", 2250e12), (r"A100|A800", 312e12), (r"L40S", 362e12), (r"\bL4\b", 121e12),
]

# the throughput model: a Llama of ~0.47B parameters (0.40B in the blocks, 2 x 32.8M embedding and head), built
# from its config (model.init: random) with the tiny-llama tokenizer (512 ids, all valid in a 32000-row embedding)
THROUGHPUT_CONFIG = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                     "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64, "vocab_size": 32000,
                     "tie_word_embeddings": False, "max_position_embeddings": 2048}
# rows of ~100 tokens, so that best-fit packing fills each 1024-token sequence almost to the end; 6000 rows are ~600k
# tokens, more than 30 steps of 16 x 1024 take
THROUGHPUT = {"max_length": 1024, "batch": 16, "steps": 30, "warmup": 5, "rows": 6000, "row_chars": 160}


# --------------------------------------------------------------------------------------------------------------------
# steps


@dataclass
class Proc:
    argv: list[str]
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False


@dataclass
class Step:
    name: str
    budget: int  # seconds: the subprocess's timeout
    about: str
    command: Callable[[str], list[str]]  # workdir -> argv; argv[0] "ft" runs `python -m ft`, "python" this python
    check: Callable[[str, Proc], tuple]  # (workdir, finished process) -> (PASS/FAIL, note[, data for the JSON])
    needs: tuple[str, ...] = ()  # steps that must PASS first (pulled in by --only)
    requires: tuple[str, ...] = ()  # modules that must import, else SKIP
    files: tuple[str, ...] = ()  # files that must exist (a recipe's GGUF model: scripts/get_smollm2.py), else SKIP
    parallel: bool = False  # may run next to other such steps (--jobs)
    prepare: Callable[[str], None] | None = None  # writes what the command reads (not run by --dry-run)
    clean: tuple[str, ...] = ()  # paths under the workdir removed before the step runs (outputs of an earlier check)


@dataclass
class Result:
    name: str
    result: str
    seconds: float
    note: str
    command: str = ""
    tail: str = ""  # the end of the output of a failed step
    data: dict = field(default_factory=dict)  # figures a check measured (throughput), for gpu-results.json


def _path(work: str, *parts: str) -> str:
    return "/".join([work.rstrip("/"), *parts])


def _abs(path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else ROOT / path


def quickstart_train(name: str, *sets: str) -> Callable[[str], list[str]]:
    """`ft train` of the quickstart for 20 steps into <workdir>/<name>, with extra `--set`s."""

    def command(work: str) -> list[str]:
        overrides = ["train.max_steps=20", "train.logging_steps=5", f"train.output_dir={_path(work, name)}", *sets]
        return ["ft", "train", QUICKSTART, *[arg for item in overrides for arg in ("--set", item)],
                "--resume", "never", "--overwrite"]

    return command


def _last_lines(text: str, n: int = 2, width: int = 240) -> str:
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return " / ".join(lines[-n:])[-width:] or "(no output)"


def _device_line(proc: Proc) -> str | None:
    """What `ft train` said it trained on: `1× NVIDIA H200` or `CPU (no CUDA device)`."""
    found = re.search(r"^ft: \w+ on (.+?)(?: × \d+ processes)?; output in", proc.stdout + proc.stderr, re.M)
    return found.group(1) if found else None


def _fmt(value, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def check_run(name: str, *, on_gpu: bool = True, smoke: bool = False, bits: int | None = None):
    """PASS when the run exited 0 with summary.json `completed`, finite losses and (``on_gpu``) a CUDA device."""

    def check(work: str, proc: Proc) -> tuple[str, str]:
        if proc.rc != 0:
            return FAIL, f"exit {proc.rc}: {_last_lines(proc.stderr or proc.stdout)}"
        out = _abs(_path(work, name + ("-smoke" if smoke else "")))
        try:
            summary = json.loads((out / "summary.json").read_text())
        except (OSError, ValueError) as exc:
            return FAIL, f"no readable summary.json in {out}: {exc}"
        losses = [summary.get(key) for key in ("first_train_loss", "last_train_loss", "eval_loss")]
        note = (f"loss {_fmt(losses[0])} → {_fmt(losses[1])}, eval {_fmt(losses[2])}; "
                f"{_fmt(summary.get('tokens_per_second'), '.0f')} tok/s; peak {_fmt(summary.get('peak_memory_gb'))} GB")
        device = _device_line(proc)
        if smoke:  # a smoke run trains on the CPU (use_cpu) whatever the machine has
            note += "; CPU by design"
        else:
            note += f"; on {device}" if device else "; (ft's `… on <device>` line not found)"
        if summary.get("status") != "completed":
            return FAIL, f"summary.json status {summary.get('status')!r}; {note}"
        if losses[1] is None or not all(math.isfinite(v) for v in losses if v is not None):
            return FAIL, f"loss missing or not finite; {note}"
        if on_gpu and device is not None and "CPU" in device:
            return FAIL, f"did not train on a CUDA device; {note}"
        if bits is not None:
            quantization = (summary.get("base_model") or {}).get("quantization") or {}
            if quantization.get("bits") != bits:
                return FAIL, f"summary.json base_model.quantization is {quantization or None}, not {bits}-bit; {note}"
        return PASS, note

    return check


def check_merge(name: str):
    def check(work: str, proc: Proc) -> tuple[str, str]:
        if proc.rc != 0:
            return FAIL, f"exit {proc.rc}: {_last_lines(proc.stderr or proc.stdout)}"
        out = _abs(_path(work, name))
        weights = sorted(p.name for p in out.glob("*.safetensors"))
        if not (out / "config.json").is_file() or not weights:
            return FAIL, f"{out} lacks config.json or *.safetensors ({sorted(p.name for p in out.glob('*'))})"
        size = sum(p.stat().st_size for p in out.glob("*.safetensors")) / 2**20
        return PASS, f"{len(weights)} safetensors file(s), {size:.1f} MiB, config.json and tokenizer in {out.name}/"

    return check


def check_generate(work: str, proc: Proc) -> tuple[str, str]:
    if proc.rc != 0:
        return FAIL, f"exit {proc.rc}: {_last_lines(proc.stderr or proc.stdout)}"
    return PASS, f"completion {proc.stdout.strip()[:60]!r} (20 training steps: any text will do)"


def train_step(name: str, budget: int, about: str, *sets: str, requires: tuple[str, ...] = (), bits=None,
               parallel: bool = False) -> Step:
    return Step(name, budget, about, quickstart_train(name, *sets), check_run(name, bits=bits), requires=requires,
                parallel=parallel)


# optimizer name -> extra --set overrides it needs on the quickstart
OPTIMIZERS: dict[str, tuple[str, ...]] = {
    "adamw_torch_fused": (),
    "adamw_8bit": (),
    "paged_adamw_8bit": (),
    "adalomo": ("train.max_grad_norm=0",),  # LOMO-style: clipping does nothing, 0 says so
    "galore_adamw_8bit": ("optimizer.target_modules=[.*self_attn.*,.*mlp.*]", "optimizer.args.rank=16",
                          "optimizer.args.update_proj_gap=10"),
    "lomo": ("train.max_grad_norm=0",),
}
OPTIMIZER_MODULES = {"adamw_8bit": ("bitsandbytes",), "paged_adamw_8bit": ("bitsandbytes",),
                     "adalomo": ("lomo_optim",), "lomo": ("lomo_optim",),
                     "galore_adamw_8bit": ("galore_torch", "bitsandbytes")}


def shipped_recipes() -> list[Path]:
    return sorted(RECIPES.glob("*.yaml"))


def smoke_step(recipe: Path) -> Step:
    name = f"smoke-{recipe.stem}"
    rel = recipe.relative_to(ROOT).as_posix()

    def command(work: str) -> list[str]:
        return ["ft", "train", rel, "--smoke", "--set", f"train.output_dir={_path(work, name)}"]

    model = (yaml.safe_load(recipe.read_text()) or {}).get("model") or {}
    gguf = (str((recipe.parent / model["name"] / model["gguf_file"]).resolve()),) if model.get("gguf_file") else ()
    return Step(name, 90, f"`ft train {rel} --smoke` (a CPU rehearsal by design) passes on the GPU machine",
                command, check_run(name, on_gpu=False, smoke=True), parallel=True, files=gguf)


def build_steps() -> list[Step]:
    steps = [
        train_step("bf16", 90, "bf16 training of the quickstart, 20 steps", "train.bf16=true"),
        jit_step(1),  # what preemptible GPUs need most, right after plain training
        train_step("qlora-4bit", 120, "4-bit QLoRA (NF4) of the quickstart on the GPU, 20 steps",
                   "model.quantization.bits=4", "adapter.kind=lora", requires=("bitsandbytes",), bits=4),
        train_step("qlora-8bit", 120, "8-bit (LLM.int8) QLoRA of the quickstart on the GPU, 20 steps",
                   "model.quantization.bits=8", "adapter.kind=lora", requires=("bitsandbytes",), bits=8),
        Step("merge", 60, "`ft merge` of the 4-bit QLoRA run (base unquantized in bf16 + adapter)",
             lambda work: ["ft", "merge", _path(work, "qlora-4bit"), "--out", _path(work, "qlora-4bit-merged")],
             check_merge("qlora-4bit-merged"), needs=("qlora-4bit",), clean=("qlora-4bit-merged",)),
        Step("generate-adapter", 60, "`ft generate` of the 4-bit QLoRA run (quantized base + adapter, PEFT)",
             lambda work: ["ft", "generate", _path(work, "qlora-4bit"), "--prompt", PROMPT, "--max-new-tokens", "8"],
             check_generate, needs=("qlora-4bit",)),
        Step("generate-merged", 60, "`ft generate` of the merged model",
             lambda work: ["ft", "generate", _path(work, "qlora-4bit-merged"), "--prompt", PROMPT,
                           "--max-new-tokens", "8"], check_generate, needs=("merge",)),
        Step("throughput", 180, f"tokens/s and MFU: {THROUGHPUT_CONFIG['num_hidden_layers']}-layer, hidden "
             f"{THROUGHPUT_CONFIG['hidden_size']} random-init Llama (~0.47B), packing, bf16, max_length "
             f"{THROUGHPUT['max_length']}, batch {THROUGHPUT['batch']}, {THROUGHPUT['steps']} steps "
             f"({THROUGHPUT['warmup']} untimed), through ft.run.train",
             lambda work: ["python", "scripts/gpu_check.py", "--throughput-worker",
                           _path(work, "throughput", "recipe.yaml"), "--result",
                           _path(work, "throughput", "result.json")],
             check_throughput, prepare=lambda work: prepare_throughput(work), clean=("throughput",)),
        jit_step(2),
    ]
    for name, sets in OPTIMIZERS.items():
        steps.append(train_step(f"optim-{name}", 90, f"optimizer `{name}` on the quickstart, 20 steps",
                                f"optimizer.name={name}", *sets, requires=OPTIMIZER_MODULES.get(name, ()),
                                parallel=True))
    steps.append(train_step("optim-liger", 90, "Liger kernels (train.use_liger_kernel) on the quickstart, 20 steps",
                            "train.use_liger_kernel=true", requires=("liger_kernel",), parallel=True))
    steps += [smoke_step(recipe) for recipe in shipped_recipes()]
    return steps


# --------------------------------------------------------------------------------------------------------------------
# throughput


def throughput_recipe(work: str, **sizes) -> str:
    size = {**THROUGHPUT, **sizes}
    return f"""\
# written by scripts/gpu_check.py for its throughput step: a random-init Llama (model/config.json, the tiny-llama
# tokenizer) on generated text (text.jsonl), packed, bf16
method: sft
model: {{name: model, init: random, attn_implementation: sdpa}}
data:
  train: [{{path: text.jsonl, format: text}}]
  max_length: {size['max_length']}
  packing: true
optimizer: {{name: adamw_torch_fused, lr: 3.0e-4, weight_decay: 0.0}}
scheduler: {{type: constant}}
train:
  output_dir: {_path(work, 'throughput', 'run')}
  max_steps: {size['steps']}
  per_device_train_batch_size: {size['batch']}
  bf16: true
  activation_checkpointing: false
  logging_steps: 10
  save_strategy: "no"
  include_num_input_tokens_seen: all
  report_to: none
  seed: 0
"""


def prepare_throughput(work: str, config: dict | None = None, **sizes) -> Path:
    """<workdir>/throughput/: model/ (the tiny-llama tokenizer with a ~0.47B config), text.jsonl, recipe.yaml."""
    import random

    size = {**THROUGHPUT, **sizes}
    folder = _abs(_path(work, "throughput"))
    model = folder / "model"
    model.mkdir(parents=True, exist_ok=True)
    for item in TINY_LLAMA.iterdir():
        if item.name != "config.json":
            shutil.copy(item, model / item.name)
    base = json.loads((TINY_LLAMA / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**base, **(config or THROUGHPUT_CONFIG)}, indent=2) + "\n")
    rng = random.Random(0)
    words = ["the", "sum", "of", "and", "is", "what", "plus", "minus", "equals", "number", "then", "add", "take"]
    with open(folder / "text.jsonl", "w") as f:
        for _ in range(size["rows"]):  # about 0.64 tokens of the tiny-llama tokenizer per character
            parts: list[str] = []
            while sum(map(len, parts)) < size["row_chars"]:
                a, b = rng.randint(0, 999), rng.randint(0, 999)
                parts.append(f"{rng.choice(words).capitalize()} {rng.choice(words)} {a} + {b} is {a + b}. ")
            f.write(json.dumps({"text": "".join(parts).strip()}) + "\n")
    recipe = folder / "recipe.yaml"
    recipe.write_text(throughput_recipe(work, **sizes))
    return recipe


def throughput_worker(recipe: str, result: str, sets: list[str], warmup: int) -> int:
    """`ft train` of the throughput recipe in this process (ft.run.train, the path the CLI takes), timing the steps
    after ``warmup`` with a callback; writes tokens/s, step time, parameters and peak memory to ``result``."""
    import torch
    from transformers import TrainerCallback

    import ft.run.train
    from ft.recipe import load_recipe

    class Clock(TrainerCallback):
        def __init__(self):
            self.marks: list[tuple[float, int]] = []
            self.params = self.embedding = 0

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.params = sum(p.numel() for p in model.parameters())
            self.embedding = model.get_input_embeddings().weight.numel()

        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.marks.append((time.perf_counter(), int(state.num_input_tokens_seen)))

    clock = Clock()
    loaded = load_recipe(recipe, sets)
    ft.run.train.train(loaded, resume="never", overwrite=True, callbacks=[clock],
                       say=lambda line: print(line, flush=True))
    timed = clock.marks[warmup - 1:]  # marks[i] ends step i + 1: from the end of the warm-up to the last step
    if len(timed) < 2:
        raise SystemExit(f"only {len(clock.marks)} steps ran; need more than the {warmup} warm-up steps")
    (t0, tok0), (t1, tok1) = timed[0], timed[-1]
    cuda = torch.cuda.is_available()
    out = {"tokens_per_second": (tok1 - tok0) / (t1 - t0), "step_seconds": (t1 - t0) / (len(timed) - 1),
           "timed_steps": len(timed) - 1, "tokens_per_step": (tok1 - tok0) / (len(timed) - 1),
           "params": clock.params, "params_matmul": clock.params - clock.embedding,
           "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
           "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None}
    Path(result).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))
    return 0


# --------------------------------------------------------------------------------------------------------------------
# JIT checkpointing: SIGTERM mid-training, a checkpoint, and the same command resuming

JIT = {"max_steps": 400, "hold_at": 20}
HOLD_AT = """
import signal
import sys
import time

from transformers import TrainerCallback


class HoldAt(TrainerCallback):
    \"\"\"At step `step`, says so on stderr (the check sends SIGTERM when it reads it) and waits for the signal to land;
    from then on each step lasts at least 50 ms, so that the run cannot end before ft stops it (ft waits
    transformers' kill_wait, a few seconds, after the signal). Only the first process speaks.\"\"\"

    def __init__(self, step):
        self.step, self.signalled = step, False

    def on_step_end(self, args, state, control, **kwargs):
        watch = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)  # ft's StopWatch, the handler's owner
        if state.global_step == self.step:  # not in the resumed run, which starts past it
            self.signalled = True
            if args.process_index == 0:
                print(f"jit-check: at step {state.global_step}", file=sys.stderr, flush=True)
        if self.signalled:
            while getattr(watch, "received", None) is None:
                time.sleep(0.01)
            time.sleep(0.05)
"""


def prepare_jit(work: str, processes: int = 1) -> Path:
    """The JIT step's recipe (the quickstart, bf16 on CUDA, no evaluation, no scheduled saves) and its hold callback,
    in <workdir>/jit[-N]/; returns the recipe's path."""
    folder = _abs(_path(work, "jit" if processes == 1 else f"jit-{processes}"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hold_at.py").write_text(HOLD_AT)
    # the base's input paths written out: `extends` reads them relative to this file, not the base's (a known gap)
    recipe = {"extends": str(ROOT / QUICKSTART),
              "callbacks": [{"cls": "hold_at:HoldAt", "kwargs": {"step": JIT["hold_at"]}}],
              "model": {"name": str(ROOT / "assets" / "tiny-llama")},
              "data": {"train": [{"path": str(ROOT / "data" / "arithmetic" / "train.jsonl"), "format": "chat"}],
                       "eval": None, "eval_exact_match": None},
              "train": {"output_dir": str(folder / "run"), "max_steps": JIT["max_steps"], "logging_steps": 10,
                        "eval_strategy": "no", "eval_on_start": False, "save_strategy": "no",
                        "bf16": _cuda()}}  # the check's own CPU test runs it in float32
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def jit_worker(recipe: str, result: str, processes: int) -> int:
    """Run `ft train RECIPE` (on ``processes`` GPUs), send SIGTERM when it reports the hold step, time the stop, check
    what it left, then run the same command again and check that it resumed from the checkpoint and completed;
    writes the findings to ``result`` (JSON) for ``check_jit``."""
    import torch

    from ft.outputs.checkpoints import complete_checkpoints

    found: dict = {"processes": processes}
    if processes > 1 and torch.cuda.device_count() < processes:
        found["skipped"] = f"{torch.cuda.device_count()} GPU(s) visible; this variant needs {processes}"
        Path(result).write_text(json.dumps(found, indent=2) + "\n")
        return 0
    command = [sys.executable, "-m", "ft", "train", recipe, *(["--num-processes", str(processes)] * (processes > 1))]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
    out = Path(recipe).parent / "run"
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines = []
    for line in proc.stderr:  # until the run says it reached the hold step
        lines.append(line)
        if line.startswith("jit-check: at step"):
            break
    signalled = time.monotonic()
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # as a scheduler stops the job: every process of the group
    except ProcessLookupError:  # it ended before the hold step (its output, in first_tail, says why)
        pass
    lines += proc.stderr.readlines()
    proc.wait()
    found.update(stop_seconds=round(time.monotonic() - signalled, 2), first_exit=proc.returncode,
                 first_tail="".join(lines[-6:]))
    saved = complete_checkpoints(out)
    found["checkpoint"] = saved[-1].name if saved else None
    found["final_after_stop"] = (out / "final").exists()
    if saved:
        rng = sorted(saved[-1].glob("rng_state*.pth"))
        states = [torch.load(path, weights_only=False) for path in rng]
        found["rng_files"] = len(rng)
        found["cuda_rng"] = bool(states) and all(state.get("cuda") is not None for state in states)
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    found.update(second_exit=again.returncode, resumed_from=summary.get("resumed_from"),
                 final_steps=summary.get("steps"), final_status=summary.get("status"),
                 final=(out / "final").is_dir(), second_tail=again.stderr[-600:])
    Path(result).write_text(json.dumps(found, indent=2) + "\n")
    print(json.dumps(found))
    return 0


def check_jit(processes: int = 1, on_gpu: bool = True):
    """PASS when the stopped run exited 143 with a complete checkpoint (CUDA RNG state in it, ``on_gpu``) and no
    final/, and the same command resumed from that checkpoint and completed every step."""

    def check(work: str, proc: Proc) -> tuple:
        if proc.rc != 0:
            return FAIL, f"the JIT worker exited {proc.rc}: {_last_lines(proc.stderr or proc.stdout)}"
        name = "jit" if processes == 1 else f"jit-{processes}"
        found = json.loads(_abs(_path(work, name, "result.json")).read_text())
        if found.get("skipped"):
            return SKIP, found["skipped"], found
        problems = []
        if found["first_exit"] != 143:
            problems.append(f"the stopped run exited {found['first_exit']}, not 143")
        if not found["checkpoint"]:
            problems.append("no complete checkpoint")
        if found["final_after_stop"]:
            problems.append("final/ written by the stopped run")
        if on_gpu and not found.get("cuda_rng"):
            problems.append("the checkpoint holds no CUDA RNG state")
        if found["second_exit"] != 0 or found["final_status"] != "completed" or not found["final"]:
            problems.append(f"the resumed run exited {found['second_exit']} ({found['final_status']})")
        if not str(found.get("resumed_from") or "").endswith(found["checkpoint"] or "-"):
            problems.append(f"resumed from {found.get('resumed_from')}, not {found['checkpoint']}")
        if found["final_steps"] != JIT["max_steps"]:
            problems.append(f"{found['final_steps']} steps in all, not {JIT['max_steps']}")
        note = (f"SIGTERM at step {JIT['hold_at']}: exit {found['first_exit']} after {found['stop_seconds']} s, "
                f"{found['checkpoint']}; resumed to step {found['final_steps']}")
        return (FAIL, "; ".join(problems) + f" ({note})", found) if problems else (PASS, note, found)

    return check


def jit_step(processes: int) -> Step:
    name = "jit" if processes == 1 else f"jit-{processes}"
    where = "one GPU" if processes == 1 else f"{processes} GPUs (SKIP with fewer)"
    return Step(name, 150, f"JIT checkpointing on {where}: SIGTERM at step {JIT['hold_at']} of a bf16 quickstart "
                f"run, exit 143 with a checkpoint (CUDA RNG state included) and no final/, then the same command "
                "resumes and completes",
                lambda work: ["python", "scripts/gpu_check.py", "--jit-worker", _path(work, name, "recipe.yaml"),
                              "--result", _path(work, name, "result.json"), "--processes", str(processes)],
                check_jit(processes), prepare=lambda work: prepare_jit(work, processes), clean=(name,))


def peak_flops(gpu: str, override_tflops: float | None = None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    return next((peak for pattern, peak in PEAK_BF16 if re.search(pattern, gpu)), None)


def mfu(params: float, tokens_per_second: float, peak: float | None) -> float | None:
    """Model FLOPs utilization, 6 × N × tokens/s / peak (N: the parameters taking part in matmuls; attention's
    score and value products are left out, as in the usual 6N estimate)."""
    return 6 * params * tokens_per_second / peak if peak else None


PEAK_OVERRIDE: list[float | None] = [None]  # --peak-tflops


def check_throughput(work: str, proc: Proc) -> tuple:
    if proc.rc != 0:
        return FAIL, f"exit {proc.rc}: {_last_lines(proc.stderr or proc.stdout)}"
    try:
        got = json.loads(_abs(_path(work, "throughput", "result.json")).read_text())
    except (OSError, ValueError) as exc:
        return FAIL, f"no result.json: {exc}"
    tps = got["tokens_per_second"]
    if not tps or not math.isfinite(tps) or tps <= 0:
        return FAIL, f"no tokens counted (num_input_tokens_seen): {got}"
    peak = peak_flops(got["gpu"], PEAK_OVERRIDE[0])
    util = mfu(got["params_matmul"], tps, peak)
    got.update(peak_flops=peak, mfu=util)
    mfu_text = (f"MFU {util:.1%} (6 × {got['params_matmul'] / 1e6:.0f}M matmul params × tok/s / "
                f"{peak / 1e12:.0f} TFLOP/s bf16 dense)" if util is not None
                else f"MFU n/a (no bf16 peak known for {got['gpu']!r}; --peak-tflops sets one)")
    return PASS, (f"{tps:,.0f} tokens/s, {got['step_seconds']:.3f} s/step over {got['timed_steps']} steps "
                  f"({got['tokens_per_step']:,.0f} tokens each); {mfu_text}; {got['params'] / 1e6:.0f}M params; "
                  f"peak {_fmt(got['peak_memory_gb'])} GB"), got


# --------------------------------------------------------------------------------------------------------------------
# running


def subprocess_env(threads: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1",
               PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                             env.get("PYTHONPATH")])))
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def real_argv(argv: list[str]) -> list[str]:
    head = {"ft": [sys.executable, "-m", "ft"], "python": [sys.executable]}.get(argv[0], [argv[0]])
    return head + argv[1:]


def execute(argv: list[str], limit: float, env: dict[str, str]) -> Proc:
    """Run ``argv`` from the repository root in its own process group; kill the group after ``limit`` seconds."""
    started = time.monotonic()
    proc = subprocess.Popen(real_argv(argv), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
        timed_out = False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        timed_out = True
    return Proc(argv, proc.returncode, out, err, time.monotonic() - started, timed_out)


def missing_modules(names: tuple[str, ...]) -> list[str]:
    return [name for name in names if importlib.util.find_spec(name) is None]


class Runner:
    def __init__(self, steps: list[Step], work: str, deadline: float, jobs: int, say: Callable[[str], None] = print):
        self.steps, self.work, self.deadline, self.jobs = steps, work, deadline, max(1, jobs)
        self.results: dict[str, Result] = {}
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.say = say
        self.threads = max(1, (os.cpu_count() or 2) // self.jobs)

    def skip_reason(self, step: Step) -> str | None:
        missing = missing_modules(step.requires)
        if missing:
            return f"{', '.join(missing)} does not import here"
        absent = [path for path in step.files if not Path(path).is_file()]
        if absent:
            return f"{', '.join(absent)} is not here (python scripts/get_smollm2.py puts it there)"
        for need in step.needs:
            got = self.results.get(need)
            if got is None or got.result != PASS:
                return f"needs `{need}`, which {'did not run' if got is None else 'ended ' + got.result}"
        return None

    def run_one(self, step: Step, parallel: bool) -> Result:
        command = shlex.join(step.command(self.work))
        reason = self.skip_reason(step)
        left = self.deadline - time.monotonic()
        if reason is None and left < min(step.budget, MIN_START):
            reason = f"deadline ({max(left, 0):.0f} s left, budget {step.budget} s)"
        if reason is not None:
            return self.record(Result(step.name, SKIP, 0.0, reason, command))
        limit = min(step.budget, left)
        log = _abs(_path(self.work, "logs", step.name + ".log"))
        log.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            for path in step.clean:
                shutil.rmtree(_abs(_path(self.work, path)), ignore_errors=True)
            if step.prepare:
                step.prepare(self.work)
        except Exception as exc:  # noqa: BLE001 - a broken preparation is this step's failure, not the check's
            return self.record(Result(step.name, FAIL, time.monotonic() - started, f"preparing: {exc!r}", command))
        proc = execute(step.command(self.work), limit, subprocess_env(self.threads if parallel else None))
        log.write_text(f"$ {command}\n# exit {proc.rc}, {proc.seconds:.1f} s, timed out: {proc.timed_out}\n"
                       f"## stdout\n{proc.stdout}\n## stderr\n{proc.stderr}\n")
        seconds = time.monotonic() - started
        data: list = []
        if proc.timed_out and limit < step.budget:
            result, note = SKIP, f"deadline: stopped after {limit:.0f} s (its budget of {step.budget} s was cut)"
        elif proc.timed_out:
            result, note = FAIL, f"timeout: still running after its budget of {step.budget} s"
        else:
            try:
                result, note, *data = step.check(self.work, proc)
            except Exception as exc:  # noqa: BLE001 - report, do not crash the table
                result, note = FAIL, f"checking the result: {exc!r}"
        tail = "" if result == PASS else (proc.stdout[-1500:] + "\n--- stderr ---\n" + proc.stderr[-3000:])
        return self.record(Result(step.name, result, seconds, note, command, tail, data[0] if data else {}))

    def record(self, result: Result) -> Result:
        with self.lock:
            self.results[result.name] = result
            elapsed = time.monotonic() - self.started
            self.say(f"[{elapsed:5.0f} s] {result.result} {result.name} ({result.seconds:.1f} s): {result.note}")
        return result

    def run(self) -> list[Result]:
        batches: list[list[Step]] = []
        for step in self.steps:  # consecutive parallel steps form one batch; every other step runs alone
            if step.parallel and batches and batches[-1][0].parallel:
                batches[-1].append(step)
            else:
                batches.append([step])
        for batch in batches:
            if len(batch) == 1 or self.jobs == 1:
                for step in batch:
                    self.run_one(step, parallel=False)
                continue
            with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
                for future in [pool.submit(self.run_one, step, True) for step in batch]:
                    future.result()
        return [self.results[step.name] for step in self.steps]


# --------------------------------------------------------------------------------------------------------------------
# environment and report

PROBE = """\
import json, platform, importlib.metadata as md
info = {"python": platform.python_version()}
try:
    import torch
    info.update(torch=torch.__version__, cuda_build=torch.version.cuda, cuda=torch.cuda.is_available())
    if info["cuda"]:
        info.update(gpu=torch.cuda.get_device_name(0), devices=torch.cuda.device_count(),
                    capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                    bf16=torch.cuda.is_bf16_supported(),
                    memory_gb=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
except Exception as exc:
    info.update(torch=None, cuda=False, error=repr(exc))
for name in ("transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes", "liger-kernel",
             "galore-torch", "lomo-optim", "flash-attn"):
    try:
        info[name] = md.version(name)
    except md.PackageNotFoundError:
        info[name] = None
print(json.dumps(info))
"""


def probe_environment() -> dict:
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                              env=subprocess_env())
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return {"cuda": False, "error": f"probing torch failed: {exc!r}"}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def report(results: list[Result], env: dict, meta: dict) -> str:
    counts = {kind: sum(r.result == kind for r in results) for kind in (PASS, FAIL, SKIP)}
    versions = "; ".join(f"{name} {env.get(name) or 'not installed'}" for name in
                         ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "liger-kernel",
                          "flash-attn"))
    gpu = (f"{env.get('gpu')} ×{env.get('devices')} (compute capability {env.get('capability')}, "
           f"{env.get('memory_gb')} GiB, bf16 {'yes' if env.get('bf16') else 'no'})" if env.get("cuda")
           else "none visible")
    lines = [f"## GPU check {meta['date']}", "",
             f"- GPU: {gpu}; CUDA build {env.get('cuda_build')}",
             f"- Python {env.get('python')}; {versions}",
             f"- Command: `{meta['command']}`; deadline {meta['deadline']:.0f} s, {meta['jobs']} parallel jobs; "
             f"wall {meta['wall']:.0f} s",
             f"- Result: {counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[SKIP]} SKIP", "",
             "| step | result | seconds | note |", "|---|---|---|---|"]
    lines += [f"| {r.name} | {r.result} | {r.seconds:.1f} | {_cell(r.note)} |" for r in results]
    failed = [r for r in results if r.result == FAIL and r.tail]
    if failed:
        lines += ["", "### Output tails of the failed steps", ""]
        for r in failed:
            lines += [f"#### {r.name}", "", f"`{r.command}`", "", "```text", r.tail.strip(), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------------------------------------------------
# command line


def select(steps: list[Step], only: str | None) -> list[Step]:
    """The steps ``--only`` names (exact names, or a group: `optim`, `smoke`, `qlora`, `generate`), with the steps
    they need, in registry order."""
    if not only:
        return steps
    by_name = {step.name: step for step in steps}
    wanted: set[str] = set()
    for item in filter(None, (part.strip() for part in only.split(","))):
        matched = {item} if item in by_name else {name for name in by_name if name.startswith(item + "-")}
        if not matched:
            raise SystemExit(f"gpu_check.py: --only {item!r} names no step; steps: {', '.join(by_name)}")
        wanted |= matched
    pending = list(wanted)
    while pending:
        for need in by_name[pending.pop()].needs:
            if need not in wanted:
                wanted.add(need)
                pending.append(need)
    return [step for step in steps if step.name in wanted]


def dry_run(steps: list[Step], work: str, deadline: float, jobs: int, as_json: bool) -> int:
    rows = []
    for step in steps:
        missing = missing_modules(step.requires)
        rows.append({"name": step.name, "budget_s": step.budget, "about": step.about, "parallel": step.parallel,
                     "needs": list(step.needs), "requires": list(step.requires), "argv": step.command(work),
                     "command": shlex.join(step.command(work)),
                     "would_skip": f"{', '.join(missing)} does not import here" if missing else None})
    if as_json:
        print(json.dumps({"root": str(ROOT), "workdir": work, "deadline_s": deadline, "jobs": jobs,
                          "ft": [sys.executable, "-m", "ft"], "python": sys.executable, "steps": rows}, indent=2))
        return 0
    print(f"ft GPU check: {len(rows)} steps, run from {ROOT}; deadline {deadline:.0f} s; steps marked ∥ run "
          f"{jobs} at a time\n`ft` runs as `{sys.executable} -m ft` (PYTHONPATH={ROOT / 'src'}), `python` as "
          f"`{sys.executable}`; outputs and logs under {work}/\n")
    for i, row in enumerate(rows, 1):
        flags = " ∥" if row["parallel"] else ""
        extra = "".join([f"; after {', '.join(row['needs'])}" if row["needs"] else "",
                         f"; would SKIP here: {row['would_skip']}" if row["would_skip"] else ""])
        print(f"{i:2}. {row['name']} [{row['budget_s']} s{flags}] {row['about']}{extra}\n    {row['command']}")
    print(f"\nsum of budgets {sum(r['budget_s'] for r in rows)} s (most steps take a fraction of theirs; the "
          "deadline skips what no longer fits)")
    return 0


def deadline_from(seconds: float) -> tuple[float, float]:
    """(monotonic deadline, seconds already spent before this script: the wrapper's setup)."""
    spent = 0.0
    started = os.environ.get("FT_GPU_CHECK_STARTED")
    if started:
        try:
            spent = max(0.0, time.time() - float(started))
        except ValueError:
            pass
    return time.monotonic() + seconds - spent, spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="list the steps and their commands; run nothing")
    parser.add_argument("--json", action="store_true", help="with --dry-run: as JSON")
    parser.add_argument("--only", metavar="NAME[,NAME]", help="run these steps (or groups: optim, smoke, qlora, "
                        "generate) and the steps they need")
    parser.add_argument("--workdir", default="runs/gpu-check", help="run outputs and logs (relative: to the repo root)")
    parser.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE,
                        help="seconds for the whole check, counted from FT_GPU_CHECK_STARTED when set (default "
                        "%(default)s)")
    parser.add_argument("--jobs", type=int, default=4, help="parallel steps (optimizers, smoke tests) at a time")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for gpu-results.md/.json (default $OUT)")
    parser.add_argument("--peak-tflops", type=float, help="dense bf16 peak of this GPU, for MFU (default: table)")
    parser.add_argument("--throughput-worker", metavar="RECIPE", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=THROUGHPUT["warmup"], help=argparse.SUPPRESS)
    parser.add_argument("--jit-worker", metavar="RECIPE", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)

    if opts.jit_worker:
        return jit_worker(opts.jit_worker, opts.result, opts.processes)
    if opts.throughput_worker:
        return throughput_worker(opts.throughput_worker, opts.result, opts.set, opts.warmup)
    try:
        steps = select(build_steps(), opts.only)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    if opts.dry_run:
        return dry_run(steps, opts.workdir, opts.deadline, opts.jobs, opts.json)

    deadline, spent = deadline_from(opts.deadline)
    env = probe_environment()
    if not env.get("cuda"):
        why = env.get("error") or (f"torch {env.get('torch')} (CUDA build {env.get('cuda_build')}) sees no CUDA device"
                                   if env.get("torch") else "torch does not import")
        print(f"gpu_check.py: no CUDA device for {sys.executable}: {why}. This check needs one GPU; "
              "`--dry-run` lists what it would run.", file=sys.stderr)
        return EXIT_NO_CUDA
    PEAK_OVERRIDE[0] = opts.peak_tflops
    print(f"ft GPU check on {env.get('gpu')} (torch {env.get('torch')}, transformers {env.get('transformers')}): "
          f"{len(steps)} steps, {max(0.0, deadline - time.monotonic()):.0f} s left of {opts.deadline:.0f} "
          f"({spent:.0f} s spent before this script); logs in {opts.workdir}/logs/", flush=True)
    started = time.monotonic()
    results = Runner(steps, opts.workdir, deadline, opts.jobs, say=lambda line: print(line, flush=True)).run()
    meta = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": shlex.join(["scripts/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]),
            "deadline": opts.deadline, "jobs": opts.jobs, "wall": time.monotonic() - started + spent}
    text = report(results, env, meta)
    print("\n" + text)
    if opts.out:
        out = Path(opts.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu-results.md").write_text(text)
        (out / "gpu-results.json").write_text(json.dumps(
            {"meta": meta, "environment": env, "results": [asdict(r) for r in results]}, indent=2) + "\n")
        print(f"written: {out / 'gpu-results.md'}, {out / 'gpu-results.json'}")
    return EXIT_FAILED if any(r.result == FAIL for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
