"""Per-step overhead of `ft train` versus a hand-written torch loop and a plain TRL script (CPU).

Three ways to train the same ~4M-parameter Llama (the shipped tiny-llama config, widened) on the same
arithmetic chats, batch size, max_length, seed and assistant-only loss:

  ft    ft's own training path, built exactly as ``ft.run.train`` builds it (load_recipe → tokenizer →
        datasets → model → build_trainer with hardware.device_defaults), plus a timing callback.
  hand  the floor: a torch loop over the same batches (the ft trainer's own train dataloader) doing
        only forward-with-labels, backward, clip_grad_norm_(1.0), AdamW step, zero_grad.
  trl   what a user gets from a bare TRL script: SFTTrainer with SFTConfig defaults (bf16 autocast and
        gradient checkpointing on; ``use_cpu=True`` is the one extra flag TRL demands on a CPU).

Start-up (imports, model build, tokenization) and warm-up steps are excluded: each run takes
``--warmup`` steps, then the wall time of the next ``--steps`` optimizer steps (stamped at
``on_step_end`` / after ``optimizer.step()``) gives seconds per step. Variants run interleaved for
``--rounds`` rounds and the median is reported, so load on a shared machine hits all of them alike.
It is a measurement, not a test: it always exits 0. Progress bars go to stderr; the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
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


class StepClock(TrainerCallback):
    """perf_counter() at the end of every optimizer step."""

    def __init__(self):
        self.stamps: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.stamps.append(time.perf_counter())


def seconds_per_step(stamps: list[float], warmup: int) -> float:
    timed = stamps[warmup - 1:]  # from the end of the last warm-up step to the end of the last step
    return (timed[-1] - timed[0]) / (len(timed) - 1)


def make_model_dir(tmp: Path) -> Path:
    model_dir = tmp / "model"
    shutil.copytree(ROOT / "assets" / "tiny-llama", model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(SMALL)
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    return model_dir


def write_recipe(tmp: Path, model_dir: Path) -> Path:
    path = tmp / "bench.yaml"
    path.write_text(f"""\
method: sft
model: {{name: {model_dir}, init: random}}
data:
  train: [{{path: {DATA}, format: chat}}]
  max_length: {MAX_LEN}
  train_on: assistant
optimizer: {{name: adamw_torch, lr: {LR}, weight_decay: {WEIGHT_DECAY}}}
train:
  per_device_train_batch_size: {BATCH}
  logging_steps: {LOGGING_STEPS}
  save_strategy: "no"
  seed: {SEED}
