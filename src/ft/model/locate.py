"""What a run left, found and loaded: its model or adapter (``locate``), the base an adapter was trained on
(``find_base``, ``load_base``), and a model with its processing class (tokenizer or processor) ready to generate
(``load_for_generation``), for ``ft merge`` and ``ft generate``; and the model, processing class and config of a
recipe whose ``model.name`` is a run (``load_start``, ``start_processing_class``, ``start_config``), for ``ft train``,
``ft preprocess`` and ``ft plan``.

A run leaves ``final/`` (or ``checkpoint-N/``) holding either a full model or a PEFT adapter, next to the resolved
``recipe.yaml`` and ``summary.json``. An adapter is useless without the exact base it was trained on, so the base is
rebuilt from what the run recorded rather than from the adapter's own ``base_model_name_or_path`` alone: the
recipe's model section (revision, dtype, trust_remote_code, quantization) and, for ``model.init: random``, the seed.

A recipe may start from a run: ``model.name`` naming a run directory, its final/ or a checkpoint-N/ (``named_run``).
A full model there is loaded as any model folder; a LoRA adapter is folded into the base it was trained on, as
``ft merge`` folds it but in memory, and the folded weights are loaded with the recipe's own class, dtype and
quantization (``load_start``): SFT with LoRA, then a reward model or DPO from it, without a merge step between. The
base of such a run may itself be a run: each is rebuilt the same way, in turn.

Random-init bases: ``ft.model.loading.load_model`` seeds the RNG right before it builds the model from its config,
so the same recipe and seed give bit-identical weights (with the same torch and transformers versions). A run
directory therefore records its base exactly even when the base never had weights on disk; a bare adapter folder
does not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import FtError
from ..recipe.errors import first_line
from ..recipe.methods import METHODS, MODEL_CLASSES
from .loading import (
    ModelLoadError,
    load_config,
    load_model,
    load_weights,
    modality_of,
    names_a_path,
    text_tokenizer,
)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def writer_of(target: Path, folder: Path):
    """(the recipe file, its Recipe) of the recipe in ``folder`` whose run writes ``target`` (a path that does not
    exist yet: that run's directory, its ``final/`` or one of its checkpoints), or None: ``model.name:
    ../runs/smollm2-sft`` in a recipe next to ``smollm2-sft.yaml`` names the run that recipe trains."""
    from ..recipe import load_recipe

    target = target.resolve()
    for path in sorted(folder.glob("*.y*ml")):
        try:
            other = load_recipe(path).recipe
        except Exception:  # noqa: BLE001 (a recipe that does not load writes nothing)
            continue
        out = Path(str(other.train_args["output_dir"])).resolve()
        if target in (out, out / "final") or (target.parent == out and target.name.startswith("checkpoint-")):
            return path, other
    return None


class LocateError(FtError):
    """A run, model directory, adapter or base model that a command or a recipe names, and that cannot be found or
    used (exit code 2)."""


@dataclass(frozen=True)
class Found:
    """What a directory argument turned out to hold: ``kind`` is "full" or "adapter"; ``run_dir`` is the run it
    belongs to (the folder with ``recipe.yaml``), when there is one."""

    kind: str
    path: Path
    run_dir: Path | None


def locate(path: Path, arg: str) -> Found:
    """A model, adapter or run directory → the model or adapter folder to use. A run directory means its final/;
    a run that stopped early has none, and then the user picks a checkpoint (ft does not guess which)."""
    if not path.exists():
        raise LocateError(f"{arg}: {str(path)!r} does not exist. Pass a run directory (train.output_dir), its "
                          "final/ or a checkpoint-N/ folder, or a model directory.")
    if (path / "adapter_config.json").is_file():
        return Found("adapter", path, _run_of(path))
    if (path / "config.json").is_file():
        return Found("full", path, _run_of(path))
    if (path / "final").is_dir():
        return locate(path / "final", arg)
    if (path / "recipe.yaml").is_file():
        from ..outputs.checkpoints import complete_checkpoints

        saved = complete_checkpoints(path)
        pick = (f"pass its newest complete checkpoint, {saved[-1]}, instead" if saved else
                "it saved no complete checkpoint either, so there is nothing to load; train it to the end first")
        raise LocateError(f"{arg}: the run in {path} has no final/ (it did not finish; summary.json says why): "
                          f"{pick}.")
    raise LocateError(f"{arg}: {path} holds neither a model (config.json), a LoRA adapter (adapter_config.json) "
                      "nor a run (recipe.yaml and final/). Pass a run directory, its final/ or a model directory.")


def _run_of(folder: Path) -> Path | None:
    """The run directory a final/ or checkpoint-N/ folder sits in (it holds recipe.yaml or summary.json), if any."""
    parent = folder.resolve().parent
    return parent if any((parent / name).is_file() for name in ("recipe.yaml", "summary.json")) else None


# --- the base an adapter was trained on ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Base:
    """How to rebuild an adapter's base: the run's recipe (and seed) when there is one, else a name to load."""

    name: str
    revision: str | None
    init: str  # "pretrained" | "random"
    recipe: object | None  # ft.recipe.Recipe of the run, with name/revision/init as recorded
    seed: int | None
    source: str  # where the base was read from, for messages
    dtype: str = "auto"  # the dtype the base had in training; a QLoRA base has no plain one, so its compute dtype


def find_base(found: Found, arg: str) -> Base:
    """The base of an adapter: the run's recipe.yaml model section (summary.json's ``base_model`` entry, when
    present, for name, revision, init and seed), else summary.json alone, else the adapter's
    ``base_model_name_or_path`` (a pretrained base: a bare adapter folder records no seed)."""
    recorded = _recorded_base(found.run_dir)
    has_recipe = found.run_dir is not None and (found.run_dir / "recipe.yaml").is_file()
    recipe = _run_recipe(found.run_dir, arg) if has_recipe else None
    if recipe is not None:
        update = {key: recorded[key] for key in ("name", "revision", "init") if recorded.get(key) is not None}
        recipe = recipe.model_copy(update={"model": recipe.model.model_copy(update=update)})
        model, seed = recipe.model, recorded.get("seed", recipe.train_args.get("seed", 42))
        return Base(model.name, model.revision, model.init, recipe, seed, str(found.run_dir / "recipe.yaml"),
                    _training_dtype(model.dtype, model.quantization and model.quantization.compute_dtype))
    if recorded.get("gguf_file"):
        raise LocateError(f"{arg}: the adapter's base is a GGUF file ({recorded['gguf_file']} in "
                          f"{recorded.get('name')}), which ft rebuilds from the run's recipe.yaml, and none sits "
                          "next to the adapter; pass the run directory (train.output_dir, with its recipe.yaml).")
    if recorded.get("name"):
        quantization = recorded.get("quantization") or {}
        return Base(recorded["name"], recorded.get("revision"), recorded.get("init") or "pretrained", None,
                    recorded.get("seed"), str(found.run_dir / "summary.json"),
                    _training_dtype(recorded.get("dtype") or "auto", quantization.get("compute_dtype")))
    adapter = _read_json(found.path / "adapter_config.json", arg)
    name = adapter.get("base_model_name_or_path")
    if not name:
        raise LocateError(f"{arg}: {found.path / 'adapter_config.json'} names no base model "
                          "(base_model_name_or_path) and no run recipe.yaml sits next to it; pass the run "
                          "directory the adapter came from.")
    return Base(name, adapter.get("revision"), "pretrained", None, None, str(found.path / "adapter_config.json"))


def _training_dtype(dtype: str, compute_dtype: str | None) -> str:
    """The dtype to merge in by default: the recipe's, or for a QLoRA base the quantization's compute dtype."""
    return compute_dtype or dtype


def _recorded_base(run_dir: Path | None) -> dict:
    """summary.json's ``base_model`` entry (name, revision, init, dtype, seed, quantization), or {} without one."""
    path = run_dir / "summary.json" if run_dir else None
    if path is None or not path.is_file():
        return {}
    try:
        entry = json.loads(path.read_text()).get("base_model")
    except (OSError, ValueError, AttributeError):
        return {}
    return entry if isinstance(entry, dict) else {}


