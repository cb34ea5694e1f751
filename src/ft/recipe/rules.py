"""Cross-field rules. Each is a small named function of the validated ``Recipe`` returning the problems it finds,
with the sentence of the transformers/TRL documentation (or the reason) it enforces in its docstring.
``check_rules`` runs them all; the loader attaches file:line to each problem.

Rules here need no hardware knowledge and import nothing heavy; the rules that depend on the machine
(CUDA-only optimizers, 4-bit loading, bf16 support) live in ``ft.machine.hardware`` and run at the start of
``ft train``, before any model or data loads. The few rules that involve the run's processes also take the count the
command knows (``recipe.processes.Processes``: ``ft train --num-processes``, or a rank's world size).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .adapter import SHAPE_KEYS
from .benchmarks import is_task_file
from .data_section import SplitRatio
from .distributed import deepspeed_config_file
from .errors import Problem, did_you_mean
from .hub import HUB_SETTINGS, PUSHING
from .methods import METHOD_SECTIONS, METHODS, generation_of, models_of, readers
from .optimizers import FALSE_READ_AS_TRUE, PASSED_ON_AS_TEXT, TRAITS, traits
from .processes import (
    Processes,
    declared_processes,
    process_count,
    process_source,
    uses_deepspeed,
    written,
    zero_stage,
)
from .redact import SECRET_KEY
from .schema import Recipe

Rule = Callable[[Recipe], list[Problem]]
ProcessRule = Callable[[Recipe, "Processes | None"], list[Problem]]
ModalityRule = Callable[[Recipe, str], list[Problem]]
RULES: list[Rule] = []
PROCESS_RULES: list[ProcessRule] = []  # rules that involve the run's processes: they also take the command's count
# rules that involve what the model reads (``methods.MODALITIES``), known once its processing class is loaded (a
# hub model's config is not read while a recipe is validated): ``ft.data.prepare_data`` runs them, before any row is
# read, and raises their problems as a RecipeError, located at the key's file and line like the others
MODALITY_RULES: list[ModalityRule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def process_rule(fn: ProcessRule) -> ProcessRule:
    PROCESS_RULES.append(fn)
    return fn


def modality_rule(fn: ModalityRule) -> ModalityRule:
    MODALITY_RULES.append(fn)
    return fn


def check_modality(recipe: Recipe, modality: str) -> list[Problem]:
    """Every modality rule's problems for a model that reads ``modality`` (``text`` or ``vision``)."""
    return [problem for fn in MODALITY_RULES for problem in fn(recipe, modality)]


def check_rules(recipe: Recipe, processes: Processes | None = None) -> list[Problem]:
    """Every rule's problems; ``processes`` is the process count the command knows (None: the recipe's ``launch:``)."""
    return ([problem for fn in RULES for problem in fn(recipe)]
            + [problem for fn in PROCESS_RULES for problem in fn(recipe, processes)])


def evaluates(recipe: Recipe) -> bool:
    return recipe.effective("eval_strategy") != "no"


def error(path: str, message: str) -> list[Problem]:
    return [Problem(path, message)]


def warning(path: str, message: str) -> list[Problem]:
    return [Problem(path, message, level="warning")]


# --- evaluation -------------------------------------------------------------------------------------


@rule
def eval_on_start_needs_eval(recipe: Recipe) -> list[Problem]:
    """"eval_on_start requires a valid eval_strategy (e.g. "epoch") and an evaluation dataset."""
    if not recipe.effective("eval_on_start"):
        return []
    missing = [what for what, ok in (("`train.eval_strategy` (steps or epoch)", evaluates(recipe)),
                                     ("an eval dataset (`data.eval`)", recipe.data.has_eval)) if not ok]
    if missing:
        return error("train.eval_on_start", "needs " + " and ".join(missing) + "; add them or remove eval_on_start.")
    return []


@rule
def eval_strategy_needs_eval_data(recipe: Recipe) -> list[Problem]:
    """Evaluation during training reads the eval dataset; without one the Trainer fails at the first eval."""
    if evaluates(recipe) and not recipe.data.has_eval:
        return error("train.eval_strategy", f"is {recipe.effective('eval_strategy')!r} but the recipe has no "
                     "`data.eval` sources; add some or set `train.eval_strategy: 'no'`.")
    return []


@rule
def greedy_scheduler_needs_eval(recipe: Recipe) -> list[Problem]:
    """"GreedyLR requires evaluation during training. Set eval_strategy to "steps" or "epoch"."""
    if recipe.scheduler.type == "greedy" and not evaluates(recipe):
        return error("scheduler.type", "`greedy` adapts the learning rate from evaluation results, so it needs "
                     "`train.eval_strategy: steps` (or epoch) and `data.eval`.")
    return []


@rule
def eval_accumulation_needs_eval(recipe: Recipe) -> list[Problem]:
    """eval_accumulation_steps moves predictions to the CPU every N evaluation batches: it only acts
    when there is evaluation."""
    if recipe.train_args.get("eval_accumulation_steps") and not evaluates(recipe):
        return error("train.eval_accumulation_steps", "has no effect without evaluation; set "
                     "`train.eval_strategy` (steps or epoch) or remove it.")
    return []


@rule
def exact_match_needs_held_out_rows(recipe: Recipe) -> list[Problem]:
    """The exact match scores held-out rows: the recipe's evaluation data, or the setting's own source."""
    settings = recipe.data.eval_exact_match
    if settings is not None and settings.source is None and not recipe.data.has_eval:
        return error("data.eval_exact_match", "scores held-out prompts, and the recipe has no `data.eval`; add one, or "
                     "give `data.eval_exact_match.source` (e.g. {path: held-out.jsonl, format: prompt}).")
    return []


@rule
def exact_match_needs_a_model_that_writes(recipe: Recipe) -> list[Problem]:
    """A method that trains a scoring model (a reward model: one number per sequence) writes no answers to score."""
    if recipe.data.eval_exact_match is not None and METHODS[recipe.method].scores:
        return error("data.eval_exact_match", f"{recipe.method} trains a model that scores texts and writes none, so "
                     "there are no answers to compare; drop it (the run reports held-out pair accuracy instead).")
    return []


@rule
def benchmarks_need_a_model_that_writes(recipe: Recipe) -> list[Problem]:
    """lm-eval's tasks ask a language model for the likelihood of text or for text it writes; a reward model (one
    number per sequence) gives neither."""
    if recipe.benchmarks is not None and METHODS[recipe.method].scores:
        return error("benchmarks", f"{recipe.method} trains a model that scores texts and writes none, and lm-eval's "
                     "tasks ask a language model; drop `benchmarks` (the run reports held-out pair accuracy), and "
                     "score the policy it judges with `ft eval`.")
    return []


@rule
def benchmark_files_exist(recipe: Recipe) -> list[Problem]:
    """A task file the section names is read before the model loads; one that is not there is named now."""
    if recipe.benchmarks is None:
        return []
    return [problem for i, task in enumerate(recipe.benchmarks.tasks) if is_task_file(task)
            and not Path(task).expanduser().is_file()
            for problem in error(f"benchmarks.tasks.{i}", f"{task}: no such task file (a path is relative to the "
                                 "recipe); name a task YAML that exists, or an lm-eval task by name.")]


