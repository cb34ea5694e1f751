"""``ft train RECIPE --smoke``: the recipe end to end on a tiny random model of the same family, a few dozen rows and
a few steps on the CPU, in ``<train.output_dir>-smoke``, to catch recipe, data and template errors before renting a
GPU. The real output directory (and ``data.prepared_path``) is never touched.

``prepare`` turns the loaded recipe into the smoke recipe: the recipe as written (every key it set, input paths
resolved), changed where a CPU smoke run must differ, then validated again by ``recipe.load.validate`` so every rule
still applies. Each change is a ``Substitution`` (key, was, now, why); ``train`` prints them at the start and at the
end and writes them into summary.json under ``"smoke"``. Everything else stays as the recipe says: method, adapter
and its target_modules (checked against the tiny model), chat template, data formats, masks, optimizer, scheduler,
rules, callbacks, loss, metrics and rewards.

- Model: the real config (a local directory, the HF cache, the hub when online) shrunk to ``TINY``, with the real
  tokenizer; where they cannot be read, the shipped ``assets/tiny-<family>/`` (config and tokenizer with the
  family's chat template) of the family the real config's model_type names, else the model name (``FAMILY_WORDS``).
  A model.name that is a run's output not written yet (``../runs/quickstart/final``) is looked up among the recipes
  next to this one. Random weights are saved in ``inputs/model``: ``init: pretrained`` loads them, and so does a
  DPO ``ref_model``.
- Data: a local source's first ``ROWS`` rows (copied to ``inputs/data`` when it has more; errors about a copy name
  the original file and line); a hub dataset's first rows from the cache (offline) or a stream (online); rows
  generated in the source's format and ``fields:``/``roles:`` layout when it cannot be read.
- Machine: what a GPU recipe sets that this CPU cannot run (bf16/fp16, flash attention, Liger kernels, 4-bit
  loading where bitsandbytes cannot do it here, CUDA-only optimizers, DeepSpeed/FSDP, vLLM, torch.compile), replaced
  by the CPU equivalent; nothing is pushed or reported to trackers.
- Size: ``STEPS`` steps, batches of at most ``MAX_BATCH``, logging every step, one evaluation and one checkpoint.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import hardware, report
from .data import DataError
from .models import ModelLoadError
from .recipe import LoadedRecipe, Problem, Recipe, load_recipe
from .recipe.errors import first_line
from .recipe.load import validate
from .recipe.optimizers import PACKAGES, traits
from .recipe.rules import effective

ASSETS = Path(__file__).resolve().parents[2] / "assets"
FAMILIES = {"llama": "tiny-llama3", "qwen2": "tiny-qwen2", "mistral": "tiny-mistral", "gemma": "tiny-gemma"}
# a real config's model_type -> the family whose shipped tokenizer stands in when the real one cannot be read
FAMILY_OF_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen2_moe": "qwen2", "qwen3": "qwen2", "qwen3_moe": "qwen2",
                  "mistral": "mistral", "mixtral": "mistral", "ministral": "mistral", "gemma": "gemma",
                  "gemma2": "gemma", "gemma3_text": "gemma"}
# a word in model.name -> its family, when not even the config can be read (the earliest word in the name wins)
FAMILY_WORDS = {"llama": "llama", "qwen": "qwen2", "mistral": "mistral", "mixtral": "mistral", "gemma": "gemma"}
DEFAULT_FAMILY = "llama"  # a model another run has not written yet, with no recipe here that writes it

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128}
TINY_MOE = {"num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 128}
STEPS = 3
ROWS = {"train": 48, "eval": 16}
MAX_BATCH = 4
MAX_ACCUMULATION = 2
MAX_COMPLETION = 16  # GRPO/ORPO tokens per sampled completion
MARKER = "smoke.json"  # in every smoke directory: a later smoke run may clear it, and nothing else
_UNSET = object()


@dataclass(frozen=True)
class Substitution:
    """One change the smoke run makes to the recipe: ``key`` (dotted) went from ``was`` to ``now`` because ``why``."""

    key: str
    was: object
    now: object
    why: str

    def render(self) -> str:
        return f"{self.key}: {_shown(self.was)} -> {_shown(self.now)} ({self.why})"

    def as_dict(self) -> dict:
        return {"key": self.key, "was": _plain(self.was), "now": _plain(self.now), "why": self.why}


@dataclass
class Smoke:
    """The smoke run of one recipe: its recipe, where it writes, and what it changed."""

    loaded: LoadedRecipe  # the smoke recipe (located like the real one: errors name the recipe's file:line)
    output_dir: Path
    real_output_dir: str
    substitutions: list[Substitution]
    model: dict  # family, model_type, where its config and tokenizer came from
    copies: dict[str, str] = field(default_factory=dict)  # a data copy's path -> the source's own path

    def unmap(self, text: str) -> str:
        """``text`` (an error) with every data copy's path replaced by the path of the source it was copied from."""
        for copy, original in sorted(self.copies.items(), key=lambda item: -len(item[0])):
            text = text.replace(copy, original)
        return text

    def describe(self) -> dict:
        """summary.json's ``"smoke"``."""
        return {"recipe": str(self.loaded.source), "output_dir": str(self.output_dir),
                "real_output_dir": self.real_output_dir, "model": self.model,
                "substitutions": [s.as_dict() for s in self.substitutions]}


