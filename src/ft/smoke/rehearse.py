"""``ft train RECIPE --smoke``: the recipe end to end on a tiny random model of the same family, a few dozen rows and
a few steps on the CPU, in ``<train.output_dir>-smoke``, to catch recipe, data and template errors before renting a
GPU. The real output directory (and ``data.prepared_path``) is never touched.

``prepare`` turns the loaded recipe into the smoke recipe: the recipe as written (every key it set, input paths
resolved), changed where a CPU smoke run must differ, then validated again by ``recipe.load.validate`` so every rule
still applies. Each change is a ``Substitution`` (key, was, now, why); ``train`` prints them at the start and at the
end and writes them into summary.json under ``"smoke"``. Everything else stays as the recipe says: method, adapter
and its target_modules (checked against the tiny model), chat template, data formats, masks, optimizer, scheduler,
rules, callbacks, loss, metrics and rewards.

- Model: a tiny random model of the recipe's family (``smoke.tiny_model``: the real config shrunk, or a shipped
  family asset); a vision-language model's (``model.modality``, or its config) is a tiny image-text-to-text model
  with a processor whose images are a few tokens. A model.name that is a run's output not written yet
  (``../runs/quickstart/final``) is looked up among the recipes next to this one. Random weights are saved in
  ``inputs/model``: ``init: pretrained`` loads them.
- The models the method's section declares (``MethodSection.models``), each under its recipe key: one that loads as
  a causal LM (a DPO ``ref_model``, a teacher) is the tiny model too, in ``inputs/model``; a reward model
  (``rewards: [{model: ...}]``) is a tiny random sequence classifier of its family, with its real tokenizer and chat
  template, looked up like the model when a recipe here writes it.
- Data: each source's first ``ROWS`` rows (``smoke.first_rows``; copied to ``inputs/data`` when it has more; errors
  about a copy name the original file and line), or rows generated in its format when it cannot be read. For a
  vision-language model a copy's image paths are made absolute, and generated chats are about generated pictures.
- Machine: what a GPU recipe sets that this CPU cannot run (bf16/fp16, flash attention, Liger kernels, 4-bit
  loading where bitsandbytes cannot do it here, CUDA-only optimizers, DeepSpeed/FSDP, vLLM, torch.compile), replaced
  by the CPU equivalent; nothing is pushed or reported to trackers.
- Size: ``STEPS`` steps, batches of at most ``MAX_BATCH``, logging every step, one evaluation and one checkpoint.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..data import DataError
from ..machine import hardware
from ..model.loading import named_tokens, names_a_path
from ..model.locate import writer_of
from ..outputs.lock import LOCK_NAME
from ..outputs.summary import write_summary
from ..recipe import LoadedRecipe, Problem, Recipe, RecipeError, load_recipe
from ..recipe.benchmarks import is_task_file
from ..recipe.errors import first_line
from ..recipe.hub import HUB_SETTINGS, PUSHING
from ..recipe.load import validate
from ..recipe.methods import METHODS, ExtraModel, generation_of, models_of
from ..recipe.optimizers import PACKAGES, traits
from ..recipe.schema import ModelSection
from . import first_rows, tiny_model

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


def train(loaded: LoadedRecipe, say: Callable[[str], None] = print, *, command: str | None = None, callbacks=(),
          imports: Callable[[Recipe], None] | None = None):
    """``ft train --smoke``: ``prepare``, then ``run.train`` on the smoke recipe (always a fresh run; ``imports`` as
    there, given the smoke recipe), then the substitutions added to summary.json. Returns run.train's ``RunResult``.
    The smoke directory is held throughout (``outputs.lock``, which ``run.train`` takes again): a second smoke test of
    it is refused before it clears it."""
    from ..outputs import lock

    with lock.output_dir(output_dir(loaded.recipe), command="ft train --smoke"):
        return _rehearse(loaded, say, command, callbacks, imports)


def _rehearse(loaded: LoadedRecipe, say: Callable[[str], None], command: str | None, callbacks,
              imports: Callable[[Recipe], None] | None):
    """``train``, once the smoke directory is held."""
    from ..run.train import train as run_train

    started = time.perf_counter()
    smoke = prepare(loaded, say)
    say(f"ft: smoke test of {loaded.source}: {loaded.recipe.method} on a tiny random {smoke.model['model_type']} "
        f"model, at most {ROWS['train']} rows per source, {STEPS} steps on the CPU, in {smoke.output_dir} "
        f"({smoke.real_output_dir} is not touched). Substituted:\n"
        + "\n".join(f"  - {s.render()}" for s in smoke.substitutions))
    try:
        result = run_train(smoke.loaded, resume="never", say=say, callbacks=callbacks, imports=imports,
                           command=command or f"ft train {loaded.source} --smoke")
    except DataError as exc:
        raise DataError(smoke.unmap(str(exc))) from None
    result.summary["smoke"] = smoke.describe()
    write_summary(result.output_dir, result.summary)
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
    model, processing = _model(edits, loaded, base_dir, out / "inputs" / "model")
    _extra_models(edits, loaded, base_dir, out / "inputs")
    copies = _data(edits, recipe, out / "inputs" / "data", processing, seeing=model["modality"] == "vision")
    _benchmarks(edits, recipe)
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
    """An empty ``out`` marked as a smoke directory; a previous smoke run's is cleared, anything else refused. The lock
    file of the hold ``train`` took on it stays (``outputs.lock``)."""
    if out.exists():
        entries = [entry for entry in out.iterdir() if entry.name != LOCK_NAME] if out.is_dir() else []
        if not out.is_dir() or (entries and not (out / MARKER).is_file()):
            raise loaded.error([Problem("train.output_dir", f"`ft train --smoke` writes into {out}, which exists and "
                                        f"was not written by a smoke run (it has no {MARKER}); move it away or set "
                                        "train.output_dir elsewhere.")])
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    out.mkdir(parents=True, exist_ok=True)
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
_FAST_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")


def _machine(edits: _Edits, recipe: Recipe) -> None:
    """GPU settings replaced by their CPU equivalents (4-bit loading: ``_cpu_quantization``, once validated)."""
    train = recipe.train_args
    for key, value, applies, why in _GPU_TRAIN:
        if key in train and train[key] is not None and applies(train[key]):
            edits.set(f"train.{key}", value, why)
    if any(train.get(key) for key in PUSHING):
        for key in HUB_SETTINGS:
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
    if "report_to" not in train:  # ft's default (TensorBoard where installed, ft.machine.trackers) is for real runs
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
        alternative = hardware.CPU_ALTERNATIVE.get(name, "adamw_torch")
        edits.set("optimizer.name", alternative, f"`{name}` runs on CUDA GPUs only; `{alternative}` is its CPU form")
    elif package is not None and package.install in ("", "pip") and not _importable(package.module):
        # a package ft does not install: the smoke run rehearses the rest, and says what the real run needs
        needs = f"; the real run needs `pip install {info.package}`" if package.install == "pip" else ""
        edits.set("optimizer.name", "adamw_torch", f"`{name}` needs {package.purpose}, not installed here{needs}")
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
    """4/8-bit loading stays where the installed bitsandbytes can do it on this CPU (as ``ft.machine.hardware`` judges
    it); otherwise it goes, and the adapter trains on float32 weights (QLoRA becomes LoRA)."""
    if smoke_recipe.model.quantization is None:
        return smoke_recipe
    cpu = hardware.Hardware(cuda=False, bf16=False, devices=0, name="cpu")  # one process: launch: is removed
    refused = [p for p in hardware.check_hardware(smoke_recipe, cpu) if p.path.startswith("model.quantization")]
    if not refused:
        return smoke_recipe
    edits.set("model.quantization", _UNSET, f"{first_line(refused[0].message).split(';')[0]}; the adapter trains on "
              "float32 weights instead (QLoRA becomes LoRA)")
    recipe, _ = validate(edits.raw, loaded.locations, base_dir=base_dir, source=str(loaded.source))
    return recipe


def _size(edits: _Edits, recipe: Recipe) -> None:
    """A few steps on small batches, logged every step, with one evaluation and one checkpoint."""
    train, generates = recipe.train_args, METHODS[recipe.method].generates
    edits.set("train.max_steps", STEPS, "a few steps")
    if not generates:  # GRPO's batch is counted in completions: it must stay a multiple of num_generations
        for key in ("per_device_train_batch_size", "per_device_eval_batch_size"):
            if train.get(key, 0) > MAX_BATCH:
                edits.set(f"train.{key}", MAX_BATCH, "small batches")
    if train.get("gradient_accumulation_steps", 1) > MAX_ACCUMULATION:
        edits.set("train.gradient_accumulation_steps", MAX_ACCUMULATION, "small batches")
    if train.get("logging_steps", 0) != 1:
        edits.set("train.logging_steps", 1, "every step is logged")
    if recipe.effective("eval_strategy") == "steps":
        edits.set("train.eval_steps", STEPS, "one evaluation, at the last step")
    if recipe.effective("save_strategy") == "steps":
        edits.set("train.save_steps", STEPS, "one checkpoint, at the last step")
    if recipe.data.num_proc:
        edits.set("data.num_proc", _UNSET, "a few dozen rows tokenize faster in one process")
    generation = generation_of(recipe)
    if generation is not None and generation.max_completion_length > MAX_COMPLETION:
        edits.set(generation.key("max_completion_length"), MAX_COMPLETION, "short completions")
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
    """Saves the tiny model (random weights, config, tokenizer or processor) in ``model_dir`` and points the recipe
    at it. Returns (description for summary.json, its processing class: a tokenizer, or a vision-language model's
    processor). ``model.modality`` (the recipe's, else the run it starts from) is the stand-in's too."""
    recipe = loaded.recipe
    section, notes = recipe.model, []
    producer = _producer(section.name, base_dir)
    if producer is not None:  # the model of another recipe's run
        said, section = producer
        notes.append(f"{recipe.model.name} {said}, whose model is {section.name}")
    try:
        tiny = tiny_model.stand_in(section.name, section.revision, section.trust_remote_code,
                                   recipe.train_args.get("seed", 42), notes, named=recipe.model.name,
                                   gguf_file=section.gguf_file, tokens=named_tokens(recipe),
                                   modality=recipe.model.modality or section.modality)
    except tiny_model.UnknownFamily as exc:
        raise loaded.error([Problem("model.name", str(exc))]) from None
    fitted = tiny_model.fitted_to_generic(recipe.adapter, tiny)
    for key, value in fitted.items():
        edits.set(f"adapter.{key}", _UNSET if value is None else value, f"the generic tiny {tiny.model_type} "
                  f"stand-in lacks some of these names, which are another family's; the real run's PEFT checks them "
                  f"against {section.name}")
    problems = [] if fitted else tiny_model.adapter_problems(recipe.adapter, tiny, section.name)
    if problems:
        raise loaded.error(problems)
    tiny.save(model_dir)
    described = tiny.described
    where = ", ".join(filter(None, [f"{part}: {described[part]}" for part in ("config", "tokenizer", "processor")
                                    if described.get(part)] + notes))
    kind = "vision-language " if described["modality"] == "vision" else ""
    edits.set("model.name", str(model_dir), f"a tiny random {tiny.model_type} {kind}model with "
              f"{described['parameters']:,} parameters; {where}")
    if section.revision is not None:
        edits.set("model.revision", _UNSET, "the tiny model is a local directory")
    if section.gguf_file is not None:
        edits.set("model.gguf_file", _UNSET, "the tiny model is a plain model directory")
    _adapter_path(edits, recipe)
    return described, tiny.processing


def _extra_models(edits: _Edits, loaded: LoadedRecipe, base_dir: Path, folder: Path) -> None:
    """A stand-in for each model the method's section declares (``MethodSection.models``), set at its recipe key: one
    that loads as a causal LM (a reference, a teacher) is the tiny model (``inputs/model``), which shares the policy's
    vocabulary as the real ones must; one that scores (a reward model) is ``_scorer``'s."""
    for extra in models_of(loaded.recipe):
        if extra.scores:
            _scorer(edits, loaded, base_dir, folder, extra)
        else:
            edits.set(extra.key, str(folder / "model"), f"{extra.what} is the tiny model too")


def _scorer(edits: _Edits, loaded: LoadedRecipe, base_dir: Path, folder: Path, extra: ExtraModel) -> None:
    """A reward model stands in as a tiny random sequence classifier of its family with its real tokenizer, whose
    chat template the smoke run then renders the prompts with, in ``inputs/<its recipe key>/`` under the last two
    parts of its name (``rm/final``: TRL logs it as ``rm`` still). One that a recipe next to this one writes
    (``../runs/rm/final``) is looked up as the model is."""
    recipe, notes = loaded.recipe, []
    section = ModelSection(name=extra.name, trust_remote_code=recipe.model.trust_remote_code)
    producer = _producer(extra.name, base_dir)
    if producer is not None:
        said, section = producer
        notes.append(f"{extra.name} {said}, from {section.name}")
    try:
        tiny = tiny_model.stand_in(section.name, section.revision, section.trust_remote_code,
                                   recipe.train_args.get("seed", 42), notes, named=extra.name,
                                   gguf_file=section.gguf_file)
    except tiny_model.UnknownFamily as exc:
        raise loaded.error([Problem(extra.key, str(exc))]) from None
    target = folder.joinpath(extra.key, *Path(extra.name).parts[-2:])  # its last parts: logged under its name
    tiny.save_as_scorer(target, recipe.train_args.get("seed", 42))
    described = tiny.described
    where = ", ".join(filter(None, [f"tokenizer: {described['tokenizer']}", *notes]))
    edits.set(extra.key, str(target), f"a tiny random {tiny.model_type} reward model; {where}")


def _producer(name: str, base_dir: Path, depth: int = 3) -> tuple[str, ModelSection] | None:
    """(what the run is, naming its recipe; the model section it starts from) when ``name`` is a run: one another
    recipe next to this one writes and that does not exist yet (``../runs/quickstart/final``: the quickstart's run
    directory, its ``final/`` or one of its checkpoints), or one that exists with no model folder of its own (a LoRA
    run, or a run directory), read from its recipe.yaml; a run of a run is followed to the model it started from."""
    if not names_a_path(name) or depth == 0:
        return None
    target = (base_dir / Path(name).expanduser()).resolve()
    if target.exists():
        return _trained_run(target, depth)
    writer = writer_of(target, base_dir)
    if writer is None:
        return None
    path, other = writer
    deeper = _producer(other.model.name, path.resolve().parent, depth - 1)
    return f"does not exist yet; it is what {path} writes", deeper[1] if deeper else other.model


def _trained_run(path: Path, depth: int) -> tuple[str, ModelSection] | None:
    """(what the run is, naming its recipe.yaml; the model it started from) for a run that exists (its directory,
    final/ or a checkpoint; finished or not: the real run says what it lacks); None for a model folder (its config and
    tokenizer are read as they are) or a folder without a run's recipe.yaml."""
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    recipe_file = next((folder / "recipe.yaml" for folder in (path, path.parent) if (folder / "recipe.yaml").is_file()),
                       None)
    if recipe_file is None:
        return None
    try:
        model = load_recipe(recipe_file).recipe.model
    except RecipeError:  # a recipe.yaml that no longer loads: the real run says so
        return None
    deeper = _producer(model.name, recipe_file.parent, depth - 1)
    return f"is the run {recipe_file} records", deeper[1] if deeper else model


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


def _data(edits: _Edits, recipe: Recipe, data_dir: Path, processing, seeing: bool = False) -> dict[str, str]:
    """Each source's first rows, or generated rows; returns {copy path: original path} for error messages.
    ``seeing``: the model reads images (``processing`` is its processor): a copy's image paths keep pointing at the
    source's images, and a chat source that cannot be read gets rows with generated images."""
    data_dir.mkdir(parents=True)
    copies: dict[str, str] = {}
    chat = bool(getattr(processing, "chat_template", None))
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
        rows, stem = ROWS[split], data_dir / key.removeprefix("data.")
        copy, why = first_rows.head(source, rows, stem, images=seeing)
        if copy is not None:
            copies[str(copy)] = source.path
            edits.set(f"{key}.path", str(copy), why)
        elif why is not None:  # unreachable: generated rows
            path = stem.with_name(f"{stem.name}.generated.jsonl")
            if seeing and source.format == "chat":  # the format whose rows hold images
                made = first_rows.generated_with_images(source, split, rows, path)
                what = f"{rows} generated `chat` rows with images ({made}) in the source's layout"
            else:
                first_rows.write_jsonl(path, first_rows.generated(source, split, rows, recipe, chat))
                what = f"{rows} generated `{source.format}` rows in the source's layout"
            edits.set(f"{key}.path", str(path), f"{what}: the data cannot be read here ({why})")
    return copies


def _benchmarks(edits: _Edits, recipe: Recipe) -> None:
    """The benchmarks on a few rows of each task file; tasks named from lm-eval's registry are left out (their data is
    on the Hub: a download, or a refusal offline), and with them all, the section."""
    benchmarks = recipe.benchmarks
    if benchmarks is None:
        return
    files = [task for task in benchmarks.tasks if is_task_file(task)]
    why = "lm-eval's own tasks read their data from the Hub; the smoke run scores only task files"
    if not files:
        edits.set("benchmarks", _UNSET, f"{why}, and the recipe names none")
        return
    if files != list(benchmarks.tasks):
        edits.set("benchmarks.tasks", files, why)
    if benchmarks.limit is None or benchmarks.limit > ROWS["eval"]:  # a fraction below 1 is kept
        edits.set("benchmarks.limit", ROWS["eval"], "the benchmarks score a few rows of each task", say=False)


def _shown(value) -> str:
    if value is _UNSET:
        return "unset"
    return json.dumps(value) if isinstance(value, (bool, type(None))) else str(value)


def _plain(value):
    return None if value is _UNSET else value

