"""Per-step overhead of `ft train` versus a hand-written torch loop and a plain TRL script (CPU).

Three ways to train the same ~4M-parameter Llama (the shipped tiny-llama config, widened) on the same
arithmetic chats, batch size, max_length, seed and assistant-only loss:

  ft    `ft train` in-process: load_recipe with `--set`-style overrides → ``ft.run.train`` whole, with a
        timing callback passed in through its ``callbacks`` argument.
  hand  the floor: a torch loop over the same batches (the ft trainer's own train dataloader, same
        order) doing only forward-with-labels, backward, clip_grad_norm_(1.0), AdamW step, zero_grad.
  trl   what a user gets from a bare TRL script: SFTTrainer with SFTConfig defaults (bf16 autocast and
        gradient checkpointing on; ``use_cpu=True`` is the one extra flag TRL demands on a CPU).

ft / hand is what ft's layers (Trainer, TRL, ft's config) cost per step; the target is <= 1.10.
ft / trl is what ft's CPU defaults save a user. Start-up (imports, model build, tokenization) and the
first W steps are excluded; s/step is the mean wall time of the next M optimizer steps (logging every
10 steps included). On 2 shared cores other jobs swing step times by 10-20% (up to 15x when one takes
a core), so hand and ft are interleaved step by step: ft's timing callback runs one hand-loop step,
timed on its own, after each ft step, outside ft's time. The (~25x slower, so shorter) TRL run
alternates with that paired run for ``--rounds`` rounds. CPU time used by other processes during each
run is read from /proc/stat; runs where it exceeds a quarter core are marked * and left out of the
median unless none was quiet. A measurement, not a test: always exits 0. Progress bars and trainer
logs go to stderr, the results to stdout.
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

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "arithmetic" / "train.jsonl"
BATCH, MAX_LEN, LR, WEIGHT_DECAY, SEED, LOGGING_STEPS = 16, 128, 3e-3, 0.01, 0, 10
SMALL = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}  # head_dim = hidden / heads
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "labels")
LABELS = {"hand": "hand-written torch loop", "ft": "ft train", "trl": "TRL SFTTrainer defaults"}
QUIET = 0.25  # CPU cores other processes may use during a run before it counts as disturbed


def other_cpu() -> float:
    """CPU-seconds the rest of the machine has used so far: /proc/stat busy time minus this process's."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except OSError:
        return 0.0  # not Linux: other load cannot be seen
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK") - time.process_time()


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


class HandLoop:
    """The floor, one step at a time, on the batches of ft's train dataloader (``ws["ft_loader"]``)."""

    def __init__(self, ws: dict):
        from ft.model import loading
        from ft.recipe import load_recipe

        self.model = loading.load_model(load_recipe(ws["recipe"]).recipe, seed=SEED)  # ft's model, same init
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        set_seed(SEED)  # the sampler takes its seed here, as in the ft run: same batches, same order
        loader = ws["ft_loader"]
        self.batches = (batch for _ in iter(int, 1) for batch in loader)

    def step(self) -> float:
        started = time.perf_counter()
        batch = next(self.batches)
        self.model(**{key: batch[key] for key in MODEL_INPUTS if key in batch}).loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return time.perf_counter() - started


class KeepLoader(TrainerCallback):
    """Keeps ft's own train dataloader (``ws["ft_loader"]``) for the hand loop to draw the same batches from."""

    def __init__(self, ws: dict):
        self.ws = ws

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.ws.setdefault("ft_loader", train_dataloader)


class StepClock(TrainerCallback):
    """Times each optimizer step; with a hand loop, runs and times one of its steps after each."""

    def __init__(self, hand: HandLoop | None = None):
        self.hand, self.steps, self.hand_steps, self.resumed = hand, [], [], None

    def on_step_end(self, args, state, control, **kwargs):
        ended = (time.perf_counter(), other_cpu())
        if self.resumed is not None:
            self.steps.append((self.resumed, ended))
        if self.hand is not None:
            self.hand_steps.append(self.hand.step())
        other = other_cpu()
        self.resumed = (time.perf_counter(), other)

    def measure(self, warmup: int, name: str) -> dict[str, tuple[float, float]]:
        """{variant: (s/step, cores used by other processes)} over the steps after ``warmup``."""
        timed = self.steps[warmup - 1:]  # steps[i] is step i + 2: the first has no start stamp
        (wall0, other0), (wall1, other1) = timed[0][0], timed[-1][1]
        load = (other1 - other0) / (wall1 - wall0)
        result = {name: (statistics.fmean(end[0] - start[0] for start, end in timed), load)}
        if self.hand is not None:
            result["hand"] = (statistics.fmean(self.hand_steps[warmup:]), load)
        return result