""")
    return path


def build_ft_trainer(recipe_path: Path, out: Path, max_steps: int, callbacks=(), extra_sets=()):
    """The objects ``ft.run.train`` builds, in its order, with ``callbacks`` passed through."""
    from ft import data, hardware, models
    from ft.recipe import load_recipe
    from ft.trainers import build_trainer

    sets = [f"train.output_dir={out}", f"train.max_steps={max_steps}", *extra_sets]
    recipe = load_recipe(recipe_path, sets).recipe
    tokenizer = models.load_tokenizer(recipe.model)
    train_dataset, eval_dataset = data.build_datasets(recipe)
    model = models.load_model(recipe, seed=recipe.train_args.get("seed", 42))
    return build_trainer(recipe, model=model, tokenizer=tokenizer, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, callbacks=callbacks,
                         defaults=hardware.device_defaults(recipe, hardware.probe()))


def run_ft(ctx, max_steps: int, extra_sets=()) -> list[float]:
    clock = StepClock()
    trainer = build_ft_trainer(ctx["recipe"], ctx["tmp"] / "ft", max_steps, [clock], extra_sets)
    trainer.train()
    return clock.stamps


def run_hand(ctx, max_steps: int) -> list[float]:
    from ft import models
    from ft.recipe import load_recipe

    recipe = load_recipe(ctx["recipe"]).recipe
    model = models.load_model(recipe, seed=SEED)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    set_seed(SEED)
    loader = ctx["batch_source"].get_train_dataloader()
    stamps = []
    while len(stamps) < max_steps:
        for batch in loader:
            loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         labels=batch["labels"]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            stamps.append(time.perf_counter())
            if len(stamps) == max_steps:
                break
    return stamps


def run_trl(ctx, max_steps: int) -> list[float]:
    from datasets import load_dataset
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(ctx["model_dir"])
    set_seed(SEED)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ctx["model_dir"]))
    dataset = load_dataset("json", data_files=str(DATA), split="train")
    args = SFTConfig(output_dir=str(ctx["tmp"] / "trl"), max_steps=max_steps, per_device_train_batch_size=BATCH,
                     learning_rate=LR, logging_steps=LOGGING_STEPS, max_length=MAX_LEN, assistant_only_loss=True,
                     save_strategy="no", seed=SEED, use_cpu=True)
    clock = StepClock()
    SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
               callbacks=[clock]).train()
    return clock.stamps


VARIANTS = {"hand": run_hand, "ft": run_ft, "trl": run_trl}
LABELS = {"hand": "hand-written torch loop", "ft": "ft train", "trl": "TRL SFTTrainer defaults"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per run")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the median is reported")
    parser.add_argument("--variants", default="hand,ft,trl", help="comma-separated subset of hand,ft,trl")
    parser.add_argument("--ft-set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra --set override for the ft run only (to try a setting); repeatable")
    opts = parser.parse_args()
    hf_logging.set_verbosity_error()
    names = opts.variants.split(",")
    max_steps = opts.warmup + opts.steps

    with tempfile.TemporaryDirectory(prefix="ft-bench-") as tmp_name:
        tmp = Path(tmp_name)
        model_dir = make_model_dir(tmp)
        ctx = {"tmp": tmp, "model_dir": model_dir, "recipe": write_recipe(tmp, model_dir)}
        ctx["batch_source"] = build_ft_trainer(ctx["recipe"], tmp / "batches", max_steps)
        params = sum(p.numel() for p in ctx["batch_source"].model.parameters())
        example = next(iter(ctx["batch_source"].get_train_dataloader()))
        print(f"model: {params / 1e6:.2f}M parameters ({params:,}); batch {BATCH} x {example['input_ids'].shape[1]} "
              f"tokens (first batch), max_length {MAX_LEN}; torch threads {torch.get_num_threads()}; "
              f"{opts.warmup} warm-up + {opts.steps} timed steps per run, {opts.rounds} rounds", flush=True)
        if opts.ft_set:
            print(f"ft run overrides: {' '.join(opts.ft_set)}", flush=True)

        results: dict[str, list[float]] = {name: [] for name in names}
        for round_no in range(opts.rounds):
            order = names[round_no % len(names):] + names[:round_no % len(names)]  # rotate who goes first
            for name in order:
                kwargs = {"extra_sets": opts.ft_set} if name == "ft" else {}
                stamps = VARIANTS[name](ctx, max_steps, **kwargs)
                results[name].append(seconds_per_step(stamps, opts.warmup))
                print(f"round {round_no + 1}: {name:<5} {results[name][-1]:.4f} s/step", flush=True)

    median = {name: statistics.median(values) for name, values in results.items()}
    base = median.get("hand")
    print(f"\n{'variant':<26}{'s/step (median)':>16}{'vs hand loop':>14}   per round")
    for name in names:
        ratio = f"{median[name] / base:.2f}x" if base else "-"
        rounds = " ".join(f"{v:.4f}" for v in results[name])
        print(f"{LABELS[name]:<26}{median[name]:>16.4f}{ratio:>14}   {rounds}")
    if "ft" in median and base:
        print(f"\nft / hand-written loop = {median['ft'] / base:.2f} (target <= 1.10)")
    if "ft" in median and "trl" in median:
        print(f"ft / TRL defaults = {median['ft'] / median['trl']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