@rule
def benchmarks_each_save_needs_saves(recipe: Recipe) -> list[Problem]:
    """``each_save`` scores the model as each checkpoint is written; a run that saves none scores nothing then."""
    if recipe.benchmarks is not None and "each_save" in recipe.benchmarks.when \
            and recipe.effective("save_strategy") == "no":
        return error("benchmarks.when", "`each_save` scores the model at each checkpoint, and `train.save_strategy` "
                     "is `no`; save checkpoints (`steps` with `train.save_steps`, or `epoch`), or drop `each_save`.")
    return []


@rule
def benchmarks_need_a_whole_model(recipe: Recipe) -> list[Problem]:
    """The tasks run on the main process alone, and a model sharded over the processes (FSDP, DeepSpeed) is whole on
    none of them."""
    if recipe.benchmarks is not None and recipe.distributed.kind != "ddp":
        return error("benchmarks", f"the tasks run on the main process alone, and `distributed.kind: "
                     f"{recipe.distributed.kind}` shards the model over the processes; drop `benchmarks` and score "
                     "the checkpoints and final/ with `ft eval`, or train with DDP.")
    return []


# --- checkpoints ------------------------------------------------------------------------------------


@rule
def save_best_needs_metric(recipe: Recipe) -> list[Problem]:
    """save_strategy "best" saves "when a new best metric is achieved": it needs metric_for_best_model
    and evaluation that produces it."""
    if recipe.effective("save_strategy") != "best":
        return []
    problems = []
    if not recipe.train_args.get("metric_for_best_model"):
        problems += error("train.save_strategy", "`best` needs `train.metric_for_best_model` (e.g. eval_loss).")
    if not evaluates(recipe):
        problems += error("train.save_strategy", "`best` needs evaluation: set `train.eval_strategy` "
                          "(steps or epoch) and `data.eval`.")
    return problems


@rule
def load_best_needs_matching_strategies(recipe: Recipe) -> list[Problem]:
    """load_best_model_at_end: "the save strategy needs to be the same as the evaluation strategy, and
    in the case of steps, save_steps must be a round multiple of eval_steps"."""
    if not recipe.train_args.get("load_best_model_at_end"):
        return []
    save, evaluation = recipe.effective("save_strategy"), recipe.effective("eval_strategy")
    if evaluation == "no":
        return error("train.load_best_model_at_end", "needs evaluation: set `train.eval_strategy` and `data.eval`.")
    if save not in (evaluation, "best"):
        return error("train.load_best_model_at_end", f"needs `train.save_strategy` ({save!r}) to equal "
                     f"`train.eval_strategy` ({evaluation!r}).")
    if save == "steps":
        save_steps = recipe.effective("save_steps")
        eval_steps = recipe.train_args.get("eval_steps") or recipe.effective("logging_steps")
        if save_steps % eval_steps:
            return error("train.save_steps", f"({save_steps}) must be a multiple of `train.eval_steps` "
                         f"({eval_steps}) when load_best_model_at_end is set.")
    return []


@rule
def save_only_model_restarts_optimizer(recipe: Recipe) -> list[Problem]:
    """"Resuming from a checkpoint requires the optimizer and scheduler state files … If they are
    missing (e.g. with save_only_model=True) the optimizer starts from scratch.\""""
    if recipe.train_args.get("save_only_model"):
        return warning("train.save_only_model", "checkpoints will hold no optimizer or scheduler state: "
                       "resuming from them restarts the optimizer (and its warm-up).")
    return []


# --- dataloader -------------------------------------------------------------------------------------


@rule
def worker_options_need_workers(recipe: Recipe) -> list[Problem]:
    """"Both dataloader_persistent_workers and dataloader_prefetch_factor require
    dataloader_num_workers > 0.\""""
    if recipe.effective("dataloader_num_workers") > 0:
        return []
    args = recipe.train_args
    return [Problem(f"train.{key}", "needs `train.dataloader_num_workers` > 0 (worker processes to keep "
                    "alive or prefetch with); set it or remove this key.")
            for key in ("dataloader_persistent_workers", "dataloader_prefetch_factor") if args.get(key)]


# --- optimizers and schedules ----------------------------------------------------------------------


@rule
def projection_optimizers_need_targets(recipe: Recipe) -> list[Problem]:
    """GaLore / APOLLO: "specify the target modules with optim_target_modules"."""
    name = recipe.optimizer.name
    if traits(name).needs_target_modules and not recipe.optimizer.target_modules:
        return error("optimizer.target_modules", f"`{name}` projects only named modules; list them, e.g. "
                     "target_modules: ['.*attn.*', '.*mlp.*'].")
    return []


@process_rule
def layerwise_optimizer_limits(recipe: Recipe, processes: Processes | None) -> list[Problem]:
    """"Layerwise mode is experimental. It works on a single GPU only, does not support DDP, and
    gradient clipping or DeepSpeed may not work.\""""
    name = recipe.optimizer.name
    if not traits(name).layerwise:
        return []
    args, problems = recipe.train_args, []
    if args.get("max_grad_norm"):
        problems += error("train.max_grad_norm", f"`{name}` updates each layer during backward, so gradients "
                          "are never clipped; remove max_grad_norm (ft sets 0 for layerwise optimizers).")
    for key in ("deepspeed", "fsdp"):
        if args.get(key):
            problems += error(f"train.{key}", f"`{name}` runs on a single process only; remove `train.{key}` "
                              "or choose a non-layerwise optimizer.")
    if recipe.distributed.kind != "ddp":
        problems += error("distributed.kind", f"`{name}` runs on a single process only, and `distributed.kind: "
                          f"{recipe.distributed.kind}` shards the model over several; remove `distributed:` or "
                          "choose a non-layerwise optimizer.")
    count = process_count(recipe, processes)
    if count > 1:
        problems += error("optimizer.name", f"`{name}` works on a single process only (transformers: layerwise "
                          f"mode \"does not support DDP\"), and this run has {count} processes "
                          f"({process_source(recipe, processes)}); launch one process or choose a non-layerwise "
                          "optimizer.")
    if recipe.effective("gradient_accumulation_steps") > 1:  # transformers: "does not support gradient accumulation"
        problems += error("train.gradient_accumulation_steps", f"`{name}` steps each layer as soon as its gradient "
                          "is ready, so there is nothing to accumulate; set it to 1 (raise "
                          "`train.per_device_train_batch_size` instead) or choose a non-layerwise optimizer.")
    return problems


@rule
def optimizer_transformers_can_build(recipe: Recipe) -> list[Problem]:
    """A name transformers accepts but cannot build fails only once the model has loaded; refuse it up front."""
    why = traits(recipe.optimizer.name).unbuildable
    return error("optimizer.name", f"transformers cannot build `{recipe.optimizer.name}`: {why}") if why else []


@rule
def optimizer_args_reach_the_optimizer(recipe: Recipe) -> list[Problem]:
    """``optimizer.args`` become transformers' ``optim_args`` ("k=v,k=v"), of which each optimizer's handler reads a
    few keys and drops the rest without a word; every key must be one it reads, and every value one that survives
    the text form and is read as written."""
    opt = recipe.optimizer
    if getattr(opt, "cls", None) is not None or opt.name not in TRAITS:  # your own class; a name newer than TRAITS
        return []
    return [problem for key, value in opt.args.items() for problem in _optim_arg_problems(opt.name, key, value)]