def _run_recipe(run_dir: Path, arg: str):
    """The run's resolved recipe, as ``ft train`` wrote it (validated again, so its model section is typed)."""
    from ..recipe import RecipeError, load_recipe

    try:
        return load_recipe(run_dir / "recipe.yaml").recipe
    except RecipeError as exc:
        raise LocateError(f"{arg}: the run's {run_dir / 'recipe.yaml'} no longer validates, so the adapter's base "
                          f"cannot be rebuilt from it: {str(exc).splitlines()[-1].strip()}. Fix that file (it is "
                          "the run's resolved recipe, as ft train wrote it).") from None


def _read_json(path: Path, arg: str) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LocateError(f"{arg}: {path} is not readable JSON ({first_line(exc)}); the folder is damaged or "
                          "was not written by PEFT.") from None


def load_base(base: Base, dtype: str, arg: str, say: Callable[[str], None]):
    """The base model, unquantized, in ``dtype``. A random-init base is built in its training dtype with the
    run's seed (another dtype would draw other numbers) and cast afterwards."""
    import torch

    if base.init == "random":
        model = _rebuild_random(base, arg, say)
        return model if dtype == "auto" else model.to(getattr(torch, dtype))
    _check_weights(base, arg)
    say(f"ft: base {base.name}{'@' + base.revision if base.revision else ''} (pretrained, from {base.source})")
    if base.recipe is not None:
        section = base.recipe.model.model_copy(update={"quantization": None, "dtype": dtype})
        try:
            return load_start(base.recipe.model_copy(update={"model": section}), seed=base.seed or 0, say=say)
        except ModelLoadError as exc:
            raise LocateError(_unreachable(base, arg, first_line(exc.__context__ or exc))) from None
    return _from_pretrained(base, dtype, arg)


