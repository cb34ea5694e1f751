"""Seconds per optimizer step of `ft train` on a vision-language model versus a plain TRL `SFTTrainer` script (CPU).

Both sides train the same small random LLaVA (a CLIP vision tower, 3 layers of 128 at 64x64 pixels in 8x8 patches:
64 image tokens an image; a Llama of 4 layers of 256 over the shipped tiny-llama tokenizer plus `<image>`; about
4.9M parameters, saved once so that both load the same weights) with the same processor (CLIP's image processor at
64x64, LlavaProcessor, a ChatML template whose answers sit in `{% generation %}` markers), on the same rows (a
question about a PNG on disk and its answer, in TRL's layout: `messages` with an image part, `images` with the
image's path), batch 8, max_length 256, float32, AdamW with a linear schedule, seed 0, loss on the answers only:

  ft    `ft train` in-process (``ft.run.train`` on a recipe) with a timing callback passed through its
        ``callbacks`` argument. ft prepares the rows once (chat rendered, tokenized, masked, each image's
        tokens counted); its collator (``ft.data.images.ImageBatches``) reads a batch's images from disk and
        runs the image processor on them.
  trl   what a user writes with TRL 1.16: ``load_dataset("json", …)``, the ``images`` column cast to
        ``Sequence(Image())`` (decoded from disk when a row is read), ``SFTTrainer`` with an ``SFTConfig`` of the
        same settings (``assistant_only_loss``; ``bf16`` and gradient checkpointing off and ``use_cpu``, as ft
        runs on a CPU). TRL's ``DataCollatorForVisionLanguageModeling`` renders, tokenizes and processes the
        images of each batch.

The two run in lockstep, step by step, each in its own process (TRL's in a child started with ``spawn``): after each
ft step, ft's callback lets the TRL process take one step and waits for it, so a slow patch of the machine hits both
alike. A step's time runs from the moment its side is let go to its ``on_step_end``: the dataloader (and its
collator), forward, backward, clipping, the optimizer and scheduler, and the Trainer's logging, everything a step of
each costs. Each side's input_ids and labels are compared at every step (a forward pre-hook on each model), so a run
says whether both trained on the same batches with the same loss mask. Start-up and the first ``--warmup`` steps of
each round are not timed; a round's ratio is ft's median step over TRL's, and the reported ratio the median over
rounds. CPU time used by other processes during each round is read from /proc/stat (both sides' own time taken out);
rounds where it exceeds a quarter core are marked * and left out of the median unless none was quiet. Each round
also gives the ratio of the two sides' 20th-percentile steps: other jobs only ever add time to a step, so on a busy
machine the fast end of each side's steps says more about its own cost than the median does. ``--threads``
sets torch's threads on both sides (on a machine shared with other jobs, one thread each suffers less from them).
Target: ft / TRL <= 1.05.

    python benchmarks/vision_step.py 2>/dev/null            # 3 rounds of 5+40 steps
    python benchmarks/vision_step.py --quick 2>/dev/null    # 1 round of 2+5 steps: does it run (no figure to keep)

A measurement, not a test: always exits 0. Progress bars and trainer logs go to stderr, the results to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "assets" / "tiny-llama"
BATCH, MAX_LEN, LR, SEED, LOGGING_STEPS, ROWS = 8, 256, 1e-3, 0, 10, 256
PIXELS, PATCH = 64, 8
VISION = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 3, "num_attention_heads": 4,
          "image_size": PIXELS, "patch_size": PATCH}
TEXT = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64}
QUIET = 0.25  # CPU cores other processes may use during a round before it counts as disturbed
# ChatML with image parts written as `<image>` (LlavaProcessor expands each into the image's tokens), the answers and
# their end of turn inside `{% generation %}` markers: TRL's assistant_only_loss reads them, ft masks the same tokens
TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}{% generation %}"
    "{%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}"
    "{{- '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}"
    "{%- for part in message['content'] %}{%- if part['type'] == 'image' %}{{- '<image>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (40, 60, 230), "yellow": (240, 220, 40),
           "purple": (130, 40, 170), "orange": (245, 140, 20)}
SHAPES = ("square", "circle")
QUESTIONS = ("What is in the picture?", "Describe the shape you see and its colour.",
             "Which colour is the shape, and where does it sit in the picture?", "Name the shape.")


def busy_seconds(pids: list[int]) -> float:
    """CPU-seconds the machine has used so far, less those of the processes ``pids`` (both sides of the benchmark)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
        own = 0
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            own += int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, IndexError, ValueError):
        return 0.0  # not Linux, or a process gone: other load cannot be seen
    return (sum(ticks) - ticks[3] - ticks[4] - own) / os.sysconf("SC_CLK_TCK")