def output_dir(recipe: Recipe) -> Path:
    """``<train.output_dir>-smoke``: where the smoke run of ``recipe`` writes everything."""
    return Path(str(recipe.train_args["output_dir"]).rstrip("/\\") + "-smoke")


def redirected(loaded: LoadedRecipe) -> LoadedRecipe:
    """``loaded`` with ``train.output_dir`` moved to the smoke directory, for what the CLI writes when a smoke run
    fails unexpectedly (error.log): never into the real output directory."""
    recipe = loaded.recipe
    train = recipe.train.model_copy(update={"output_dir": str(output_dir(recipe))})  # type: ignore[attr-defined]
    return LoadedRecipe(recipe.model_copy(update={"train": train}), loaded.warnings, loaded.source, loaded.locations)


def train(loaded: LoadedRecipe, say: Callable[[str], None] = print, *, command: str | None = None, callbacks=()):
    """``ft train --smoke``: ``prepare``, then ``run.train`` on the smoke recipe (always a fresh run), then the
    substitutions added to summary.json. Returns run.train's ``RunResult``."""
    from .run import train as run_train

    started = time.perf_counter()
    smoke = prepare(loaded, say)
    say(f"ft: smoke test of {loaded.source}: {loaded.recipe.method} on a tiny random {smoke.model['model_type']} "
        f"model, at most {ROWS['train']} rows per source, {STEPS} steps on the CPU, in {smoke.output_dir} "
        f"({smoke.real_output_dir} is not touched). Substituted:\n"
        + "\n".join(f"  - {s.render()}" for s in smoke.substitutions))
    try:
        result = run_train(smoke.loaded, resume="never", say=say, callbacks=callbacks,
                           command=command or f"ft train {loaded.source} --smoke")
    except DataError as exc:
        raise DataError(smoke.unmap(str(exc))) from None
    result.summary["smoke"] = smoke.describe()
    report.write_summary(result.output_dir, result.summary)
    _mark(smoke.output_dir, {**smoke.describe(), "status": result.status})
    keys = ", ".join(dict.fromkeys(s.key for s in smoke.substitutions))
    outcome = "passed" if result.status == "completed" else f"stopped ({result.status})"
    say(f"ft: smoke test {outcome} in {time.perf_counter() - started:.0f}s: {loaded.recipe.method} ran "
        f"{result.summary.get('steps', '?')} steps on a tiny {smoke.model['model_type']} model; nothing was written "
        f"to {smoke.real_output_dir}. Substituted (listed under \"smoke\" in {result.output_dir / 'summary.json'}): "
        f"{keys}.")
    return result


def prepare(loaded: LoadedRecipe, say: Callable[[str], None] = print) -> Smoke:
    """The smoke run of ``loaded``: a fresh smoke directory holding the tiny model (``inputs/model``) and the data
    (``inputs/data``), and the smoke recipe, validated like any recipe. Raises RecipeError (a recipe problem the
    smoke run finds, e.g. adapter target modules the family does not have), ModelLoadError or DataError."""
    recipe = loaded.recipe
    base_dir = loaded.source.resolve().parent
    out = output_dir(recipe)
    _fresh(out, loaded)
    edits = _Edits(recipe.model_dump(mode="json", exclude_unset=True, by_alias=True))
    _machine(edits, recipe)
    _size(edits, recipe)
    _outputs(edits, recipe, out)
    model, tokenizer = _model(edits, loaded, base_dir, out / "inputs" / "model")
    copies = _data(edits, recipe, out / "inputs" / "data", tokenizer)
    smoke_recipe, warnings = validate(edits.raw, loaded.locations, base_dir=base_dir, source=str(loaded.source))
    known = {w.render() for w in loaded.warnings}
    for warning in warnings:
        if warning.render() not in known:
            say("warning: " + warning.render())
    smoke_recipe = _cpu_quantization(edits, smoke_recipe, loaded, base_dir)
    smoke = Smoke(LoadedRecipe(smoke_recipe, warnings, loaded.source, loaded.locations), out,
                  str(recipe.train_args["output_dir"]), edits.subs, model, copies)
    _mark(out, {**smoke.describe(), "status": "prepared"})
    return smoke


# --- the smoke directory ----------------------------------------------------------------------------------------


def _fresh(out: Path, loaded: LoadedRecipe) -> None:
    """An empty ``out`` marked as a smoke directory; a previous smoke run's is cleared, anything else refused."""
    if out.exists():
        if not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).is_file()):
            raise loaded.error([Problem("train.output_dir", f"`ft train --smoke` writes into {out}, which exists and "
                                        f"was not written by a smoke run (it has no {MARKER}); move it away or set "
                                        "train.output_dir elsewhere.")])
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _mark(out, {"recipe": str(loaded.source), "status": "preparing"})