def _rebuild_random(base: Base, arg: str, say: Callable[[str], None]):
    if base.recipe is None:
        raise LocateError(f"{arg}: the adapter's base {base.name!r} was built with random weights "
                          f"(model.init: random, per {base.source}), which are not on disk; ft rebuilds them only "
                          "from the run's recipe.yaml (its model section and seed), and none sits next to the "
                          "adapter, so the base cannot be rebuilt. Pass the run directory (train.output_dir, with "
                          "its recipe.yaml) instead.")
    say(f"ft: base {base.name} rebuilt from random init with seed {base.seed} (from {base.source})")
    section = base.recipe.model.model_copy(update={"quantization": None})  # trained on it quantized: see above
    try:
        return load_model(base.recipe.model_copy(update={"model": section}), seed=base.seed)
    except ModelLoadError as exc:
        raise LocateError(_unreachable(base, arg, first_line(exc.__context__ or exc))) from None


def _check_weights(base: Base, arg: str) -> None:
    """A local base folder without weights is the config of a random-init run: say so, not "file not found". A GGUF
    base's weights are in its .gguf file, checked as ``ft train`` checks it (the gguf package, the whole file)."""
    if base.recipe is not None and base.recipe.model.gguf_file:
        from .loading import gguf_problems

        problems = gguf_problems(base.recipe.model)
        if problems:
            raise LocateError(f"{arg}: the adapter's base (from {base.source}): {problems[0].render()}")
        return
    folder = Path(base.name)
    try:
        started_from_run = base.recipe is not None and named_run(base.recipe.model) is not None
    except ModelLoadError as exc:  # the run it started from is gone or unfinished (no final/)
        raise LocateError(f"{arg}: the adapter's base (from {base.source}) is a run that cannot be loaded: "
                          f"{str(exc).removeprefix('model.name: ')}") from None
    if started_from_run:
        return  # a run: its adapter and base are checked as they load (load_start)
    if folder.is_dir() and not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise LocateError(f"{arg}: the adapter's base {base.name} (from {base.source}) holds a config but no "
                          "weights: the run built it with model.init: random, and only the run directory records "
                          "the seed that rebuilds it. Pass the run directory (with its recipe.yaml) instead.")


def _from_pretrained(base: Base, dtype: str, arg: str):
    import torch

    try:
        auto = writing_class(base.name, base.revision)
        return auto.from_pretrained(base.name, revision=base.revision,
                                    dtype="auto" if dtype == "auto" else getattr(torch, dtype))
    except (OSError, ValueError) as exc:
        raise LocateError(_unreachable(base, arg, first_line(exc))) from None


def _unreachable(base: Base, arg: str, why: str) -> str:
    return (f"{arg}: the adapter's base model {base.name!r} (from {base.source}) could not be loaded: {why}. "
            "It must be a local directory with config.json and weights, or a hub id in this machine's cache or "
            "reachable from it (unset HF_HUB_OFFLINE, `hf auth login` for gated models, or `hf download "
            f"{base.name}` on a machine with access).")


def load_adapter_model(found: Found, dtype: str | None, arg: str, say: Callable[[str], None]):
    """(base + adapter through PEFT, not merged, as training evaluated it; the adapter's tokenizer)."""
    from .adapters import fit_embeddings
    from .bnb_import import import_bitsandbytes

    import_bitsandbytes(uses_it=False)  # the base loads unquantized (load_base): no bitsandbytes code runs
    from peft import PeftModel

    base = find_base(found, arg)
    tokenizer = load_processing_class(found, arg, say, base)
    model = load_base(base, dtype or base.dtype, arg, say)
    fit_embeddings(model, tokenizer)  # as training resized it; the adapter holds the new rows' values
    try:
        return PeftModel.from_pretrained(model, str(found.path)).eval(), tokenizer
    except (OSError, ValueError, RuntimeError) as exc:
        raise LocateError(f"{arg}: the adapter in {found.path} does not fit its base {base.name!r}: "
                          f"{first_line(exc)}. Pass the run directory the adapter was trained in.") from None