def _optim_arg_problems(name: str, key: str, value) -> list[Problem]:
    path, reads = f"optimizer.args.{key}", traits(name).args
    if key not in reads:
        known = f"it reads only {', '.join(reads)}" if reads else "it reads none"
        return error(path, f"transformers does not pass `{key}` to `{name}` ({known}), so it would be silently "
                     f"ignored; remove it.{did_you_mean(key, reads)}")
    if not _survives_text(value):
        return error(path, "reaches transformers as text in `k=v,k=v` form (optim_args), so its value must be a "
                     "number, true/false or a word without commas, `=` or spaces.")
    if key in PASSED_ON_AS_TEXT.get(name, ()):
        return error(path, f"transformers passes `{key}` on to `{name}` as text, which the optimizer cannot "
                     "compute with; remove it (the optimizer's default applies).")
    if key in FALSE_READ_AS_TRUE.get(name, ()) and str(value).lower() in ("false", "0", "no"):
        return error(path, f"transformers reads `{key}` with bool() of its text, so `{value}` would turn it on; "
                     "remove it for the optimizer's default.")
    return []


def _survives_text(value) -> bool:
    """Whether ``k=value`` comes back out of transformers' optim_args parsing (split on "," and "=", spaces
    dropped) as the value written."""
    if isinstance(value, str):
        return bool(value) and not any(c in value for c in ", =\t")
    return isinstance(value, bool | int | float)


@rule
def schedule_free_wants_constant(recipe: Recipe) -> list[Problem]:
    """Schedule-free: "pair with lr_scheduler_type="constant". Other schedules work but affect the
    intended behaviour.\""""
    if traits(recipe.optimizer.name).schedule_free and recipe.scheduler.type not in ("constant",
                                                                                     "constant_with_warmup"):
        return warning("scheduler.type", f"`{recipe.optimizer.name}` replaces the schedule; with "
                       f"`{recipe.scheduler.type}` it works against it. Use `scheduler.type: constant`.")
    return []


@rule
def lomo_without_clipping(recipe: Recipe) -> list[Problem]:
    """"AdaLomo works better without grad_norm, which improves performance and throughput." And LOMO and AdaLomo
    update each parameter inside backward and free its gradient, so the Trainer's clipping finds none (grad_norm
    logs 0.0): max_grad_norm does nothing there."""
    name = recipe.optimizer.name
    if name in ("lomo", "adalomo") and recipe.effective("max_grad_norm"):
        return warning("train.max_grad_norm", f"`{name}` updates each parameter inside backward and frees its "
                       "gradient, so the Trainer's gradient clipping finds nothing to clip (and AdaLomo works better "
                       "without it); set `train.max_grad_norm: 0`.")
    return []


# --- model, data, methods ---------------------------------------------------------------------------


@rule
def quantization_needs_adapter(recipe: Recipe) -> list[Problem]:
    """Quantized weights cannot be trained directly: "you can only train adapters on top of a
    quantized model" (PEFT/bitsandbytes docs). QLoRA = 4-bit base + LoRA adapter."""
    if recipe.model.quantization is not None and recipe.adapter is None:
        return error("model.quantization", "a quantized model can only be trained through an adapter; "
                     "add `adapter: {kind: lora}` or remove `model.quantization`.")
    return []


@rule
def gguf_holds_a_text_model(recipe: Recipe) -> list[Problem]:
    """transformers reads a text decoder from a GGUF file and nothing else (no vision tower, no processor)."""
    if recipe.model.gguf_file and recipe.model.modality == "vision":
        return error("model.modality", "is vision, and model.gguf_file holds a text model (transformers reads no "
                     "vision tower or processor from GGUF); name the model's transformers folder or hub id instead "
                     "of a GGUF file, or remove model.modality.")
    return []


@rule
def gguf_holds_pretrained_weights(recipe: Recipe) -> list[Problem]:
    """A GGUF file is a model's weights: building the model from its config alone (``init: random``) would read
    none of them."""
    if recipe.model.gguf_file and recipe.model.init == "random":
        return error("model.gguf_file", "holds pretrained weights, and `model.init: random` builds the model from its "
                     "config without them; set `model.init: pretrained` (the default) or remove gguf_file.")
    return []


@rule
def data_formats_fit_method(recipe: Recipe) -> list[Problem]:
    """Each method reads one family of formats (``Method.formats``: SFT chat/instruction/text; DPO/KTO/ORPO
    preference; GRPO prompt)."""
    allowed = METHODS[recipe.method].formats
    return [
        Problem(f"data.{split}.{i}.format", f"`{source.format}` data cannot train method `{recipe.method}`; "
                f"use one of: {', '.join(sorted(allowed))}.")
        for split, sources in (("train", recipe.data.train), ("eval", recipe.data.eval_sources))
        for i, source in enumerate(sources)
        if source.format not in allowed
    ]


def _not_read(recipe: Recipe, key: str) -> str | None:
    """None when the recipe's method reads ``key`` (one of ``methods.ONLY_SOME``), else the methods that do, as
    ``sft`` or ``sft` or `cpo`` (inside backquotes)."""
    if key in METHODS[recipe.method].reads:
        return None
    return "` or `".join(readers(key))


@rule
def mixture_weights_can_end(recipe: Recipe) -> list[Problem]:
    """Weights on all training sources or none, not all zero, none on eval sources, and no zero weight where the
    mixture only ends once every source is exhausted (a source never drawn is never exhausted)."""
    data, problems = recipe.data, []
    given = [i for i, source in enumerate(data.train) if source.weight is not None]
    if given and len(given) < len(data.train):
        missing = next(i for i in range(len(data.train)) if i not in given)
        problems.append(Problem(f"data.train.{missing}", "has no `weight` while other training sources have one; "
                                "give every source of data.train a weight (relative shares, e.g. 3 and 1), or none "
                                "to concatenate them."))
    elif given and not sum(data.train[i].weight for i in given):
        problems.append(Problem("data.train.0.weight", "every training source has weight 0, so no row can be "
                                "drawn; give at least one source a positive weight."))
    elif given and data.mix_stop != "first_exhausted":
        problems += [Problem(f"data.train.{i}.weight", f"is 0 with data.mix_stop {data.mix_stop}: that mixture ends "
                             "only when every source is exhausted, and a source with weight 0 is never drawn, so it "
                             "would never end. Remove the source, give it a positive weight, or use "
                             "`data.mix_stop: first_exhausted`.")
                     for i in given if data.train[i].weight == 0]
    problems += [Problem(f"data.eval.{i}.weight", "weights mix training sources; evaluation sources are read whole. "
                         "Remove it.") for i, source in enumerate(data.eval_sources) if source.weight is not None]
    return problems


@rule
def streaming_reads_rows_once(recipe: Recipe) -> list[Problem]:
    """``data.streaming`` reads each row as training consumes it: what needs every row first (lengths to group by, a
    held-out share, a subsample, a cache, an epoch count, TRL's own tokenization of a whole dataset) is refused,
    naming its key."""
    data = recipe.data
    if not data.streaming:
        return []
    why = "needs the whole dataset before training, and a stream is read as training goes"
    problems = []
    if not METHODS[recipe.method].ft_tokenizes:
        problems.append(Problem("data.streaming", f"method `{recipe.method}` is trained by TRL's trainer, which "
                                "prepares its whole dataset first; ft streams the rows it tokenizes itself (SFT). "
                                "Remove data.streaming, or read a share of the data with `fraction`."))
    if not recipe.train_args.get("max_steps", -1) > 0:
        problems.append(Problem("data.streaming", "needs `train.max_steps`: a stream has no length to count epochs "
                                "in (each source starts again when it runs out), so the step count ends training."))
    if isinstance(data.eval, SplitRatio):
        problems.append(Problem("data.eval.split_ratio", f"{why}; give `data.eval` its own sources."))
    for key in ("prepared_path", "require_prepared", "num_proc"):
        if getattr(data, key) not in (None, False):
            problems.append(Problem(f"data.{key}", "has no use with data.streaming: the stream is tokenized as "
                                    "training reads it, in the training process, and never cached; remove it."))
    problems += [Problem(f"data.train.{i}.fraction", f"{why}; remove it (or write the share you want to a file)")
                 for i, source in enumerate(data.train) if source.fraction < 1]
    strategy = recipe.effective("train_sampling_strategy") if METHODS[recipe.method].ft_tokenizes else "random"
    if strategy in ("group_by_length", "batch_rebalance"):
        problems.append(Problem("train.train_sampling_strategy", f"`{strategy}` reads every row's length first, and "
                                "a stream is read in order as training goes; use `random` (the stream's order)."))
    if recipe.train_args.get("dataloader_num_workers", 0) > 0:
        problems.append(Problem("train.dataloader_num_workers", "the stream is sharded one shard per process, and "
                                "counts its rows in the training process; remove it."))
    return problems