def _mark(out: Path, content: dict) -> None:
    (out / MARKER).write_text(json.dumps(content, indent=2) + "\n")


# --- editing the recipe ----------------------------------------------------------------------------------------


class _Edits:
    """The recipe as written (a dict), changed key by key, each change recorded as a Substitution."""

    def __init__(self, raw: dict):
        self.raw = raw
        self.subs: list[Substitution] = []

    def get(self, key: str, default=None):
        node = self.raw
        for part in key.split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return default
        return node

    def set(self, key: str, value, why: str, *, say: bool = True) -> None:
        """``value`` at ``key`` (``_UNSET`` removes it); recorded unless ``say`` is False or nothing changes."""
        *parents, last = key.split(".")
        node = self.raw
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        was = node.get(last, _UNSET)
        if value is _UNSET:
            node.pop(last, None)
        else:
            node[last] = value
        if say and was != value:
            self.subs.append(Substitution(key, was, value, why))


_ON = bool  # a train: value that turns a GPU feature on
_GPU_TRAIN = (  # train: key, its CPU value (_UNSET: removed), when it applies, why
    ("bf16", False, _ON, "bfloat16 mixed precision is for GPUs; the CPU trains in float32"),
    ("fp16", False, _ON, "fp16 mixed precision needs a CUDA GPU; the CPU trains in float32"),
    ("bf16_full_eval", False, _ON, "bfloat16 evaluation is for GPUs"),
    ("fp16_full_eval", False, _ON, "fp16 evaluation needs a CUDA GPU"),
    ("tf32", _UNSET, _ON, "TF32 is a mode of Ampere and newer GPUs"),
    ("use_liger_kernel", False, _ON, "Liger kernels are Triton GPU kernels"),
    ("liger_kernel_config", _UNSET, _ON, "Liger kernels are Triton GPU kernels"),
    ("torch_compile", False, _ON, "compiling takes longer on a CPU than the whole smoke run"),
    ("torch_compile_backend", _UNSET, _ON, "compiling takes longer on a CPU than the whole smoke run"),
    ("torch_compile_mode", _UNSET, _ON, "compiling takes longer on a CPU than the whole smoke run"),
    ("activation_offloading", False, _ON, "it offloads GPU activations to pinned CPU memory"),
    ("deepspeed", _UNSET, _ON, "DeepSpeed shards over GPUs; the smoke run is one CPU process"),
    ("fsdp", _UNSET, _ON, "FSDP shards over GPUs; the smoke run is one CPU process"),
    ("fsdp_config", _UNSET, _ON, "FSDP shards over GPUs; the smoke run is one CPU process"),
    ("ddp_backend", _UNSET, lambda v: v not in (None, "gloo"), "the smoke run is one CPU process"),
    ("use_vllm", False, _ON, "vLLM generates on GPUs; TRL generates with transformers instead"),
    ("push_to_hub", False, _ON, "a smoke run pushes nothing to the Hub"),
    ("log_completions_hub_repo", _UNSET, _ON, "a smoke run pushes nothing to the Hub"),
    ("report_to", "none", lambda v: v not in (None, "none", ["none"], []), "a smoke run reports to no tracker"),
)
_HUB_KEYS = ("hub_model_id", "hub_strategy", "hub_private_repo", "hub_always_push", "hub_revision")
_FAST_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")