def load_as_trained(found: Found, tokenizer, arg: str):
    """Base + adapter as training ran them, unmerged: the base built from the run's recipe, quantized as it says (a
    QLoRA base in 4 or 8 bits). None without the run's recipe (a bare adapter folder records no quantization)."""
    from .adapters import fit_embeddings
    from .bnb_import import import_bitsandbytes

    base = find_base(found, arg)
    if base.recipe is None:
        return None
    import_bitsandbytes(uses_it=base.recipe.model.quantization is not None)
    from peft import PeftModel

    try:
        model = load_start(base.recipe, seed=base.seed or 0)
    except ModelLoadError as exc:
        raise LocateError(_unreachable(base, arg, first_line(exc.__context__ or exc))) from None
    fit_embeddings(model, tokenizer)
    return PeftModel.from_pretrained(model, str(found.path)).eval()


# --- a recipe that starts from a run -------------------------------------------------------------------------------

def named_run(section) -> Found | None:
    """What ``model.name`` names when it is a run ``ft train`` left (its directory, final/ or a checkpoint-N/) or an
    adapter folder, found as ``ft merge`` finds it; None for anything else: a model folder (config.json, or a GGUF
    file), a hub id, a path that does not exist (``ft.model.loading`` loads those, and explains what is missing)."""
    path = Path(section.name).expanduser()
    if not names_a_path(section.name) or section.gguf_file or not path.is_dir():
        return None
    if not any((path / name).exists() for name in ("adapter_config.json", "recipe.yaml", "final")):
        return None
    try:
        return locate(path, "model.name")
    except LocateError as exc:
        raise ModelLoadError(str(exc)) from None


def _as_folder(section, found: Found):
    """``section`` naming a full run's model folder (its final/ or checkpoint) instead of the run."""
    return section.model_copy(update={"name": str(found.path)})


def starts_from_adapter(section) -> bool:
    """Whether ``model.name`` is a LoRA run, whose weights exist only once folded (no folder holds them)."""
    found = named_run(section)
    return found is not None and found.kind == "adapter"


def load_start(recipe, seed: int, say: Callable[[str], None] = lambda _: None):
    """The model ``recipe`` trains from: ``ft.model.loading.load_model`` for a model; for a run, its full model, or its
    LoRA adapter folded into the base it was trained on (``merge_and_unload``, as ``ft merge``), loaded with this
    recipe's class (a reward model's score head new), dtype, attention kernel and quantization."""
    found = named_run(recipe.model)
    if found is None:
        return load_model(recipe, seed)
    if recipe.model.init == "random":
        raise ModelLoadError(f"model.init: random builds a model from its config with new weights, but model.name "
                             f"({recipe.model.name}) is a run, whose point is its trained weights; set model.init: "
                             "pretrained, or name the run's base model to start afresh.")
    if scoring_model(found) and not METHODS[recipe.method].scores:
        raise ModelLoadError(f"model.name: {found.path} is a reward model (it scores a text with one number), and "
                             f"method {recipe.method} trains a model that writes text; start from the policy model "
                             "it scores instead.")
    if found.kind == "full":
        return load_model(recipe.model_copy(update={"model": _as_folder(recipe.model, found)}), seed)
    try:
        model, _ = load_adapter_model(found, None, "model.name", say)
    except LocateError as exc:
        raise ModelLoadError(str(exc)) from None
    say(f"ft: model.name is a LoRA run: its adapter ({found.path}) folded into its base")
    folded = model.merge_and_unload(safe_merge=True)
    return load_weights(recipe, seed, folded.config, folded.state_dict())


def start_processing_class(section, say: Callable[[str], None] | None = None):
    """The processing class (tokenizer or processor) of the model ``section`` names: for a run, the one saved with its
    model or adapter (with the chat template it trained with), else its base's."""
    from .loading import load_processing_class as load_named

    found = named_run(section)
    if found is None or found.kind == "full":
        return load_named(section if found is None else _as_folder(section, found), say)
    try:
        has_own = (found.path / "tokenizer_config.json").is_file()
        base = None if has_own else find_base(found, "model.name")  # the run's recipe, read only when needed
        return load_processing_class(found, "model.name", say or (lambda _: None), base)
    except LocateError as exc:
        raise ModelLoadError(str(exc)) from None


