"""One training run, in order. Only this module knows the order of the steps."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import adapters, checkpoints, data, hardware, hub, models, ranks, report, signals
from .drift import check_drift
from .plugins import PluginError
from .recipe import LoadedRecipe, Problem, Recipe
from .recipe.redact import resolved_recipe_yaml
from .trainers import Hooks, TrainerInputs, build_trainer, distributed, resolve_hooks


@dataclass(frozen=True)
class RunResult:
    status: str  # "completed" | "stopped"
    output_dir: Path
    summary: dict
    stopped_by: int | None = None  # the signal that stopped it

    @property
    def exit_code(self) -> int:
        return 0 if self.stopped_by is None else signals.exit_code(self.stopped_by)


def preprocess(loaded: LoadedRecipe, say: Callable[[str], None] = print) -> data.PreparedData:
    """Tokenize once into ``data.prepared_path`` (a no-op when the fingerprint already matches)."""
    recipe = loaded.recipe
    if recipe.data.prepared_path is None:
        raise loaded.error([Problem("data.prepared_path", "`ft preprocess` writes the tokenized dataset there; "
                                    "set it (e.g. prepared/my-run) so `ft train` can reuse it.")])
    tokenizer = models.load_tokenizer(recipe.model)
    return data.prepare_data(recipe, tokenizer, data.chat_template_for(recipe, tokenizer), say)


def train(loaded: LoadedRecipe, resume: str = "auto", say: Callable[[str], None] = print, callbacks=(), *,
          overwrite: bool = False, command: str | None = None) -> RunResult:
    """One run. ``callbacks`` are extra ``TrainerCallback`` objects (for programs that drive ft, e.g. benchmarks);
    ``command`` is the command line that resumes the run (the CLI passes the one it was started with)."""
    recipe = loaded.recipe
    main = ranks.is_main()
    say = say if main else _silent
    command = command or f"ft train {loaded.source}"
    hw = hardware.probe()
    problems = hardware.check_hardware(recipe, hw) + hub.check_hub(recipe)
    if problems:
        raise loaded.error(problems)
    try:
        hooks = resolve_hooks(recipe, base_dir=loaded.source.resolve().parent)
    except PluginError as exc:
        raise loaded.error([exc.problem]) from None
    output_dir = Path(recipe.train_args["output_dir"])
    output_dir.mkdir(parents=True, exist_ok=True)
    with ranks.main_process_first(cpu=not hw.cuda):  # with --overwrite the main process clears, the others find it so
        resume_from = checkpoints.resolve_resume(resume, output_dir, overwrite=overwrite and main)
    if resume_from:
        harmless = check_drift(recipe, output_dir, resume_from, command)
        if harmless:
            say("ft: resuming with changes that leave the training as it was: "
                + "; ".join(change.render() for change in harmless))
    if main:
        (output_dir / "recipe.yaml").write_text(resolved_recipe_yaml(recipe))
    processes = f" × {ranks.world_size()} processes" if ranks.world_size() > 1 else ""
    say(f"ft: {recipe.method} on {hw.summary}{processes}; output in {output_dir}")

    try:
        trainer, prepared = prepare_trainer(recipe, hooks, hw, say, callbacks)
    except PluginError as exc:  # a recipe setting the model shows wrong (optimizer.groups matching no parameter)
        raise loaded.error([exc.problem]) from None
    if resume_from:
        say(f"ft: resuming from {resume_from}")

    together = ranks.world_size() > 1 and trainer.args.enable_jit_checkpoint
    started = time.perf_counter()
    with signals.StopWatch(pass_on=not together, resume_hint=f"To resume, run: {command}") as watch:
        if together:
            from .trainers.preemption import StopTogether

            trainer.add_callback(StopTogether(watch))
        trainer.train(resume_from_checkpoint=resume_from)
    seconds = time.perf_counter() - started
    state = trainer.state

    if signals.stopped_early(state.global_step, state.max_steps, watch.received):
        saved = checkpoints.complete_checkpoints(output_dir)
        summary = report.summarize("stopped", state.log_history, steps=state.global_step, train_seconds=seconds,
                                   final_eval=None, extra=_extra(recipe, prepared, trainer, seconds))
        name = signals.signal_name(watch.received)
        summary.update(checkpoint=str(saved[-1]) if saved else None, stopped_by=name, resume_command=command)
        _write_report(output_dir, summary, state.log_history, main)
        say(f"ft: stopped by {name} at step {state.global_step} of {state.max_steps}; saved {summary['checkpoint']} "
            f"(transformers waits {signals.jit_kill_wait()} s after the signal, in case a SIGKILL follows, then saves "
            f"at the end of the step). To resume from it, run the same command again: {command}")
        return RunResult("stopped", output_dir, summary, watch.received)

    final_eval = trainer.evaluate() if prepared.eval is not None else None
    distributed.full_state_dict_for_final(trainer)  # FSDP with sharded checkpoints: final/ is still a whole model
    trainer.save_model(str(output_dir / "final"))
    summary = report.summarize("completed", state.log_history, steps=state.global_step, train_seconds=seconds,
                               final_eval=final_eval, extra=_extra(recipe, prepared, trainer, seconds))
    _write_report(output_dir, summary, state.log_history, main)
    say(f"ft: done in {seconds:.1f}s; model in {output_dir / 'final'}")
    return RunResult("completed", output_dir, summary)


def prepare_trainer(recipe: Recipe, hooks: Hooks, hw: hardware.Hardware, say: Callable[[str], None] = print,
                    callbacks=()) -> tuple[object, data.PreparedData]:
    """Tokenizer, datasets, model and trainer, as ``ft train`` builds them before it trains."""
    tokenizer = models.load_tokenizer(recipe.model, say)
    template = data.chat_template_for(recipe, tokenizer)
    if template is not None:
        tokenizer.chat_template = template  # final/ ships the template the model was trained with
    # one process writes data.prepared_path, the others wait for it outside any collective (no timeout)
    if ranks.world_size() > 1 and recipe.data.prepared_path is not None:
        say(f"data: the other {ranks.world_size() - 1} processes read {recipe.data.prepared_path} once this one has "
            "it ready (they wait without a time limit)")
    prepared = data.prepare_data(recipe, tokenizer, template, say, rebuild_ok=not recipe.data.require_prepared,
                                 builder=ranks.is_main())
    model = models.load_model(recipe, seed=recipe.train_args.get("seed", 42))
    model, new_token_ids = adapters.prepare_base(model, recipe, tokenizer, say)
    # ft's defaults: this machine's, then what distributed: maps to (over the machine's), then JIT checkpointing
    defaults = {**hardware.device_defaults(recipe, hw),
                **distributed.training_args(recipe, ranks.world_size(), cuda=hw.cuda, model=model),
                **checkpoints.JIT_DEFAULT}
    inputs = TrainerInputs(model, tokenizer, prepared.train, prepared.eval, hooks, defaults, tuple(callbacks),
                           hardware.optimizer_defaults(recipe, hw), adapters.lora_config(recipe.adapter, new_token_ids))
    return build_trainer(recipe, inputs), prepared


def _write_report(output_dir: Path, summary: dict, log_history: list[dict], main: bool) -> None:
    if main:
        summary["plots"] = report.write_plots(output_dir, log_history)
        report.write_summary(output_dir, summary)


def _silent(_message: str) -> None:
    """``say`` on the processes other than the main one."""


def _extra(recipe: Recipe, prepared: data.PreparedData, trainer, train_seconds: float) -> dict:
    """summary.json beyond the losses: data counts, processes, and the main process's token counts. Its
    ``tokens_per_second`` is ``tokens / train_seconds``, over the same clock as ``train_seconds`` (the log lines'
    running figure counts from the first training batch instead)."""
    stats = trainer.ft_stats()
    stats["tokens_per_second"] = round(stats["tokens"] / train_seconds, 1) if train_seconds else None
    extra = {"data": prepared.stats, "world_size": trainer.args.world_size, **stats,
             "best": report.best_checkpoint(trainer.state, trainer.args)}
    return extra if recipe.adapter is None else {**extra, "base_model": base_model(recipe)}


def base_model(recipe: Recipe) -> dict:
    """The base an adapter run's final/ needs (``ft merge`` and ``ft generate`` read it): a model built from its
    config (``init: random``) is rebuilt from the same config and seed."""
    model = recipe.model
    return {"name": model.name, "revision": model.revision, "init": model.init, "dtype": model.dtype,
            "seed": recipe.train_args.get("seed", 42),
            "quantization": model.quantization.model_dump() if model.quantization else None}