def _machine(edits: _Edits, recipe: Recipe) -> None:
    """GPU settings replaced by their CPU equivalents (4-bit loading: ``_cpu_quantization``, once validated)."""
    train = recipe.train_args
    for key, value, applies, why in _GPU_TRAIN:
        if key in train and train[key] is not None and applies(train[key]):
            edits.set(f"train.{key}", value, why)
    if train.get("push_to_hub") or train.get("log_completions_hub_repo"):
        for key in _HUB_KEYS:
            if key in train:
                edits.set(f"train.{key}", _UNSET, "a smoke run pushes nothing to the Hub")
    if recipe.distributed.kind != "ddp":
        edits.set("distributed", _UNSET, f"{recipe.distributed.kind} shards the model over GPU processes; the smoke "
                  "run is one CPU process")
    if recipe.launch is not None:
        edits.set("launch", _UNSET, "the smoke run is one process")
    # on a machine with a GPU too: the smoke run is a CPU run (bf16 stays off: ft's GPU default would turn it on)
    edits.set("train.use_cpu", True, "the smoke run trains on the CPU", say="use_cpu" in train)
    if "fp16" not in train:
        edits.set("train.bf16", False, "the CPU trains in float32", say=False)
    if "report_to" not in train:  # ft's default (TensorBoard where installed, ft.trackers) is for real runs
        edits.set("train.report_to", "none", "a smoke run reports to no tracker", say=False)

    model = recipe.model
    if model.dtype in ("bfloat16", "float16"):
        edits.set("model.dtype", "float32", f"{model.dtype} weights are for GPUs; the CPU trains in float32")
    if model.attn_implementation in _FAST_ATTENTION:
        edits.set("model.attn_implementation", "sdpa", f"{model.attn_implementation} kernels need a GPU; PyTorch's "
                  "sdpa attention runs on the CPU")

    name = recipe.optimizer.name
    if getattr(recipe.optimizer, "cls", None) is not None or "name" not in recipe.optimizer.model_fields_set:
        return
    info = traits(name)
    package = PACKAGES.get(info.package or "")
    if info.cuda_only:
        alternative = getattr(hardware, "_CPU_ALTERNATIVE", {}).get(name, "adamw_torch")
        edits.set("optimizer.name", alternative, f"`{name}` runs on CUDA GPUs only; `{alternative}` is its CPU form")
    elif package is not None and package.install == "" and not _importable(package.module):
        edits.set("optimizer.name", "adamw_torch", f"`{name}` needs {package.purpose}")
    else:
        return
    if edits.get("optimizer.name") == "adamw_torch":
        for key in ("args", "target_modules"):
            if edits.get(f"optimizer.{key}") is not None:
                edits.set(f"optimizer.{key}", _UNSET, "adamw_torch takes none")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _cpu_quantization(edits: _Edits, smoke_recipe: Recipe, loaded: LoadedRecipe, base_dir: Path) -> Recipe:
    """4/8-bit loading stays where the installed bitsandbytes can do it on this CPU (as ``ft.hardware`` judges it);
    otherwise it goes, and the adapter trains on float32 weights (QLoRA becomes LoRA)."""
    if smoke_recipe.model.quantization is None:
        return smoke_recipe
    cpu = hardware.Hardware(cuda=False, bf16=False, devices=0, name="cpu")
    refused = [p for p in hardware.check_hardware(smoke_recipe, cpu) if p.path.startswith("model.quantization")]
    if not refused:
        return smoke_recipe
    edits.set("model.quantization", _UNSET, f"{first_line(refused[0].message).split(';')[0]}; the adapter trains on "
              "float32 weights instead (QLoRA becomes LoRA)")
    recipe, _ = validate(edits.raw, loaded.locations, base_dir=base_dir, source=str(loaded.source))
    return recipe


def _size(edits: _Edits, recipe: Recipe) -> None:
    """A few steps on small batches, logged every step, with one evaluation and one checkpoint."""
    train = recipe.train_args
    edits.set("train.max_steps", STEPS, "a few steps")
    if recipe.method != "grpo":  # GRPO's batch is counted in completions: it must stay a multiple of num_generations
        for key in ("per_device_train_batch_size", "per_device_eval_batch_size"):
            if train.get(key, 0) > MAX_BATCH:
                edits.set(f"train.{key}", MAX_BATCH, "small batches")
    if train.get("gradient_accumulation_steps", 1) > MAX_ACCUMULATION:
        edits.set("train.gradient_accumulation_steps", MAX_ACCUMULATION, "small batches")
    if train.get("logging_steps", 0) != 1:
        edits.set("train.logging_steps", 1, "every step is logged")
    if effective(recipe, "eval_strategy") == "steps":
        edits.set("train.eval_steps", STEPS, "one evaluation, at the last step")
    if effective(recipe, "save_strategy") == "steps":
        edits.set("train.save_steps", STEPS, "one checkpoint, at the last step")
    if recipe.data.num_proc:
        edits.set("data.num_proc", _UNSET, "a few dozen rows tokenize faster in one process")
    section = recipe.method_section
    if recipe.method == "grpo":
        length = section.max_completion_length if section is not None else None
        if length is None or length > MAX_COMPLETION:
            edits.set("grpo.max_completion_length", MAX_COMPLETION, "short completions")
    if train.get("max_completion_length", 0) > MAX_COMPLETION:  # ORPO
        edits.set("train.max_completion_length", MAX_COMPLETION, "short completions")


def _outputs(edits: _Edits, recipe: Recipe, out: Path) -> None:
    edits.set("train.output_dir", str(out), "the smoke run writes only into its own directory")
    if recipe.data.prepared_path is not None:
        edits.set("data.prepared_path", str(out / "prepared"), "the real prepared dataset is neither used nor "
                  "overwritten")
    if recipe.data.require_prepared:
        edits.set("data.require_prepared", False, "the smoke data is tokenized afresh")


# --- the model -------------------------------------------------------------------------------------------------