@rule
def packing_is_sft_only(recipe: Recipe) -> list[Problem]:
    """Packing concatenates independent rows into one sequence; only SFT can train on that."""
    methods = _not_read(recipe, "data.packing") if recipe.data.packing else None
    if methods is not None:
        return error("data.packing", f"packing is only for method `{methods}`, not `{recipe.method}`; "
                     "set `data.packing: false`.")
    return []


@modality_rule
def method_trains_the_modality(recipe: Recipe, modality: str) -> list[Problem]:
    """A method trains the models its entry declares (``Method.modalities``): a vision-language model named for
    another is refused before its data is read, where its rows' images would otherwise be called bad rows. The
    message says why the method does not (``Method.cannot_train``: what TRL or transformers lacks)."""
    method = METHODS[recipe.method]
    if modality in method.modalities:
        return []
    trains = [name for name, other in METHODS.items() if modality in other.modalities]
    why = method.cannot_train.get(modality)
    return error("model.name", f"is a {modality} model (transformers has no text-only class for it), and method "
                 f"`{recipe.method}` trains {' or '.join(method.modalities)} models"
                 + (f" ({why})" if why else "") + "; name a text model"
                 + (f", or use method `{'` or `'.join(trains)}`." if trains else "."))


@modality_rule
def benchmarks_score_text_models(recipe: Recipe, modality: str) -> list[Problem]:
    """lm-eval's ``hf`` model, the one ft scores through, reads text alone."""
    if recipe.benchmarks is not None and modality == "vision":
        return error("benchmarks", "the model reads images, and the tasks are scored through lm-eval's text model "
                     "(`hf`), which cannot run it; drop `benchmarks` and score the run with lm-eval's "
                     "`hf-multimodal` model.")
    return []


@modality_rule
def vision_extra_models_read_images(recipe: Recipe, modality: str) -> list[Problem]:
    """The models a method loads besides the policy (``models_of``: a DPO reference, GRPO/RLOO reward models) are
    loaded as text models (``ExtraModel.auto_class``: a causal LM, a sequence classifier), and read text alone: a
    reference for a vision-language policy must read the images its policy reads (its log-probabilities are of the
    same prompts, images included), and a reward model would be handed the prompts' image parts with no images."""
    if modality != "vision":
        return []
    problems = []
    for extra in models_of(recipe):
        if extra.role == "reference":
            problems += error(extra.key, f"names {extra.what}, which ft loads as a text model "
                              f"({extra.auto_class}), and model.name is a vision-language model: the reference's "
                              "log-probabilities must be of the same prompts, images included. Remove it: the "
                              "reference is then a frozen copy of the start model (or, with an adapter, the base "
                              "with the adapter off), which reads the images.")
        else:
            problems += error(extra.key, f"names {extra.what} ({extra.auto_class}), which reads text alone, and the "
                              "prompts of this vision-language run hold images it would not see; score the "
                              "completions with a reward function instead (`fn: module:function`, which receives "
                              "each row's `images`).")
    return problems


@modality_rule
def vision_rows_are_tokenized_a_batch_at_a_time(recipe: Recipe, modality: str) -> list[Problem]:
    """TRL's DPO and KTO trainers tokenize a dataset with images a batch at a time, in their vision collators, and
    refuse what needs the rows tokenized before training or cut from the end (TRL 1.16): ``precompute_ref_log_probs``
    ("not supported for vision datasets"), ``truncation_mode='keep_end'`` ("Image tokens reside inside the prompt
    portion of the sequence; … keep_end may silently drop them"), ``pad_to_multiple_of`` ("not yet implemented for
    vision-language modeling"). Refused here, before the model loads, where TRL raises inside the trainer."""
    if modality != "vision" or METHODS[recipe.method].ft_tokenizes:
        return []
    args, problems = recipe.train_args, []
    if args.get("precompute_ref_log_probs"):
        problems += error("train.precompute_ref_log_probs", "TRL tokenizes a vision-language model's rows a batch at a "
                          "time (their images processed as each batch comes), so it cannot run the reference over "
                          "the whole dataset first; remove it (the reference then runs beside the policy).")
    if args.get("truncation_mode") == "keep_end":
        problems += error("train.truncation_mode", "`keep_end` cuts a row from its start, where a prompt's images "
                          "and their tokens are, and TRL refuses it for images; remove it (keep_start, the default, "
                          "cuts the answers' ends) or raise data.max_length.")
    if args.get("pad_to_multiple_of") not in (None, "auto"):
        problems += error("train.pad_to_multiple_of", "TRL's collators for rows with images do not pad to a "
                          "multiple yet (they raise NotImplementedError); remove it.")
    return problems


@modality_rule
def freeze_needs_a_vision_model(recipe: Recipe, modality: str) -> list[Problem]:
    """``model.freeze`` names parts of a vision-language model (its vision tower, its projector); a text model has
    neither, and freezing nothing would train it whole while the recipe says otherwise."""
    if modality == "vision" or not recipe.model.freeze:
        return []
    return error("model.freeze", f"freezes a vision-language model's {' and '.join(recipe.model.freeze)}, and "
                 f"model.name ({recipe.model.name}) is a text model, which has neither; remove model.freeze.")


@rule
def freeze_with_an_adapter_changes_nothing(recipe: Recipe) -> list[Problem]:
    """With an adapter the whole base is frozen (PEFT trains the adapter alone), so ``model.freeze`` adds nothing; the
    vision tower and projector already get no adapter unless ``adapter.target_modules`` names them."""
    if not recipe.model.freeze or recipe.adapter is None:
        return []
    return warning("model.freeze", "with an `adapter:` the whole base is frozen already (only the adapter trains), "
                   "and a vision-language model's vision tower and projector get no adapter unless "
                   "adapter.target_modules names them; model.freeze changes nothing here. Remove it, or remove "
                   "`adapter:` for a full fine-tune with those parts frozen.")


@modality_rule
def vision_rows_are_not_packed(recipe: Recipe, modality: str) -> list[Problem]:
    """Packing concatenates rows into one sequence; a vision-language model's images are matched to their tokens by
    order across the whole batch, and TRL packs token ids alone (its ``pack_dataset`` drops the ``images`` column and
    SFTTrainer refuses packing with a vision dataset), so packed rows would lose their images."""
    if modality == "vision" and recipe.data.packing:
        return error("data.packing", "a vision-language model's rows cannot be packed: packing joins rows' token ids "
                     "and would separate the images from their tokens (TRL packs text only). Set `data.packing: "
                     "false`; `train.train_sampling_strategy: group_by_length` batches rows of similar length "
                     "instead, to waste little on padding.")
    return []