def make_workspace(tmp: Path, rows: int) -> dict:
    """The model folder (config, random weights, processor), ``rows`` pictures and their chats, and ft's recipe."""
    import torch
    import transformers
    from PIL import Image, ImageDraw

    model_dir = tmp / "llava"
    tokenizer = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_processor = transformers.CLIPImageProcessor(size={"shortest_edge": PIXELS},
                                                      crop_size={"height": PIXELS, "width": PIXELS})
    transformers.LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH,
                                chat_template=TEMPLATE).save_pretrained(model_dir)
    config = transformers.LlavaConfig(vision_config=transformers.CLIPVisionConfig(**VISION),
                                      text_config=transformers.LlamaConfig(**TEXT, vocab_size=len(tokenizer)),
                                      image_token_index=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(SEED)
    model = transformers.LlavaForConditionalGeneration(config)
    model.save_pretrained(model_dir)
    params = sum(p.numel() for p in model.parameters())

    pictures, names, lines = tmp / "pictures", list(COLOURS), []
    pictures.mkdir()
    for i in range(rows):
        colour, shape = names[i % len(names)], SHAPES[(i // len(names)) % 2]
        size = (48 + 8 * (i % 5), 48 + 8 * (i % 3))  # several sizes: the processor resizes and crops them to 64x64
        image = Image.new("RGB", size, (255, 255, 255))
        box = [4 + i % 7, 4 + i % 5, size[0] - 5, size[1] - 5]
        (ImageDraw.Draw(image).ellipse if shape == "circle" else ImageDraw.Draw(image).rectangle)(
            box, fill=COLOURS[colour])
        path = pictures / f"{i}.png"
        image.save(path)
        answer = (f"A {colour} {shape}." if i % 3 == 0 else
                  f"It is a {colour} {shape} on a white background, close to the {('left', 'top')[i % 2]} edge.")
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTIONS[i % len(QUESTIONS)]}]},
            {"role": "assistant", "content": [{"type": "text", "text": answer}]}], "images": [str(path)]}))
    data = tmp / "rows.jsonl"
    data.write_text("\n".join(lines) + "\n")
    recipe = {"method": "sft", "model": {"name": str(model_dir), "init": "pretrained", "dtype": "float32"},
              "data": {"train": [{"path": str(data), "format": "chat"}], "max_length": MAX_LEN},
              "optimizer": {"name": "adamw_torch", "lr": LR, "weight_decay": 0.0},
              "scheduler": {"type": "linear"},
              "train": {"per_device_train_batch_size": BATCH, "logging_steps": LOGGING_STEPS, "save_strategy": "no",
                        "eval_strategy": "no", "report_to": "none", "seed": SEED}}
    path = tmp / "ft.yaml"
    path.write_text(json.dumps(recipe, indent=2))  # JSON is YAML
    return {"tmp": tmp, "model": model_dir, "data": data, "recipe": path, "params": params}


# --- the TRL side: a plain script, run in a child process in lockstep with ft ---------------------------------------


def trl_side(conn, model_dir: str, data: str, output_dir: str, max_steps: int, threads: int | None) -> None:
    """A plain TRL script, driven one step at a time through ``conn``: it waits for "go" before each step and
    answers with the step's seconds (from "go" to the end of the step) and the step's input_ids."""
    with contextlib.redirect_stdout(sys.stderr):
        import torch

        if threads:
            torch.set_num_threads(threads)
        from datasets import Image, Sequence, load_dataset
        from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
        from trl import SFTConfig, SFTTrainer

        processor = AutoProcessor.from_pretrained(model_dir)
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype="float32")
        dataset = load_dataset("json", data_files=data, split="train").cast_column("images", Sequence(Image()))
        args = SFTConfig(output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=BATCH,
                         learning_rate=LR, weight_decay=0.0, optim="adamw_torch", lr_scheduler_type="linear",
                         logging_steps=LOGGING_STEPS, max_length=MAX_LEN, assistant_only_loss=True,
                         bf16=False, gradient_checkpointing=False, use_cpu=True, dataloader_pin_memory=False,
                         save_strategy="no", eval_strategy="no", report_to="none", seed=SEED)

        class Lockstep(TrainerCallback):
            def __init__(self):
                self.let_go, self.batch = 0.0, None

            def _wait(self):
                conn.recv()  # "go"
                self.let_go = time.perf_counter()

            def on_train_begin(self, args, state, control, model=None, **kwargs):
                model.register_forward_pre_hook(lambda module, _, named: setattr(self, "batch", seen(named)),
                                                with_kwargs=True)
                conn.send(("ready", settings(args, model)))
                self._wait()

            def on_step_end(self, args, state, control, **kwargs):
                conn.send(("step", time.perf_counter() - self.let_go, as_lists(self.batch)))  # timed, then copied
                if state.global_step < args.max_steps:
                    self._wait()

        trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=processor,
                             callbacks=[Lockstep()])
        trainer.train()
        conn.send(("done", [entry.get("loss") for entry in trainer.state.log_history if "loss" in entry]))