def _model(edits: _Edits, loaded: LoadedRecipe, base_dir: Path, model_dir: Path):
    """Saves the tiny model (random weights, config, tokenizer) in ``model_dir`` and points the recipe at it.
    Returns (description for summary.json, tokenizer)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    recipe = loaded.recipe
    section = recipe.model
    name, notes = section.name, []
    producer = _producer(name, base_dir)
    if producer is not None:
        path, name = producer
        notes.append(f"{section.name} does not exist yet; it is what {path} writes, whose model is {name}")
    kwargs = {"revision": section.revision if name == section.name else None,
              "trust_remote_code": section.trust_remote_code}
    config, config_error = _attempt(lambda: AutoConfig.from_pretrained(name, **kwargs))
    tokenizer, tokenizer_error = _attempt(lambda: AutoTokenizer.from_pretrained(name, **kwargs))
    family = FAMILY_OF_TYPE.get(config.model_type) if config is not None else _family_from_name(name)
    if family is None and config is None and _looks_local(name):
        family = DEFAULT_FAMILY
        notes.append(f"{name} does not exist and no recipe next to this one writes it, so its family is unknown: "
                     f"the {DEFAULT_FAMILY} asset stands in")
    if family is None and (config is None or tokenizer is None):
        missing = (f"its config cannot be read ({config_error})" if config is None
                   else f"its tokenizer cannot be read ({tokenizer_error}) and ft ships no tiny tokenizer for "
                        f"model_type {config.model_type!r}")
        raise loaded.error([Problem("model.name", f"the smoke test cannot tell what tiny model stands in for "
                                    f"{section.name!r}: {missing}, and its name names none of the families ft "
                                    f"ships tiny assets for ({', '.join(FAMILIES)}). Make the real config and "
                                    "tokenizer readable here (a local directory, or the HF cache).")])
    asset = _asset(family, loaded) if family is not None and (config is None or tokenizer is None) else None
    described = {"family": family, "config": None, "tokenizer": None, "notes": notes}

    generation = None
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(asset)
        generation = GenerationConfig.from_pretrained(asset)
        described["tokenizer"] = f"shipped {_short(asset)} (the real one cannot be read: {tokenizer_error})"
    else:
        described["tokenizer"] = f"the real one ({name})"
        generation, _ = _attempt(lambda: GenerationConfig.from_pretrained(name, **kwargs))
    tiny = None
    if config is not None:
        try:
            tiny, changed = _shrink(config)
            described["config"] = f"the real one ({name}), shrunk: " + (", ".join(changed) or "already tiny")
        except Exception as exc:  # a config class that refuses the tiny sizes: the family asset, when there is one
            if family is None:
                raise ModelLoadError(f"model.name: the smoke test could not shrink the config of {name!r} "
                                     f"({first_line(exc)}).") from None
            config_error = f"shrinking it failed: {first_line(exc)}"
    if tiny is None:
        asset = asset or _asset(family, loaded)
        tiny = AutoConfig.from_pretrained(asset)
        described["config"] = f"shipped {_short(asset)} (the real one cannot be read: {config_error})"
    text = tiny.get_text_config()
    if described["config"].startswith("shipped") != described["tokenizer"].startswith("shipped"):
        # config and tokenizer from two places: the tokenizer's vocabulary and special tokens
        text.vocab_size = (len(tokenizer) + 7) // 8 * 8
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            setattr(text, key, getattr(tokenizer, key, None))
    text.vocab_size = max(text.vocab_size or 0, (len(tokenizer) + 7) // 8 * 8)

    torch.manual_seed(recipe.train_args.get("seed", 42))
    try:
        model = AutoModelForCausalLM.from_config(tiny, dtype=torch.float32,
                                                 trust_remote_code=section.trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(f"model.name: the smoke test could not build a tiny model from the config of "
                             f"{name!r} ({first_line(exc)}).") from None
    _check_adapter(recipe, model, loaded, tiny.model_type)
    model_dir.mkdir(parents=True)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    if generation is not None:
        generation.save_pretrained(model_dir)
    described["model_type"] = tiny.model_type
    described["parameters"] = sum(p.numel() for p in model.parameters())

    where = ", ".join(filter(None, [f"config: {described['config']}", f"tokenizer: {described['tokenizer']}",
                                    *notes]))
    edits.set("model.name", str(model_dir), f"a tiny random {tiny.model_type} model with "
              f"{described['parameters']:,} parameters; {where}")
    if section.revision is not None:
        edits.set("model.revision", _UNSET, "the tiny model is a local directory")
    ref = getattr(recipe.method_section, "ref_model", None)
    if ref is not None:
        edits.set(f"{recipe.method}.ref_model", str(model_dir), "the reference model is the tiny model too")
    _adapter_path(edits, recipe)
    return described, tokenizer


def _attempt(load: Callable):
    try:
        return load(), None
    except Exception as exc:  # unreachable, gated, missing, malformed: the caller falls back and says why
        return None, first_line(exc)


def _looks_local(name: str) -> bool:
    """A path rather than a hub id (``org/name``)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _family_from_name(name: str) -> str | None:
    lowered = name.lower()
    found = [(lowered.find(word), family) for word, family in FAMILY_WORDS.items() if word in lowered]
    return min(found)[1] if found else None