@modality_rule
def vision_rows_are_read_whole(recipe: Recipe, modality: str) -> list[Problem]:
    """ft prepares a vision-language model's rows before training (each image's token count from the processor);
    streaming them is not built yet, and is refused rather than run without images."""
    if modality != "vision":
        return []
    problems = []
    if recipe.data.streaming:
        problems += error("data.streaming", "a vision-language model's rows are prepared before training (each "
                          "image's tokens counted by the model's processor); streaming them is not supported yet. "
                          "Remove data.streaming (use `fraction` to train on a share of a large dataset).")
    return problems


@rule
def neftune_is_sft_only(recipe: Recipe) -> list[Problem]:
    """NEFTune is "a new technique for enhancing supervised fine-tuning" (transformers PR #27141), and Trainer.train
    applies it to any method: with DPO/KTO on a LoRA adapter it perturbs the reference log-probs too (the reference
    pass is the same model with the adapter off), and with GRPO it perturbs generation (noise alpha/sqrt(d) on every
    decoded token)."""
    methods = _not_read(recipe, "train.neftune_noise_alpha") if recipe.train_args.get("neftune_noise_alpha") else None
    if methods is not None:
        return error("train.neftune_noise_alpha", f"NEFTune (noisy input embeddings) is for method `{methods}`; with "
                     f"`{recipe.method}` it would also add noise to the reference model's or the generation's "
                     "embeddings. Remove it.")
    return []


@rule
def length_sampling_without_packing(recipe: Recipe) -> list[Problem]:
    """Packed sequences all have max_length tokens: grouping them by length does nothing."""
    strategy = recipe.effective("train_sampling_strategy")
    if recipe.data.packing and strategy in ("group_by_length", "batch_rebalance"):
        return warning("train.train_sampling_strategy", f"`{strategy}` has nothing to group when "
                       "`data.packing` is on (every packed row is max_length long); use `random`.")
    return []


@rule
def custom_loss_is_sft_only(recipe: Recipe) -> list[Problem]:
    """compute_loss_func replaces the language-modelling loss; preference and RL methods define their own."""
    methods = _not_read(recipe, "loss") if recipe.loss else None
    if methods is not None:
        return error("loss", f"a custom loss is for method `{methods}`; `{recipe.method}` computes its own objective.")
    return []


@rule
def early_stopping_needs_a_metric(recipe: Recipe) -> list[Problem]:
    """EarlyStoppingCallback "requires metric_for_best_model to be defined" and an eval strategy; it compares
    that metric between evaluations (and loads the best model only with load_best_model_at_end)."""
    for i, callback in enumerate(recipe.callbacks):
        if callback.name == "early_stopping":
            if not recipe.train_args.get("metric_for_best_model") or not evaluates(recipe):
                return error(f"callbacks.{i}", "early_stopping compares `train.metric_for_best_model` (e.g. "
                             "eval_loss) between evaluations: set it and `train.eval_strategy` (with `data.eval`).")
    return []


@rule
def metrics_need_eval_data(recipe: Recipe) -> list[Problem]:
    """Metrics are computed on the evaluation set, from language-model logits and labels (SFT)."""
    methods = _not_read(recipe, "metrics") if recipe.metrics else None
    if methods is not None:
        return error("metrics", f"token metrics are for method `{methods}`; `{recipe.method}` logs its own (rewards, "
                     "margins, accuracies).")
    if recipe.metrics and not recipe.data.has_eval:
        return error("metrics", "metrics are computed on evaluation data; add `data.eval`.")
    return []


@rule
def sft_only_data_settings(recipe: Recipe) -> list[Problem]:
    """Preference and prompt data are tokenized by TRL's trainers, which truncate their own way and put the
    loss on completions only: these settings of ft's tokenizer would be silently ignored."""
    if METHODS[recipe.method].ft_tokenizes:
        return []
    data, ignored = recipe.data, []
    if data.truncation != "truncate":
        ignored.append("data.truncation")
    if data.train_on != "assistant":
        ignored.append("data.train_on")
    return [Problem(key, f"has no effect for method `{recipe.method}` (TRL tokenizes its data); remove it.",
                    level="warning") for key in ignored]


@rule
def method_sections_match_method(recipe: Recipe) -> list[Problem]:
    """A ``dpo:`` section in an SFT recipe is a leftover or a mistake: nothing would read it."""
    return [Problem(name, f"is only read by `method: {name}`, and this recipe is `{recipe.method}`; "
                    f"remove it or set `method: {name}`.")
            for name in METHOD_SECTIONS if name != recipe.method and getattr(recipe, name) is not None]


@rule
def method_section_when_required(recipe: Recipe) -> list[Problem]:
    """A method section with required keys (GRPO's ``rewards``: without one there is nothing to optimise) must be
    written."""
    section, name = METHODS[recipe.method].section, recipe.method
    required = [key for key, field in section.model_fields.items() if field.is_required()] if section else []
    if required and recipe.method_section is None:
        example = f" (e.g. {section.EXAMPLE})" if section.EXAMPLE else ""
        keys = ", ".join(f"`{key}:`" for key in required)
        return error(name, f"{name.upper()} needs a `{name}:` section with {keys}{example}.")
    return []


@rule
def generation_batch_divides(recipe: Recipe) -> list[Problem]:
    """GRPO: "The effective batch size … must be evenly divisible by num_generations": each generation round holds
    whole groups of completions for the same prompt (every method whose section declares a ``generation``)."""
    gen = generation_of(recipe)
    if gen is None:
        return []
    if gen.generation_batch_size and gen.steps_per_generation:
        return error(gen.key("generation_batch_size"), "set either `generation_batch_size` or "
                     "`steps_per_generation`, not both.")
    per_device = recipe.effective("per_device_train_batch_size")
    steps = gen.steps_per_generation or recipe.effective("gradient_accumulation_steps")
    batch = gen.generation_batch_size or per_device * steps
    key = gen.key("generation_batch_size" if gen.generation_batch_size else "num_generations")
    if batch % gen.num_generations:
        return error(key, f"the generation batch ({batch} = per_device_train_batch_size {per_device} × "
                     f"{steps} steps per generation on one process) must be divisible by "
                     f"num_generations ({gen.num_generations}).")
    return []


@rule
def method_settings_fit_training(recipe: Recipe) -> list[Problem]:
    """What a method's own section asks of the rest of the recipe (its ``MethodSection.problems``: e.g. a loss type
    that needs a ``train:`` setting TRL checks only once the model is loaded)."""
    section = recipe.method_section
    if section is None:
        return []
    return [problem for key, message in section.problems(recipe.effective) for problem in error(key, message)]


@rule
def checkpoints_end_generation_rounds(recipe: Recipe) -> list[Problem]:
    """A method that generates (GRPO) serves ``steps_per_generation`` × ``num_iterations`` micro-batches from one
    round of generated completions, a buffer no checkpoint holds: a run resumed from a checkpoint inside a round
    generates the rest of it anew, and continues on another trajectory than the uninterrupted run. (ft's own stop on
    a signal waits for a round's end.)"""
    gen = generation_of(recipe)
    if gen is None or not gen.steps_per_generation:
        return []
    save_steps, accumulation = recipe.effective("save_steps"), recipe.effective("gradient_accumulation_steps")
    iterations = recipe.effective("num_iterations")
    if recipe.effective("save_strategy") != "steps" or save_steps < 1:  # a fraction of the run: its steps vary
        return []
    if (save_steps * accumulation) % (gen.steps_per_generation * iterations) == 0:
        return []
    return warning("train.save_steps", f"({save_steps:g} steps of {accumulation} micro-batches) does not end a "
                   f"generation round ({gen.key('steps_per_generation')} {gen.steps_per_generation} × num_iterations "
                   f"{iterations} micro-batches): a run resumed from a checkpoint inside a round generates the rest "
                   "of the round anew, and does not end where the uninterrupted run ends. Make save_steps end rounds.")