def run_ft(ws: dict, warmup: int, steps: int, extra_sets=(), paired: bool = True) -> dict:
    """`ft train` in-process, with a hand-loop step after each of its steps when ``paired``."""
    import ft.run.train
    from ft.recipe import load_recipe

    sets = [f"train.output_dir={ws['tmp'] / 'ft'}", f"train.max_steps={warmup + steps}", *extra_sets]
    clock = StepClock(HandLoop(ws) if paired else None)
    ft.run.train.train(load_recipe(ws["recipe"], sets), resume="never", say=lambda line: print(line, file=sys.stderr),
                 callbacks=[clock, KeepLoader(ws)], overwrite=True)  # each round reuses the output directory
    return clock.measure(warmup, "ft")


def run_trl(ws: dict, warmup: int, steps: int) -> dict:
    from datasets import load_dataset
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(ws["model_dir"])
    set_seed(SEED)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ws["model_dir"]))
    dataset = load_dataset("json", data_files=str(DATA), split="train")
    args = SFTConfig(output_dir=str(ws["tmp"] / "trl"), max_steps=warmup + steps, per_device_train_batch_size=BATCH,
                     learning_rate=LR, logging_steps=LOGGING_STEPS, max_length=MAX_LEN, assistant_only_loss=True,
                     save_strategy="no", seed=SEED, use_cpu=True)
    clock = StepClock()
    SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[clock]).train()
    return clock.measure(warmup, "trl")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per hand+ft run (>= 1)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per hand+ft run")
    parser.add_argument("--trl-warmup", type=int, default=1, help="untimed steps per TRL run (>= 1)")
    parser.add_argument("--trl-steps", type=int, default=4, help="timed steps per TRL run (~7 s each on 2 cores)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each run; the median is reported")
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL-defaults run")
    parser.add_argument("--ft-set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra `--set` for the ft run, to try a setting; repeatable")
    opts = parser.parse_args()
    runs = {"ft": lambda ws: run_ft(ws, opts.warmup, opts.steps, opts.ft_set),
            "trl": lambda ws: run_trl(ws, opts.trl_warmup, opts.trl_steps)}
    if opts.no_trl:
        del runs["trl"]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ("hand", *runs)}

    with tempfile.TemporaryDirectory(prefix="ft-bench-") as tmp:
        ws = make_workspace(Path(tmp))
        with contextlib.redirect_stdout(sys.stderr):
            run_ft(ws, 1, 2, opts.ft_set, paired=False)  # leaves ws["ft_loader"], whose batches the hand loop uses
            hand = HandLoop(ws)
            for _ in range(10):  # process-wide warm-up (kernels for each padded length) before anything is timed
                hand.step()
        params = sum(p.numel() for p in hand.model.parameters())
        trl = "" if opts.no_trl else f", trl {opts.trl_warmup}+{opts.trl_steps}"
        print(f"model: {params / 1e6:.2f}M parameters ({params:,}), float32; batch {BATCH}, max_length {MAX_LEN}; "
              f"torch threads {torch.get_num_threads()}; {opts.rounds} rounds of warm-up+timed steps: hand+ft "
              f"{opts.warmup}+{opts.steps} (interleaved){trl}; ft overrides: {opts.ft_set or 'none'}", flush=True)
        for round_no in range(opts.rounds):
            for name in list(runs)[round_no % len(runs):] + list(runs)[:round_no % len(runs)]:  # rotate the order
                with contextlib.redirect_stdout(sys.stderr):
                    measured = runs[name](ws)
                for variant, (seconds, load) in measured.items():
                    results[variant].append((seconds, load))
                    print(f"round {round_no + 1}: {variant:<5} {seconds:.4f} s/step, other processes used "
                          f"{load:.2f} cores", flush=True)

    def quiet(rs):  # the runs other processes left alone; all of them if none was
        return [s for s, load in rs if load < QUIET] or [s for s, _ in rs]

    median = {name: statistics.median(quiet(rs)) for name, rs in results.items()}
    ratio = {name: median[name] / median["hand"] for name in results}
    # ft and hand ran in the same runs, step by step: the median of their per-run ratios is the robust one
    pairs = zip(results["ft"], results["hand"], strict=True)
    ratio["ft"] = statistics.median(quiet([(ft_s / hand_s, load) for (ft_s, load), (hand_s, _) in pairs]))
    print(f"\n{'variant':<26}{'s/step (median)':>16}{'vs hand loop':>14}   per round (* = disturbed, skipped)")
    for name, rs in results.items():
        rounds = " ".join(f"{s:.4f}{'*' if load >= QUIET else ''}" for s, load in rs)
        print(f"{LABELS[name]:<26}{median[name]:>16.4f}{ratio[name]:>13.2f}x   {rounds}")
    print(f"\nft / hand-written loop = {ratio['ft']:.2f} (target <= 1.10)")
    if "trl" in median:
        print(f"ft / TRL defaults = {median['ft'] / median['trl']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