def _asset(family: str, loaded: LoadedRecipe) -> Path:
    path = ASSETS / FAMILIES[family]
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model.name: the smoke test needs ft's shipped tiny {family} model in {path}, which is "
                             "missing (ft installed without its repository's assets/?); make the real config and "
                             f"tokenizer of {loaded.recipe.model.name!r} readable here instead.")
    return path


def _short(path: Path) -> str:
    try:
        return str(path.relative_to(ASSETS.parent))
    except ValueError:
        return str(path)


def _producer(name: str, base_dir: Path, depth: int = 3) -> tuple[str, str] | None:
    """(recipe path, its model.name) when ``name`` is a model another recipe next to this one writes and it does
    not exist yet (``../runs/quickstart/final``: the quickstart's ``final/`` or one of its checkpoints)."""
    if not _looks_local(name) or Path(name).exists() or depth == 0:
        return None
    target = (base_dir / Path(name).expanduser()).resolve()
    for path in sorted(base_dir.glob("*.y*ml")):
        try:
            other = load_recipe(path).recipe
        except Exception:  # a recipe that does not load writes nothing
            continue
        out = Path(str(other.train_args["output_dir"])).resolve()
        if target == out / "final" or (target.parent == out and target.name.startswith("checkpoint-")):
            found = other.model.name
            deeper = _producer(found, path.resolve().parent, depth - 1)
            return (str(path), deeper[1] if deeper else found)
    return None


def _shrink(config) -> tuple[object, list[str]]:
    """A copy of ``config`` at the smoke sizes (never larger than it was), with what changed. The family's own
    fields (rope scaling, sliding windows, soft-capping, …) stay; per-layer lists are cut to the new depth."""
    values = config.to_dict()
    changed: list[str] = []
    _shrink_dict(values, changed, "")
    return type(config).from_dict(values), changed


