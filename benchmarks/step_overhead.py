"""Per-step overhead of `ft train` versus a hand-written torch loop and a plain TRL script (CPU).

Three ways to train the same ~4M-parameter Llama (the shipped tiny-llama config, widened) on the same
arithmetic chats, batch size, max_length, seed and assistant-only loss:

  ft    `ft train` in-process: load_recipe with `--set`-style overrides → ``ft.run.train`` whole; a
        timing callback is slipped into the ``build_trainer`` call it makes (it takes no callbacks).
  hand  the floor: a torch loop over the same batches (the ft trainer's own train dataloader) doing
        only forward-with-labels, backward, clip_grad_norm_(1.0), AdamW step, zero_grad.
  trl   what a user gets from a bare TRL script: SFTTrainer with SFTConfig defaults (bf16 autocast and
        gradient checkpointing on; ``use_cpu=True`` is the one extra flag TRL demands on a CPU).

ft / hand is what ft's layers (Trainer, TRL, ft's config) cost per step; the target is <= 1.10.
ft / trl is what ft's CPU defaults save a user. Start-up (imports, model build, tokenization) and
warm-up are excluded: a run takes W untimed steps, then the wall time of the next M optimizer steps
(stamped at ``on_step_end`` / after ``optimizer.step()``, so logging every 10 steps counts) over M is
its s/step. Variants run interleaved for ``--rounds`` rounds, order rotated. On 2 shared cores a
competing process makes PyTorch's OpenMP steps up to ~15x slower, so the CPU time other processes
take during each run is read from /proc/stat, and runs where it exceeds a quarter core (marked *)
are left out of the median unless no run of that variant was quiet. TRL's defaults are ~30x slower
on a CPU, so that run gets fewer steps (``--trl-steps``). A measurement, not a test: always exits 0.
Progress bars and trainer logs go to stderr, the results to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback, set_seed
from transformers.utils import logging as hf_logging

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "arithmetic" / "train.jsonl"
BATCH, MAX_LEN, LR, WEIGHT_DECAY, SEED, LOGGING_STEPS = 16, 128, 3e-3, 0.01, 0, 10
SMALL = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}  # head_dim = hidden / heads
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "labels")
LABELS = {"hand": "hand-written torch loop", "ft": "ft train", "trl": "TRL SFTTrainer defaults"}


QUIET = 0.25  # CPU cores other processes may use during a run before the run counts as disturbed


def stamp() -> tuple[float, float]:
    """(wall clock, CPU-seconds the rest of the machine has used): /proc/stat busy time minus ours."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
        machine = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    except (OSError, ValueError):
        machine = time.process_time()  # no /proc: load from others cannot be seen
    return time.perf_counter(), machine - time.process_time()


class StepClock(TrainerCallback):
    def __init__(self):
        self.stamps: list[tuple[float, float]] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.stamps.append(stamp())


def measure(stamps: list[tuple[float, float]], warmup: int) -> tuple[float, float]:
    """(s/step, cores used by other processes) from the end of the last warm-up step to the last step."""
    (wall0, other0), (wall1, other1) = stamps[warmup - 1], stamps[-1]
    return (wall1 - wall0) / (len(stamps) - warmup), (other1 - other0) / (wall1 - wall0)


def make_workspace(tmp: Path) -> dict:
    model_dir = tmp / "model"
    shutil.copytree(ROOT / "assets" / "tiny-llama", model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, **SMALL}, indent=2))
    recipe = tmp / "bench.yaml"
    recipe.write_text(f"""\
method: sft
model: {{name: {model_dir}, init: random}}
data:
  train: [{{path: {DATA}, format: chat}}]
  max_length: {MAX_LEN}
  train_on: assistant
optimizer: {{name: adamw_torch, lr: {LR}, weight_decay: {WEIGHT_DECAY}}}
train: {{per_device_train_batch_size: {BATCH}, logging_steps: {LOGGING_STEPS}, save_strategy: "no", seed: {SEED}}}
""")
    return {"tmp": tmp, "model_dir": model_dir, "recipe": recipe}


@contextlib.contextmanager
def trainer_callbacks(*callbacks):
    """``ft.run.train`` takes no callbacks: wrap the ``build_trainer`` it calls to add ours (nothing else
    changes) and collect the trainers it builds."""
    import ft.run

    original, built = ft.run.build_trainer, []

    def build_trainer(*args, **kwargs):
        built.append(original(*args, **{**kwargs, "callbacks": [*kwargs.get("callbacks", ()), *callbacks]}))
        return built[-1]

    ft.run.build_trainer = build_trainer
    try:
        yield built
    finally:
        ft.run.build_trainer = original


def run_ft(ws: dict, max_steps: int, extra_sets=()) -> list[float]:
    """`ft train` in-process: load_recipe with `--set` overrides, then ft.run.train, whole."""
    import ft.run
    from ft.recipe import load_recipe

    sets = [f"train.output_dir={ws['tmp'] / 'ft'}", f"train.max_steps={max_steps}", *extra_sets]
    clock = StepClock()
    with trainer_callbacks(clock) as built:
        ft.run.train(load_recipe(ws["recipe"], sets), resume="never", say=lambda line: print(line, file=sys.stderr))
    ws["ft_trainer"] = built[-1]
    return clock.stamps