# --- your own optimizer or scheduler class, parameter groups -----------------------------------------------------


_NAMED_ONLY = ("betas", "eps", "target_modules", "args")  # settings of a named optimizer, passed as TrainingArguments


@rule
def optimizer_class_or_name(recipe: Recipe) -> list[Problem]:
    """``optimizer_cls_and_kwargs`` replaces the ``optim`` name: a recipe gives one or the other, and a class takes
    its settings as its own keyword arguments."""
    opt, written = recipe.optimizer, recipe.optimizer.model_fields_set
    if opt.cls is None:
        return error("optimizer.kwargs", "is for `optimizer.class`; a named optimizer takes its extra settings in "
                     "`optimizer.args`.") if opt.kwargs else []
    problems = error("optimizer.class", "give either `optimizer.name` (a transformers optimizer) or "
                     "`optimizer.class` (your own), not both.") if "name" in written else []
    problems += [Problem(f"optimizer.{key}", "goes with a named optimizer; with `optimizer.class` put it in "
                         "`optimizer.kwargs` under the name the class takes.") for key in _NAMED_ONLY if key in written]
    if opt.lr is not None and "lr" in opt.kwargs:
        problems += error("optimizer.kwargs.lr", "the learning rate is set twice (`optimizer.lr` too); keep one.")
    return problems


@rule
def scheduler_class_or_type(recipe: Recipe) -> list[Problem]:
    """A scheduler class replaces the named schedule and its warm-up (put a warm-up in the class's kwargs)."""
    sched, written = recipe.scheduler, recipe.scheduler.model_fields_set
    if sched.cls is None:
        return []
    return [Problem(f"scheduler.{key}", "goes with a named schedule; `scheduler.class` replaces it (give the class "
                    "its own warm-up, if it has one, in `scheduler.kwargs`).") for key in ("type", "warmup_steps")
            if key in written]


@rule
def groups_need_plain_parameter_groups(recipe: Recipe) -> list[Problem]:
    """GaLore and APOLLO build their own parameter groups from ``optim_target_modules``, LOMO/AdaLomo take the whole
    model, layerwise optimizers one optimizer per parameter: per-module groups cannot be layered on them."""
    name = recipe.optimizer.name
    info = traits(name)
    if recipe.optimizer.groups and recipe.optimizer.cls is None and (
            info.needs_target_modules or info.layerwise or name in ("lomo", "adalomo")):
        return error("optimizer.groups", f"`{name}` builds its own parameter groups, so per-module groups cannot be "
                     "added to it; remove `optimizer.groups` or choose e.g. adamw_torch.")
    return []


# --- the Hub and credentials -------------------------------------------------------------------------------------


@rule
def hub_settings_need_a_push(recipe: Recipe) -> list[Problem]:
    """transformers reads the hub_* arguments when it pushes (``push_to_hub``; TRL's GRPO also for
    ``log_completions_hub_repo``); ft calls no push of its own, so without one they do nothing."""
    args = recipe.train_args
    if any(args.get(key) for key in PUSHING):
        return []
    return [Problem(f"train.{key}", "has no effect without `train.push_to_hub: true` (nothing is pushed); set "
                    "push_to_hub or remove this key.", level="warning") for key in HUB_SETTINGS if key in args]


@rule
def train_values_hold_no_credentials(recipe: Recipe) -> list[Problem]:
    """transformers pickles its arguments, ``train:`` verbatim, into training_args.bin in every checkpoint and in
    final/, and uploads it with every push: a credential-named key inside a ``train:`` value (a dict such as
    ``generation_kwargs``) would travel with the run's files. (``train.hub_token`` itself is refused by the schema.)"""
    def paths(value, prefix: str):
        if isinstance(value, dict):
            for key, inner in value.items():
                path = f"{prefix}.{key}"
                yield from [path] if SECRET_KEY.search(str(key)) else paths(inner, path)
        elif isinstance(value, list):
            for i, inner in enumerate(value):
                yield from paths(inner, f"{prefix}.{i}")

    return [Problem(path, "looks like a credential, and `train:` values are pickled into training_args.bin (every "
                    "checkpoint, final/, every push to the Hub); remove it and give the credential to the library "
                    "that needs it through its environment variable (HF_TOKEN for the Hub).")
            for key, value in recipe.train_args.items() for path in paths(value, f"train.{key}")]


# --- adapters -----------------------------------------------------------------------------------------------------


@rule
def continued_adapter_keeps_its_shape(recipe: Recipe) -> list[Problem]:
    """An adapter continued from ``adapter.path`` is loaded with its saved ``adapter_config.json``: its rank,
    targets and scaling cannot change, so the recipe's keys for them would be silently ignored."""
    adapter = recipe.adapter
    if adapter is None or not adapter.path:
        return []
    return [Problem(f"adapter.{key}", f"comes from {adapter.path}/adapter_config.json when continuing a saved "
                    "adapter; remove it here.") for key in SHAPE_KEYS if key in adapter.model_fields_set]


# --- processes: launch and distributed ----------------------------------------------------------------------------


@rule
def launch_machines_meet(recipe: Recipe) -> list[Problem]:
    """torchrun's rules for several machines: each has a ``--node-rank`` in 0..nnodes-1, and they meet at machine 0
    (``--master-addr``/``--master-port``, a static rendezvous) or at a c10d rendezvous (``--rdzv-endpoint``), one or
    the other."""
    launch = recipe.launch
    if launch is None:
        return []
    problems = []
    if launch.node_rank >= launch.nnodes:
        problems += error("launch.node_rank", f"is {launch.node_rank}, but the machines of `launch.nnodes: "
                          f"{launch.nnodes}` are numbered 0..{launch.nnodes - 1}; give each machine its own number "
                          "below nnodes (0 on the machine the others meet at).")
    if launch.nnodes > 1 and not (launch.master_addr or launch.rdzv_endpoint):
        problems += error("launch.nnodes", f"{launch.nnodes} machines must meet somewhere: set `launch.master_addr` "
                          "(machine 0's address, with `launch.master_port`) or `launch.rdzv_endpoint` (host:port of a "
                          "c10d rendezvous), or pass --master-addr / --rdzv-endpoint to `ft train`.")
    if launch.rdzv_endpoint and (launch.master_addr or launch.master_port):
        other = "launch.master_addr" if launch.master_addr else "launch.master_port"
        problems += error("launch.rdzv_endpoint", f"is a meeting point of its own (c10d rendezvous), and `{other}` "
                          "names another (machine 0); keep one of them.")
    return problems