def start_config(section):
    """The config of the model ``section`` names, without weights: for a LoRA run, its base's (a LoRA adapter leaves
    the shapes as they were)."""
    found = named_run(section)
    if found is None or found.kind == "full":
        return load_config(section if found is None else _as_folder(section, found))
    from transformers import AutoConfig

    try:
        base = find_base(found, "model.name")
    except LocateError as exc:
        raise ModelLoadError(str(exc)) from None
    if base.recipe is not None:
        return start_config(base.recipe.model)
    return AutoConfig.from_pretrained(base.name, revision=base.revision)


# --- a model to generate with -------------------------------------------------------------------------------------

def scoring_model(found: Found) -> bool:
    """Whether ``found`` is a model that scores sequences (a reward model: a sequence classifier, or an adapter
    trained for one) rather than one that writes text."""
    name, key = ("adapter_config.json", "task_type") if found.kind == "adapter" else ("config.json", "architectures")
    try:
        value = json.loads((found.path / name).read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return False
    return value == "SEQ_CLS" if key == "task_type" else any(str(a).endswith("ForSequenceClassification")
                                                             for a in value or ())


def load_for_generation(path: Path, dtype: str | None, say: Callable[[str], None], doing: str = "generating",
                        found: Found | None = None):
    """(model, tokenizer) for a full model, a run's final/, or an adapter (base + adapter through PEFT); ``doing``
    names the command's work in what it says (``found``: ``locate``'s answer for ``path``, where the caller has it)."""
    found = found or locate(path, "MODEL_OR_RUN_DIR")
    if scoring_model(found):
        raise LocateError(f"MODEL_OR_RUN_DIR: {found.path} is a reward model (it scores a text with one number) "
                          "and writes no text; load it with AutoModelForSequenceClassification to score, or "
                          "generate with the policy model it scores.")
    if found.kind == "adapter":
        model, tokenizer = load_adapter_model(found, dtype, "MODEL_OR_RUN_DIR", say)
    else:
        model, tokenizer = load_full(found.path, dtype or "auto"), load_processing_class(found, "MODEL_OR_RUN_DIR", say)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    say(f"ft: {doing} with {found.path} on {device}")
    return model.to(device).eval(), tokenizer


def writing_class(name, revision: str | None = None):
    """The transformers auto class of a model that writes text, by the modality its saved config says
    (``ft.model.loading.modality_of``, ``ft.recipe.methods.MODEL_CLASSES``): a causal LM, or an image-text-to-text
    model (LLaVA, Idefics3, Qwen2-VL), which has no causal-LM class to load as."""
    import transformers
    from transformers import AutoConfig

    modality = modality_of(AutoConfig.from_pretrained(name, revision=revision))
    return getattr(transformers, MODEL_CLASSES[("writes", modality)])


def load_full(folder: Path, dtype: str, arg: str = "MODEL_OR_RUN_DIR"):
    """A full model as saved (``ft generate``, ``ft export``), with the class its config's modality asks for
    (``writing_class``)."""
    import torch

    try:
        auto = writing_class(folder)
        return auto.from_pretrained(folder, dtype="auto" if dtype == "auto" else getattr(torch, dtype))
    except (OSError, ValueError) as exc:
        raise LocateError(f"{arg}: could not load the model in {folder}: {first_line(exc)}. It needs "
                          "config.json and weights (model.safetensors) as save_pretrained writes them.") from None


PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")  # a processor, not a bare tokenizer, saved


def load_processing_class(found: Found, arg: str, say: Callable[[str], None], base: Base | None = None):
    """The processing class saved with the model or adapter (it carries the chat template the run trained with): the
    processor of a vision-language model (its folder holds a processor's config), else the tokenizer; an adapter
    folder without one falls back to its base's."""
    from transformers import AutoProcessor, AutoTokenizer

    folder, revision = found.path, None
    if base is not None and not (folder / "tokenizer_config.json").is_file():
        say(f"ft: no tokenizer in {folder}; using the base's, {base.name}")
        folder, revision = base.name, base.revision
    auto = AutoProcessor if any((Path(folder) / name).is_file() for name in PROCESSOR_FILES) else AutoTokenizer
    try:
        processing_class = auto.from_pretrained(folder, revision=revision)
    except (OSError, ValueError) as exc:
        raise LocateError(f"{arg}: could not load the tokenizer from {folder}: {first_line(exc)}. Save the "
                          "tokenizer next to the weights (ft train does).") from None
    tokenizer = text_tokenizer(processing_class)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return processing_class