def seen(named: dict) -> tuple | None:
    """The input_ids and labels a model's forward was called with (both sides call it with keywords)."""
    return (named["input_ids"], named.get("labels")) if "input_ids" in named else None


def as_lists(batch: tuple | None) -> tuple | None:
    """A batch ``seen`` kept, as plain lists (to cross the pipe; torch's own pickling of tensors shares memory)."""
    return None if batch is None else tuple(None if t is None else t.tolist() for t in batch)


def same(ours: tuple | None, theirs: tuple | None) -> bool:
    return ours is not None and theirs is not None and None not in ours and ours == theirs


def settings(args, model) -> str:
    """What a trainer runs with, to print beside the results (both sides should read alike)."""
    checkpointing = bool(getattr(args, "activation_checkpointing", False) or args.gradient_checkpointing)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    optim, schedule = (getattr(value, "value", value) for value in (args.optim, args.lr_scheduler_type))
    return (f"{type(model).__name__}, {trainable:,} trainable, {model.dtype}; optim {optim}, lr {args.learning_rate}, "
            f"weight decay {args.weight_decay}, scheduler {schedule}, max grad norm {args.max_grad_norm}, bf16 "
            f"{args.bf16}, checkpointing {checkpointing}, batch {args.per_device_train_batch_size}, dataloader workers "
            f"{args.dataloader_num_workers}")


# --- the ft side, in this process ----------------------------------------------------------------------------------


def lockstep_callback(conn, child_pid: int):
    from transformers import TrainerCallback

    class Lockstep(TrainerCallback):
        """After each ft step, one TRL step: ft's own step is timed from the end of TRL's previous one."""

        def __init__(self):
            self.ft, self.trl, self.same = [], [], []
            self.resumed, self.batch, self.loads = 0.0, None, []
            self.trl_settings = self.ft_settings = ""

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            model.register_forward_pre_hook(lambda module, _, named: setattr(self, "batch", seen(named)),
                                            with_kwargs=True)
            self.ft_settings = settings(args, model)
            kind, self.trl_settings = conn.recv()  # the TRL side is built and waits for its first step
            assert kind == "ready", kind
            self.loads.append((time.perf_counter(), busy_seconds([os.getpid(), child_pid])))
            self.resumed = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.ft.append(time.perf_counter() - self.resumed)
            conn.send("go")
            kind, seconds, batch = conn.recv()
            assert kind == "step", kind
            self.trl.append(seconds)
            self.same.append(same(as_lists(self.batch), batch))
            self.loads.append((time.perf_counter(), busy_seconds([os.getpid(), child_pid])))
            self.resumed = time.perf_counter()

    return Lockstep()


def fastest_fifth(times: list[float]) -> float:
    """The step time a fifth of the steps beat (the 20th percentile): on a machine other jobs share, their load only
    adds time to a step, so the fast end of each side's steps is the least disturbed estimate of its own cost."""
    return statistics.quantiles(times, n=5)[0] if len(times) > 1 else times[0]