def _shrink_dict(values: dict, changed: list[str], prefix: str) -> None:
    def put(key: str, value) -> None:
        if key in values and values[key] is not None and values[key] != value:
            changed.append(f"{prefix}{key} {values[key]} -> {value}")
            values[key] = value

    if "num_hidden_layers" in values and "hidden_size" in values:
        layers = min(values["num_hidden_layers"], TINY["num_hidden_layers"])
        heads = min(values.get("num_attention_heads") or TINY["num_attention_heads"], TINY["num_attention_heads"])
        kv = values.get("num_key_value_heads")
        if kv is not None:
            kv = heads if kv >= values.get("num_attention_heads", kv) else min(kv, TINY["num_key_value_heads"], heads)
            while heads % kv:
                kv -= 1
        hidden = min(values["hidden_size"], TINY["hidden_size"])
        put("num_hidden_layers", layers)
        put("hidden_size", hidden)
        put("num_attention_heads", heads)
        put("num_key_value_heads", kv)
        put("head_dim", hidden // heads)
        put("intermediate_size", min(values.get("intermediate_size") or 0, TINY["intermediate_size"]))
        for key, tiny in TINY_MOE.items():
            if isinstance(values.get(key), int):
                put(key, min(values[key], tiny))
        if isinstance(values.get("layer_types"), list):
            put("layer_types", values["layer_types"][:layers])
        if isinstance(values.get("max_window_layers"), int):
            put("max_window_layers", min(values["max_window_layers"], layers))
    for key in ("text_config",):  # a multimodal config's language model
        if isinstance(values.get(key), dict):
            _shrink_dict(values[key], changed, f"{prefix}{key}.")


def _check_adapter(recipe: Recipe, model, loaded: LoadedRecipe, model_type: str) -> None:
    """``adapter.target_modules`` and ``modules_to_save`` must name modules the model has (matched as PEFT does);
    a real run fails when PEFT finds none, or quietly trains fewer layers when it finds only some."""
    adapter = recipe.adapter
    if adapter is None or getattr(adapter, "path", None):
        return
    import torch

    names = [name for name, _ in model.named_modules() if name]
    linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                     if isinstance(module, torch.nn.Linear)})
    problems = []
    targets = adapter.target_modules
    if isinstance(targets, str) and targets != "all-linear":
        if not any(re.fullmatch(targets, name) for name in names):
            problems.append(Problem("adapter.target_modules", f"the regular expression {targets!r} matches no module "
                                    f"name of a {model_type} model (e.g. {names[len(names) // 2]}); its linear "
                                    f"layers are {', '.join(linear)}."))
    elif isinstance(targets, list):
        missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
        if missing:
            problems.append(Problem("adapter.target_modules", f"{', '.join(missing)}: no such module in a "
                                    f"{model_type} model, whose linear layers are {', '.join(linear)}. (A real run "
                                    "fails when PEFT finds none of the names, and trains fewer layers than meant "
                                    "when it finds only some.)"))
    missing = [t for t in adapter.modules_to_save or [] if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        top = sorted({n.rsplit(".", 1)[-1] for n in names if n.count(".") <= 1})
        problems.append(Problem("adapter.modules_to_save", f"{', '.join(missing)}: no such module in a {model_type} "
                                f"model (its top-level modules: {', '.join(top)})."))
    if problems:
        raise loaded.error(problems)


def _adapter_path(edits: _Edits, recipe: Recipe) -> None:
    """A saved adapter fits the real model's shapes only: the smoke run trains a fresh one of the same shape."""
    adapter = recipe.adapter
    path = getattr(adapter, "path", None) if adapter is not None else None
    if not path:
        return
    edits.set("adapter.path", _UNSET, "a saved adapter's weights fit only the real model; the smoke run trains a "
              "fresh adapter of its shape")
    try:
        saved = json.loads((Path(path) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return
    shape = {"r": saved.get("r"), "alpha": saved.get("lora_alpha"), "dropout": saved.get("lora_dropout"),
             "target_modules": saved.get("target_modules"), "modules_to_save": saved.get("modules_to_save"),
             "use_dora": saved.get("use_dora"), "use_rslora": saved.get("use_rslora")}
    for key, value in shape.items():
        if value is not None:
            edits.set(f"adapter.{key}", sorted(value) if isinstance(value, list) else value,
                      f"the shape of the saved adapter in {path}", say=False)


# --- the data --------------------------------------------------------------------------------------------------


_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt")


def _data(edits: _Edits, recipe: Recipe, data_dir: Path, tokenizer) -> dict[str, str]:
    """Each source's first rows, or generated rows; returns {copy path: original path} for error messages."""
    data_dir.mkdir(parents=True)
    copies: dict[str, str] = {}
    chat = bool(getattr(tokenizer, "chat_template", None))
    scored = recipe.data.eval_exact_match
    keyed = [(f"data.{split}.{i}", split, source) for split, sources in (("train", recipe.data.train),
                                                                         ("eval", recipe.data.eval_sources))
             for i, source in enumerate(sources)]
    if scored is not None:
        edits.set("data.eval_exact_match.n", min(scored.n, ROWS["eval"]), "the exact match scores a few prompts",
                  say=False)
        if scored.source is not None:
            keyed.append(("data.eval_exact_match.source", "eval", scored.source))
    for key, split, source in keyed:
        rows = ROWS[split]
        copy, why = _head(source, rows, data_dir / key.removeprefix("data."))
        if copy is not None:
            copies[str(copy)] = source.path
            edits.set(f"{key}.path", str(copy), why)
        elif why is not None:  # unreachable: generated rows
            path = data_dir / f"{key.removeprefix('data.')}.generated.jsonl"
            _write_jsonl(path, _generated(source, split, rows, recipe, chat))
            edits.set(f"{key}.path", str(path), f"{rows} generated `{source.format}` rows in the source's "
                      f"layout: the data cannot be read here ({why})")
    return copies


def _head(source, rows: int, stem: Path) -> tuple[Path | None, str | None]:
    """(copy of the source's first ``rows`` rows, why) — (None, None): use the source as it is (it has no more rows,
    or it is a local path whose reading the real pipeline reports); (None, reason): unreachable, generate rows."""
    path = Path(source.path)
    try:
        if path.is_file():
            return _file_head(path, rows, stem)
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            return _disk_head(path, rows, stem)
    except Exception:  # unreadable: the real pipeline reads it whole and reports it
        return None, None
    local = path.is_dir() or path.is_absolute() or source.path.startswith((".", "~")) or \
        path.suffix.lower() in _FILE_SUFFIXES
    if local and not path.is_dir():
        return None, None  # does not exist: the real pipeline says so
    return _dataset_head(source, rows, stem, local)


def _file_head(path: Path, rows: int, stem: Path) -> tuple[Path | None, str | None]:
    suffix = path.suffix.lower()
    copy = stem.with_name(f"{stem.name}.{path.name}")
    why = f"the first {rows} rows of {path}"
    if suffix in (".jsonl", ".txt"):  # line for line, blank lines included: errors keep their line numbers
        written = 0
        with open(path, "rb") as f, open(copy, "wb") as g:
            for line in f:
                if written == rows:
                    return copy, why
                g.write(line)
                written += bool(line.strip())
        copy.unlink()
        return None, None
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        if parquet.metadata.num_rows <= rows:
            return None, None
        pq.write_table(next(parquet.iter_batches(batch_size=rows)), copy)
        return copy, why
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            records = [record for _, record in zip(range(rows + 2), csv.reader(f), strict=False)]
        if len(records) <= rows + 1:
            return None, None
        with open(copy, "w", newline="", encoding="utf-8") as g:
            csv.writer(g).writerows(records[: rows + 1])
        return copy, why
    if suffix == ".json":
        text = path.read_text(encoding="utf-8-sig")
        if not text.lstrip().startswith("["):  # JSON lines in a .json file
            lines = [line for line in text.splitlines(keepends=True)]
            kept, count = [], 0
            for line in lines:
                if count == rows:
                    copy.write_text("".join(kept), encoding="utf-8")
                    return copy, why
                kept.append(line)
                count += bool(line.strip())
            return None, None
        items = json.loads(text)
        if not isinstance(items, list) or len(items) <= rows:
            return None, None
        copy.write_text(json.dumps(items[:rows], ensure_ascii=False), encoding="utf-8")
        return copy, why
    return None, None


def _disk_head(path: Path, rows: int, stem: Path) -> tuple[Path | None, str | None]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    parts = loaded if isinstance(loaded, datasets.DatasetDict) else {"": loaded}
    if all(len(part) <= rows for part in parts.values()):
        return None, None
    heads = {name: part.select(range(min(rows, len(part)))) for name, part in parts.items()}
    copy = stem.with_name(f"{stem.name}.{path.name}")
    (datasets.DatasetDict(heads) if isinstance(loaded, datasets.DatasetDict) else heads[""]).save_to_disk(str(copy))
    return copy, f"the first {rows} rows of {path}"


def _dataset_head(source, rows: int, stem: Path, local: bool) -> tuple[Path | None, str | None]:
    """A hub dataset (or a local folder of data files): its first rows from the cache when offline, from a stream
    when online, saved as a one-split DatasetDict (so a bad row is reported as ``path[split]:index``)."""
    import datasets
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE or datasets.config.HF_DATASETS_OFFLINE
    try:
        if offline or local:
            head = datasets.load_dataset(source.path, source.name, split=f"{source.split}[:{rows}]",
                                         revision=source.revision)
        else:
            stream = datasets.load_dataset(source.path, source.name, split=source.split, revision=source.revision,
                                           streaming=True)
            head = datasets.Dataset.from_list(list(stream.take(rows)))
    except Exception as exc:
        return (None, None) if local else (None, first_line(exc))
    copy = stem.with_name(f"{stem.name}.dataset")
    datasets.DatasetDict({source.split: head}).save_to_disk(str(copy))
    where = "the HF cache" if offline else "a stream"
    return copy, f"the first {len(head)} rows of {source.path} [{source.split}], from {where}"


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def _generated(source, split: str, count: int, recipe: Recipe, chat: bool) -> list[dict]:
    """``count`` arithmetic rows in ``source.format``, laid out as the source's ``fields:`` and ``roles:`` say its
    rows are (so the mapping is exercised); prompt rows carry every field the built-in rewards read."""
    names = source.fields.get
    roles: dict[str, str] = {}
    for theirs, canonical in source.roles.items():
        roles.setdefault(canonical, theirs)

    def message(role: str, content: str) -> dict:
        return {names("role", "role"): roles.get(role, role), names("content", "content"): content}

    fields = _reward_fields(recipe)
    start = 0 if split == "train" else 1000
    out = []
    for i in range(start, start + count):
        a, b = (7 * i + 3) % 50, (13 * i + 5) % 50
        question, answer, wrong = f"What is {a} + {b}?", str(a + b), str(a + b + 1 + i % 5)
        if source.format == "chat":
            turns = [message("user", question), message("assistant", answer)]
            if i % 3 == 2:
                turns += [message("user", f"And {a} - {b}?"), message("assistant", str(a - b))]
            out.append({names("messages", "messages"): turns})
        elif source.format == "instruction":
            out.append({names("instruction", "instruction"): "Add the two numbers.",
                        names("input", "input"): f"{a} and {b}" if i % 2 else "",
                        names("output", "output"): answer})
        elif source.format == "text":
            if "prompt" in source.fields or "completion" in source.fields:
                out.append({names("prompt", "prompt"): question, names("completion", "completion"): f" {answer}"})
            else:
                out.append({names("text", "text"): f"{question} {answer}"})
        elif source.format == "preference":
            if chat:
                out.append({names("prompt", "prompt"): [message("user", question)],
                            names("chosen", "chosen"): [message("assistant", answer)],
                            names("rejected", "rejected"): [message("assistant", wrong)]})
            else:
                out.append({names("prompt", "prompt"): question, names("chosen", "chosen"): f" {answer}",
                            names("rejected", "rejected"): f" {wrong}"})
        else:  # prompt (GRPO)
            prompt = [message("user", question)] if chat else question
            out.append({names("prompt", "prompt"): prompt, **dict.fromkeys(fields, answer)})
    return out


def _reward_fields(recipe: Recipe) -> list[str]:
    """The row fields GRPO's rewards read: the built-ins' ``field`` (``answer`` by default), and ``answer`` for
    user functions (which fields those read cannot be known)."""
    fields = ["answer"]
    section = recipe.method_section if recipe.method == "grpo" else None
    for spec in getattr(section, "rewards", []) or []:
        if spec.name in ("exact_match", "numeric_match"):
            fields.append(str(spec.args.get("field", "answer")))
    return list(dict.fromkeys(fields))


def _shown(value) -> str:
    if value is _UNSET:
        return "unset"
    return json.dumps(value) if isinstance(value, (bool, type(None))) else str(value)


def _plain(value):
    return None if value is _UNSET else value