@rule
def one_collective_timeout(recipe: Recipe) -> list[Problem]:
    """``launch.collective_timeout`` is TrainingArguments' ``ddp_timeout``: a recipe that sets both to different
    values says two things about one setting."""
    launch, timeout = recipe.launch, recipe.train_args.get("ddp_timeout")
    if launch is None or "collective_timeout" not in launch.model_fields_set or timeout is None:
        return []
    if timeout == launch.collective_timeout:
        return []
    return error("train.ddp_timeout", f"is {timeout} s and `launch.collective_timeout` is "
                 f"{launch.collective_timeout} s: they are one setting (the seconds a rank waits in a collective "
                 "before it takes the others for lost); keep launch.collective_timeout and remove train.ddp_timeout.")


@rule
def accelerate_config_launches_alone(recipe: Recipe) -> list[Problem]:
    """``accelerate launch --config_file`` reads the processes, machines and addresses from that file."""
    launch = recipe.launch
    if launch is None or launch.accelerate_config is None:
        return []
    return [Problem(f"launch.{key}", f"is read from `launch.accelerate_config` ({launch.accelerate_config}) when "
                    "accelerate launches the run; set it in that file and remove it here (or remove accelerate_config "
                    "and let ft launch).") for key in sorted(launch.model_fields_set - {"accelerate_config"})]


_KIND_SETTINGS = {"find_unused_parameters": "ddp", "fsdp": "fsdp", "deepspeed": "deepspeed"}


@rule
def distributed_settings_match_kind(recipe: Recipe) -> list[Problem]:
    """Each kind reads its own settings (DDP ``find_unused_parameters``, FSDP ``fsdp:``, DeepSpeed ``deepspeed:``);
    another kind's would be silently ignored."""
    dist = recipe.distributed
    return [Problem(f"distributed.{key}", f"is read only with `distributed.kind: {kind}`, and this recipe's kind is "
                    f"`{dist.kind}`; remove it or set kind: {kind}.")
            for key, kind in _KIND_SETTINGS.items() if key in dist.model_fields_set and kind != dist.kind]


@rule
def fsdp2_has_no_no_shard(recipe: Recipe) -> list[Problem]:
    """transformers builds FSDP2 (``fsdp_config`` version 2, torch's ``fully_shard``), whose one sharding choice is
    ``reshard_after_forward``; its own translation of sharding names refuses the others with FSDP2 ("only available
    with FSDP1"). A model kept whole on every process is DDP."""
    dist = recipe.distributed
    if dist.kind == "fsdp" and dist.fsdp_settings.sharding == "no_shard":
        return error("distributed.fsdp.sharding", "`no_shard` keeps the whole model on every process, which is DDP: "
                     "FSDP2 (the FSDP transformers builds) has no such strategy. Set `distributed.kind: ddp` "
                     "instead, or sharding: full, shard_grad_op or hybrid.")
    return []


_DS_SHORTHAND = ("stage", "offload_optimizer", "offload_params", "nvme_path")


@rule
def deepspeed_settings_fit(recipe: Recipe) -> list[Problem]:
    """DeepSpeed's config reference: parameter offloading (``offload_param``) is ZeRO stage 3 only, and so is
    offloading optimizer state to NVMe (ZeRO-Infinity); NVMe offloading needs ``nvme_path``. A ``config`` is the
    whole DeepSpeed config, so the shorthand keys would be ignored beside it. With ZeRO-3 the model is gathered for
    ``final/`` only when the config says ``stage3_gather_16bit_weights_on_model_save: true`` (else transformers'
    ``save_model`` writes a DeepSpeed checkpoint there, which ``from_pretrained`` cannot load)."""
    dist = recipe.distributed
    if dist.kind != "deepspeed" or dist.deepspeed is None:
        return []
    ds, written_keys = dist.deepspeed, dist.deepspeed.model_fields_set
    if ds.config is not None:
        return [Problem(f"distributed.deepspeed.{key}", "shapes the config ft generates, and "
                        "`distributed.deepspeed.config` is a whole DeepSpeed config of its own; set it there "
                        "(zero_optimization) and remove it here, or remove `config`.")
                for key in _DS_SHORTHAND if key in written_keys] + _deepspeed_config_problems(ds.config)
    stage, problems = ds.stage or 2, []
    if ds.offload_params != "none" and stage < 3:
        problems += error("distributed.deepspeed.offload_params", f"only ZeRO stage 3 partitions the parameters, so "
                          f"only it can offload them (stage is {stage}); set `distributed.deepspeed.stage: 3`, or "
                          "offload_params: none.")
    if ds.offload_optimizer == "nvme" and stage < 3:
        problems += error("distributed.deepspeed.offload_optimizer", "offloading optimizer state to NVMe "
                          f"(ZeRO-Infinity) needs ZeRO stage 3 (stage is {stage}); set `distributed.deepspeed.stage: "
                          "3`, or offload_optimizer: cpu.")
    nvme = "nvme" in (ds.offload_optimizer, ds.offload_params)
    if nvme and not ds.nvme_path:
        problems += error("distributed.deepspeed.nvme_path", "is needed with an `nvme` offload: a directory on a "
                          "fast local disk of each machine.")
    if ds.nvme_path and not nvme:
        problems += warning("distributed.deepspeed.nvme_path", "is read only with an `nvme` offload; remove it.")
    return problems


def _deepspeed_config_problems(value) -> list[Problem]:
    path = "distributed.deepspeed.config"
    if isinstance(value, str) and not Path(value).is_file():
        return error(path, f"{value} does not exist; name a DeepSpeed JSON config (relative to the recipe's folder) "
                     "or write the config inline, as a mapping.")
    config = deepspeed_config_file(value)
    if config is None:
        return error(path, f"{value} does not hold a JSON object (a DeepSpeed config).")
    zero = config.get("zero_optimization") or {}
    # DeepSpeed reads the key under either spelling (its config alias)
    gathers = any(zero.get(key) is True for key in ("stage3_gather_16bit_weights_on_model_save",
                                                    "gather_16bit_weights_on_model_save"))
    if zero.get("stage") == 3 and not gathers:
        return error(path, "is ZeRO stage 3 without `zero_optimization.stage3_gather_16bit_weights_on_model_save: "
                     "true`: the weights would stay partitioned when final/ is saved, and transformers would write "
                     "a DeepSpeed checkpoint there instead of a model from_pretrained loads; add it.")
    return []


_DEEPSPEED_ADAMW = ("adamw_torch", "adamw_torch_fused")


@rule
def deepspeed_offload_trains_adamw(recipe: Recipe) -> list[Problem]:
    """DeepSpeed refuses a client (torch) optimizer with ZeRO-Offload ("You are using ZeRO-Offload with a client
    provided optimizer …", unless ``zero_force_ds_cpu_optimizer: false``, which it calls poor performance), so the
    config ft generates for ``offload_optimizer`` names DeepSpeed's AdamW (its CPU Adam), which transformers fills
    from optimizer.lr, betas, eps and weight_decay, and builds over all trainable parameters in one group."""
    dist = recipe.distributed
    ds = dist.deepspeed_settings
    if dist.kind != "deepspeed" or ds.config is not None or ds.offload_optimizer == "none":
        return []
    opt = recipe.optimizer
    why = ("with `distributed.deepspeed.offload_optimizer` DeepSpeed steps the optimizer on the CPU with its own "
           "AdamW, which takes only optimizer.lr, betas, eps and weight_decay")
    if opt.cls is not None:
        return error("optimizer.class", f"{why}; remove optimizer.class, or set offload_optimizer: none.")
    problems = []
    if opt.name not in _DEEPSPEED_ADAMW:
        problems += error("optimizer.name", f"is `{opt.name}`, but {why}; use adamw_torch, or set "
                          "offload_optimizer: none.")
    problems += [Problem(f"optimizer.{key}", f"{why}; remove it, or set offload_optimizer: none.")
                 for key in ("args", "groups") if getattr(opt, key)]
    return problems