def run_round(ws: dict, warmup: int, steps: int, threads: int | None) -> dict:
    """One ft run in this process and one TRL run in a child, in lockstep; their step times after ``warmup``."""
    import ft.run.train
    from ft.recipe import load_recipe

    total = warmup + steps
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=trl_side, args=(theirs, str(ws["model"]), str(ws["data"]),
                                                   str(ws["tmp"] / "trl"), total, threads), daemon=True)
    child.start()
    theirs.close()  # the child's end: if the child dies, recv() here ends with EOFError instead of waiting
    try:
        clock = lockstep_callback(ours, child.pid)
        sets = [f"train.output_dir={ws['tmp'] / 'ft'}", f"train.max_steps={total}"]
        with contextlib.redirect_stdout(sys.stderr):
            ft.run.train.train(load_recipe(ws["recipe"], sets), resume="never",
                               say=lambda line: print(line, file=sys.stderr), callbacks=[clock], overwrite=True)
        kind, trl_losses = ours.recv()
        assert kind == "done", kind
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    (wall0, busy0), (wall1, busy1) = clock.loads[warmup], clock.loads[-1]
    ft_losses = json.loads((ws["tmp"] / "ft" / "log_history.json").read_text())
    fifth = {side: fastest_fifth(times[warmup:]) for side, times in (("ft", clock.ft), ("trl", clock.trl))}
    return {"ft": statistics.median(clock.ft[warmup:]), "trl": statistics.median(clock.trl[warmup:]),
            "fast": fifth["ft"] / fifth["trl"],
            "load": (busy1 - busy0) / (wall1 - wall0), "same": sum(clock.same), "steps": len(clock.same),
            "ft_settings": clock.ft_settings, "trl_settings": clock.trl_settings,
            "ft_losses": [entry["loss"] for entry in ft_losses if "loss" in entry], "trl_losses": trl_losses,
            "per_step": " ".join(f"{a:.3f}/{b:.3f}" for a, b in zip(clock.ft, clock.trl, strict=True))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per round (>= 1)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the median of their ratios is reported")
    parser.add_argument("--rows", type=int, default=ROWS, help="pictures and chats in the data")
    parser.add_argument("--threads", type=int, help="torch threads on both sides (default: torch's own)")
    parser.add_argument("--quick", action="store_true", help="1 round of 2+5 steps on 64 rows: does it run")
    opts = parser.parse_args()
    if opts.quick:
        opts.warmup, opts.steps, opts.rounds, opts.rows = 2, 5, 1, 64
    opts.warmup, opts.steps = max(opts.warmup, 1), max(opts.steps, 1)
    results, started = [], time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="ft-bench-") as tmp:
            with contextlib.redirect_stdout(sys.stderr):
                ws = make_workspace(Path(tmp), opts.rows)
            import torch

            if opts.threads:
                torch.set_num_threads(opts.threads)
            print(f"model: random LLaVA, {ws['params'] / 1e6:.2f}M parameters, float32; {opts.rows} rows (a "
                  f"{PIXELS}x{PIXELS} image each after the processor: {(PIXELS // PATCH) ** 2} image tokens), batch "
                  f"{BATCH}, max_length {MAX_LEN}; torch threads {torch.get_num_threads()}; {opts.rounds} rounds of "
                  f"{opts.warmup}+{opts.steps} warm-up+timed steps, ft and TRL in lockstep", flush=True)
            for round_no in range(opts.rounds):
                result = run_round(ws, opts.warmup, opts.steps, opts.threads)
                results.append(result)
                if round_no == 0:
                    print(f"ft's trainer:  {result['ft_settings']}\nTRL's trainer: {result['trl_settings']}",
                          flush=True)
                print(f"round {round_no + 1}, s per step ft/trl: {result['per_step']}", file=sys.stderr, flush=True)
                losses = {side: [round(x, 3) for x in result[f"{side}_losses"]] for side in ("ft", "trl")}
                print(f"round {round_no + 1}: ft {result['ft']:.4f} s/step, trl {result['trl']:.4f} s/step (medians), "
                      f"ft / trl {result['ft'] / result['trl']:.3f} ({result['fast']:.3f} on the fastest fifth); other "
                      f"processes used {result['load']:.2f} cores; same input_ids and labels in {result['same']} of "
                      f"{result['steps']} steps; logged losses ft {losses['ft']}, trl {losses['trl']}", flush=True)
    except Exception:  # a measurement, not a test: report and exit 0
        traceback.print_exc()
        print("failed: see the traceback on stderr")
        if not results:
            return 0

    quiet = [r for r in results if r["load"] < QUIET] or results
    ratio = statistics.median(r["ft"] / r["trl"] for r in quiet)
    rounds = " ".join(f"{r['ft'] / r['trl']:.3f}{'' if r['load'] < QUIET else '*'}" for r in results)
    print(f"\n{'variant':<26}{'s/step (median)':>16}")
    print(f"{'TRL SFTTrainer script':<26}{statistics.median(r['trl'] for r in quiet):>16.4f}")
    print(f"{'ft train':<26}{statistics.median(r['ft'] for r in quiet):>16.4f}")
    print(f"per round ft / trl (* = disturbed, skipped): {rounds}; total {time.perf_counter() - started:.0f} s")
    fast = " ".join(f"{r['fast']:.3f}{'' if r['load'] < QUIET else '*'}" for r in results)
    print(f"per round ft / trl of each side's 20th-percentile step (its fastest fifth): {fast}; median "
          f"{statistics.median(r['fast'] for r in quiet):.2f}")
    print(f"\nft / TRL SFTTrainer (vision) = {ratio:.2f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