def run_hand(ws: dict, max_steps: int) -> list[float]:
    from ft import models
    from ft.recipe import load_recipe

    model = models.load_model(load_recipe(ws["recipe"]).recipe, seed=SEED)  # same init as the ft run
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    set_seed(SEED)
    stamps: list[tuple[float, float]] = []
    while len(stamps) < max_steps:
        for batch in ws["ft_trainer"].get_train_dataloader():  # the ft trainer's own batches
            loss = model(**{key: batch[key] for key in MODEL_INPUTS if key in batch}).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            stamps.append(stamp())
            if len(stamps) == max_steps:
                break
    return stamps


def run_trl(ws: dict, max_steps: int) -> list[float]:
    from datasets import load_dataset
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(ws["model_dir"])
    set_seed(SEED)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ws["model_dir"]))
    dataset = load_dataset("json", data_files=str(DATA), split="train")
    args = SFTConfig(output_dir=str(ws["tmp"] / "trl"), max_steps=max_steps, per_device_train_batch_size=BATCH,
                     learning_rate=LR, logging_steps=LOGGING_STEPS, max_length=MAX_LEN, assistant_only_loss=True,
                     save_strategy="no", seed=SEED, use_cpu=True)
    clock = StepClock()
    SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[clock]).train()
    return clock.stamps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per hand/ft run (>= 1)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per hand/ft run")
    parser.add_argument("--trl-warmup", type=int, default=1, help="untimed steps per TRL run (>= 1)")
    parser.add_argument("--trl-steps", type=int, default=4, help="timed steps per TRL run (~10 s each on 2 cores)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    parser.add_argument("--variants", default="hand,ft,trl", help="comma-separated subset of hand,ft,trl")
    parser.add_argument("--ft-set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra `--set` for the ft run only, to try a setting; repeatable")
    opts = parser.parse_args()
    hf_logging.set_verbosity_error()
    names = opts.variants.split(",")
    plan = {name: (opts.trl_warmup, opts.trl_steps) if name == "trl" else (opts.warmup, opts.steps) for name in names}
    runners = {"hand": run_hand, "ft": lambda ws, n: run_ft(ws, n, opts.ft_set), "trl": run_trl}

    with tempfile.TemporaryDirectory(prefix="ft-bench-") as tmp:
        ws = make_workspace(Path(tmp))
        with contextlib.redirect_stdout(sys.stderr):
            run_ft(ws, 3, opts.ft_set)  # leaves ws["ft_trainer"], whose dataloader feeds the hand loop
            run_hand(ws, 10)  # process-wide warm-up (kernels for each padded length) before anything is timed
        params = sum(p.numel() for p in ws["ft_trainer"].model.parameters())
        loader = ws["ft_trainer"].get_train_dataloader()
        lengths = sorted({batch["input_ids"].shape[1] for _, batch in zip(range(20), loader, strict=False)})
        print(f"model: {params / 1e6:.2f}M parameters ({params:,}), float32; batch {BATCH}, padded to "
              f"{lengths[0]}-{lengths[-1]} tokens (max_length {MAX_LEN}); torch threads {torch.get_num_threads()}; "
              f"{opts.rounds} rounds of warm-up+timed steps: "
              + ", ".join(f"{name} {w}+{m}" for name, (w, m) in plan.items()), flush=True)
        if opts.ft_set:
            print(f"ft run overrides: {' '.join(opts.ft_set)}", flush=True)

        results: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for round_no in range(opts.rounds):
            for name in names[round_no % len(names):] + names[:round_no % len(names)]:  # rotate who goes first
                warmup, steps = plan[name]
                with contextlib.redirect_stdout(sys.stderr):
                    stamps = runners[name](ws, warmup + steps)
                results[name].append(measure(stamps, warmup))
                print(f"round {round_no + 1}: {name:<5} {results[name][-1][0]:.4f} s/step "
                      f"(other processes: {results[name][-1][1]:.2f} cores)", flush=True)

    # the median over the rounds the rest of the machine left alone; over all rounds if none was quiet
    median = {name: statistics.median([s for s, other in runs if other < QUIET] or [s for s, _ in runs])
              for name, runs in results.items()}
    base = median.get("hand")
    print(f"\n{'variant':<26}{'s/step (median)':>16}{'vs hand loop':>14}   per round (* = disturbed, skipped)")
    for name in names:
        ratio = f"{median[name] / base:.2f}x" if base else "-"
        rounds = " ".join(f"{s:.4f}{'*' if other >= QUIET else ''}" for s, other in results[name])
        print(f"{LABELS[name]:<26}{median[name]:>16.4f}{ratio:>14}   {rounds}")
    if "ft" in median and base:
        print(f"\nft / hand-written loop = {median['ft'] / base:.2f} (target <= 1.10)")
    if "ft" in median and "trl" in median:
        print(f"ft / TRL defaults = {median['ft'] / median['trl']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