@rule
def lomo_without_deepspeed(recipe: Recipe) -> list[Problem]:
    """accelerate's ``Accelerator.backward`` runs LOMO's fused update (``lomo_backward``) only outside DeepSpeed:
    under DeepSpeed the loss goes to the engine's ``backward`` (with a ``learning_rate`` argument the Trainer adds for
    LOMO), so LOMO and AdaLomo never update the model there."""
    name = recipe.optimizer.name
    if recipe.optimizer.cls is not None or name not in ("lomo", "adalomo") or not uses_deepspeed(recipe):
        return []
    key = "distributed.kind" if recipe.distributed.kind == "deepspeed" else "train.deepspeed"
    return error("optimizer.name", f"`{name}` does not train under DeepSpeed (accelerate runs its fused update only "
                 f"outside DeepSpeed, so the weights would never change); remove `{key}` (LOMO saves optimizer "
                 "memory by itself) or choose another optimizer.")


@rule
def zero3_without_quantization(recipe: Recipe) -> list[Problem]:
    """ZeRO-3 partitions every parameter across the processes; transformers loads a quantized model without ZeRO-3's
    partitioned init (``needs_zero3_init = is_deepspeed_zero3_enabled() and not _is_quantized``), and bitsandbytes'
    packed 4/8-bit weights carry their quantization state beside the tensor, which ZeRO-3's partitioning does not
    keep."""
    if recipe.model.quantization is None or zero_stage(recipe) != 3:
        return []
    return error("model.quantization", "cannot be trained with DeepSpeed ZeRO stage 3, which partitions the "
                 "quantized weights and loses their quantization state; use `distributed.kind: fsdp` (ft stores "
                 "4-bit weights in the compute dtype for it), or ZeRO stage 2 (`distributed.deepspeed.stage: 2`), "
                 "or remove model.quantization.")


@rule
def train_keys_agree_with_distributed(recipe: Recipe) -> list[Problem]:
    """``train:`` keeps every TrainingArguments field, and a value it sets wins over what ``distributed:`` maps to;
    but a ``train:`` key that says another way of sharing the model than ``distributed:`` would leave one of them
    silently ignored (or transformers failing at start)."""
    args, dist, problems = recipe.train_args, recipe.distributed, []
    if args.get("deepspeed") is not None and written(recipe):
        problems += error("train.deepspeed", "is set together with `distributed:`; give a DeepSpeed config as "
                          "`distributed.deepspeed.config` (with `distributed.kind: deepspeed`) and remove "
                          "train.deepspeed.")
    for key in ("fsdp", "fsdp_config"):
        if not args.get(key):
            continue
        if dist.kind == "deepspeed" or (written(recipe) and dist.kind == "ddp"):
            problems += error(f"train.{key}", f"turns FSDP on, and `distributed.kind` is `{dist.kind}`: a run shares "
                              f"the model one way; remove train.{key}, or set `distributed.kind: fsdp` (its settings "
                              "under distributed.fsdp).")
        elif key == "fsdp_config" and dist.fsdp is not None:
            problems += error("train.fsdp_config", "replaces the fsdp_config ft builds from `distributed.fsdp` "
                              "(train: wins), so those settings would be ignored; keep the FSDP settings in one place: "
                              "distributed.fsdp, or train.fsdp_config alone.")
    mine, theirs = dist.find_unused_parameters, args.get("ddp_find_unused_parameters")
    if dist.kind == "ddp" and mine is not None and theirs is not None and mine != theirs:
        problems += error("train.ddp_find_unused_parameters", f"is {theirs}, and `distributed.find_unused_parameters` "
                          f"is {mine}; keep one of them.")
    return problems


@rule
def fsdp_activation_checkpointing_once(recipe: Recipe) -> list[Problem]:
    """transformers: "``fsdp_config['activation_checkpointing']`` (FSDP's own activation checkpointing) and the
    ``activation_checkpointing`` training argument can't both be set to True. Use FSDP's activation checkpointing
    when using FSDP"; the training argument alone "introduces a redundant AllGather in the backward pass"."""
    if recipe.distributed.kind != "fsdp":
        return []
    args = recipe.train_args
    key = next((k for k in ("activation_checkpointing", "gradient_checkpointing") if args.get(k)), None)
    own = recipe.distributed.fsdp_settings.activation_checkpointing
    if key is None or own is False:
        return []
    if own:
        return error(f"train.{key}", "is true, and so is `distributed.fsdp.activation_checkpointing`; transformers "
                     f"refuses both. Remove train.{key}: FSDP's own checkpointing recomputes the same activations "
                     "with one all-gather fewer.")
    return warning(f"train.{key}", "under FSDP the Trainer's activation checkpointing adds an all-gather to every "
                   "backward; use `distributed.fsdp.activation_checkpointing: true` instead (transformers' advice).")


@rule
def fsdp_sharded_checkpoints_keep_the_optimizer(recipe: Recipe) -> list[Problem]:
    """transformers: "save_only_model option is not compatible with FSDP state dict type 'SHARDED_STATE_DICT'"."""
    dist = recipe.distributed
    if dist.kind == "fsdp" and dist.fsdp_settings.state_dict == "sharded" and recipe.train_args.get("save_only_model"):
        return error("train.save_only_model", "cannot be used with `distributed.fsdp.state_dict: sharded` "
                     "(transformers refuses it: a sharded checkpoint is the model and optimizer shards together); "
                     "set distributed.fsdp.state_dict: full, or remove save_only_model.")
    return []


@process_rule
def sharding_needs_processes(recipe: Recipe, processes: Processes | None) -> list[Problem]:
    """FSDP and ZeRO shard the model over the processes of a run: with one there is nothing to shard over (DeepSpeed's
    offloading still moves state to the CPU or NVMe)."""
    kind = recipe.distributed.kind
    ds = recipe.distributed.deepspeed_settings
    if kind == "ddp" or declared_processes(recipe, processes) != 1:
        return []
    if kind == "deepspeed" and (ds.config is not None or ds.offload_optimizer != "none" or ds.offload_params != "none"):
        return []
    plain = " (ft trains it as one plain process)" if kind == "fsdp" else ""
    return warning("distributed.kind", f"`{kind}` shards the model over the run's processes, and this run has one "
                   f"({process_source(recipe, processes)}), so it saves no memory{plain}. Launch several: "
                   "`launch.num_processes`, `ft train --num-processes N`, or torchrun.")


@process_rule
def batch_rebalance_has_something_to_balance(recipe: Recipe, processes: Processes | None) -> list[Problem]:
    """transformers' ``BatchRebalanceSampler`` balances padded-token cost "across devices and gradient-accumulation
    steps within each effective batch": with one process and no accumulation each effective batch is one
    micro-batch, drawn at random, and nothing is rebalanced."""
    if recipe.effective("train_sampling_strategy") != "batch_rebalance" or recipe.data.packing:
        return []  # packing: length_sampling_without_packing says it
    if declared_processes(recipe, processes) == 1 and recipe.effective("gradient_accumulation_steps") == 1:
        return warning("train.train_sampling_strategy", "`batch_rebalance` balances batch cost across processes and "
                       "gradient-accumulation steps, and this run has one process and gradient_accumulation_steps 1: "
                       "its batches are plain random ones. Use `group_by_length` to cut padding here.")
    return []
