"""``ft train``: one training run, in order. Only this module knows the order of the steps."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import data
from ..eval import in_run
from ..inference import exact_match
from ..machine import hardware
from ..model import adapters, bnb_import, loading, locate
from ..outputs import checkpoints, disk, hub_push, lock
from ..outputs.plots import write_plots
from ..outputs.summary import (
    PHASES,
    best_checkpoint,
    headline,
    last_eval,
    summarize,
    versions,
    write_log_history,
    write_summary,
)
from ..recipe import LoadedRecipe, Problem, Recipe, RecipeError
from ..recipe.errors import first_line
from ..recipe.methods import METHODS
from ..recipe.redact import redact
from ..recipe.resolved import resolved_dict, resolved_recipe_yaml
from ..trainers import distributed, preflight
from ..trainers.build import TrainerInputs, build_trainer
from ..trainers.hooks import Hooks, resolve_hooks
from ..trainers.plugins import PluginError
from . import hub, inputs, launch, peers, ranks, signals
from .drift import check_drift


@dataclass(frozen=True)
class RunResult:
    status: str  # "completed" | "stopped" (by a signal, or by a streamed source that failed: exit 1)
    output_dir: Path
    summary: dict
    stopped_by: int | None = None  # the signal that stopped it

    @property
    def exit_code(self) -> int:
        if self.stopped_by is None:
            return 1 if self.status == "stopped" else 0
        return signals.exit_code(self.stopped_by)


def train(loaded: LoadedRecipe, resume: str = "auto", say: Callable[[str], None] = print, callbacks=(), *,
          overwrite: bool = False, command: str | None = None,
          imports: Callable[[Recipe], None] | None = None) -> RunResult:
    """One run. ``callbacks`` are extra ``TrainerCallback`` objects (for programs that drive ft, e.g. benchmarks);
    ``command`` is the command line that resumes the run (the CLI passes the one it was started with); ``imports``
    imports the libraries the recipe needs once it has passed the machine's checks, where a stop signal ends the run
    as any other before its first step does (the CLI passes ``ft.run.stack``'s, which only a process of its own may
    use).
    An unexpected exception once the trainer is built is raised on after summary.json (status ``failed``) and the
    plots so far are written. It ends one of three ways: completed (``_finish``), stopped by a signal
    (``_stopped_by_signal``), or stopped by a streamed source that failed (``_stream_failed``). The output directory is
    held for the whole run (``_output_dir_held``): a second run into it is refused."""
    run = _Run(loaded, say, command or f"ft train {loaded.source}")
    with _output_dir_held(run):
        try:
            # each stops.check() ends the run for a signal whose raise Python lost in the phase before (see the class)
            with signals.StopsBeforeTraining() as stops:
                run.phase = "checking the machine"
                launch.stop_if_the_launcher_was()  # a rank ft started after it took a stop signal
                _check_machine(run)
                run.benchmarks = in_run.prepare(run.recipe.benchmarks, run.main)  # tasks checked before any load
                stops.check()
                run.phase = "importing the recipe's code"
                hooks = _resolve_hooks(run)
                _resolve_resume(run, resume, overwrite)
                if imports is not None:  # after the checks, which refuse a recipe with torch alone imported
                    stops.check()
                    run.phase = "importing the libraries"
                    imports(run.recipe)
                stops.check()
                run.phase = PREPARING
                _prepare(run, hooks, callbacks)
                stops.check()
                run.phase = "scoring the model before training"
                _score_before_training(run)
        except signals.StoppedBeforeTraining as stop:
            return _stopped_before_training(run, stop.signum)
        watchdog = _disk_guard(run)
        with _failure_recorded(run), _stop_watch(run) as watch:
            _train(run, watchdog)
            state = run.trainer.state
            if signals.stopped_early(state.global_step, state.max_steps, watch.received):
                return _stopped_by_signal(run, watch.received)
            if run.trainer.ft_stream_failure is not None:
                return _stream_failed(run)
            return _finish(run, watch)


PREPARING = "preparing the data and loading the model"  # ``_Run.phase`` while prepare_trainer runs


class _Run:
    """What the steps of one run share, filled in as they go: the recipe and how to speak (only the main process
    says anything), the machine, the output directory and the checkpoint resumed from, the trainer and its data, the
    held-out rows exact match scores, and ``facts`` and ``phases`` (summary.json's device, versions, phase times)."""

    def __init__(self, loaded: LoadedRecipe, say: Callable[[str], None], command: str):
        self.wall_started = time.perf_counter()
        self.loaded, self.recipe, self.command = loaded, loaded.recipe, command
        self.main = ranks.is_main()
        self.say = say if self.main else _silent
        self.output_dir = Path(self.recipe.train_args["output_dir"])  # created once data and model are ready
        self.hw: hardware.Hardware | None = None
        self.resume_from: str | None = None
        self.phases: dict = dict.fromkeys(PHASES)  # filled in as each phase ends
        self.facts: dict = {}
        self.trainer = None
        self.prepared: data.PreparedData | None = None
        self.held_out = None  # the rows exact match scores after training (main process), or None
        self.answers_before = None  # the baseline's answers to them, for exact_match.jsonl
        self.answer_tokens = 0  # the tokens each of those answers may take (``_answer_tokens``)
        self.carried_before: list[dict] | None = None  # a resumed run: the baseline's answers the stopped part wrote
        self.benchmarks: in_run.InRun | None = None  # the recipe's benchmarks, checked (main process), or None
        self.benchmarks_before: dict | None = None  # their scores of the model as loaded
        self.stop_wait = 0  # seconds one process waits after a stop signal before it saves (signals.jit_kill_wait)
        self.phase = "starting"  # what the run is doing before its first step, for a stop that comes then
        self.started = 0.0  # when training started (perf_counter)
        self.seconds = 0.0  # training's seconds, once it ends

    def extra(self) -> dict:
        """summary.json beyond the losses (``_extra``), over training's seconds."""
        return _extra(self.recipe, self.prepared, self.trainer, self.seconds)

    def report(self, summary: dict) -> None:
        """plots/, log_history.json and summary.json with ``summary`` and the run's facts (``_write_report``)."""
        _write_report(self.output_dir, summary, self.trainer.state.log_history, self.main, self.facts,
                      self.wall_started, self.say)


def _output_dir_held(run: _Run) -> contextlib.AbstractContextManager[None]:
    """The output directory held for this run (``outputs.lock``), taken before anything is written there: a second
    ``ft train`` into it is refused (exit 2, naming this process), and so is a directory that cannot be written, before
    the data is prepared. The main process holds it; under ``ft train --num-processes`` on one machine the launcher
    holds it for the ranks (``launch.lock_holder``); the other ranks write only after the main process has it (their
    first write comes after ``_resolve_resume``'s ``main_process_first``)."""
    if not run.main:
        return contextlib.nullcontext()
    return _held_with_reserve(lock.output_dir(run.output_dir, held_by=launch.lock_holder()), run.output_dir)


@contextmanager
def _held_with_reserve(held: contextlib.AbstractContextManager[None], output_dir: Path):
    """``held`` for the block; the disk reserve the run keeps there (``_prepare``: ``disk.hold_reserve``) given back
    as it ends, however it ends."""
    with held:
        try:
            yield
        finally:
            disk.free_reserve(output_dir)


def _check_machine(run: _Run) -> None:
    """Refuse (exit 2, nothing loaded) nodes started differently (``peers.agree``); and, as a RecipeError, what this
    machine cannot run, a push without a token or to a repository it cannot write, a repository it cannot read, a
    GGUF file it cannot use."""
    recipe = run.recipe
    if ranks.world_size() > 1:  # the ranks were started alike, or every one refuses (one process: nothing to compare)
        peers.agree(redact(resolved_dict(recipe)), versions())
    run.hw = hardware.probe()
    problems = (hardware.check_hardware(recipe, run.hw, ranks.world_size()) + hub.check_hub(recipe)
                + hub.check_reads(recipe) + loading.gguf_problems(recipe.model)
                + inputs.missing_data(run.loaded))
    if not problems and run.main:  # the repository a pushing run writes to, created before anything loads
        problems = hub.check_push(recipe)
    if problems:
        raise run.loaded.error(problems)


def _resolve_hooks(run: _Run) -> Hooks:
    """The recipe's own code (loss, callbacks, rewards, optimizer and scheduler classes), imported and checked once;
    a PluginError becomes a RecipeError at the key's file and line. A module is looked up next to the recipe, then next
    to the recipes it extends (``LoadedRecipe.folders``), so a base recipe's ``module:function`` works from a recipe in
    another folder; those folders are importable only while the names are imported (``trainers.plugins``)."""
    try:
        return resolve_hooks(run.recipe, run.loaded.folders)
    except PluginError as exc:
        raise run.loaded.error([exc.problem]) from None


def _resolve_resume(run: _Run, resume: str, overwrite: bool) -> None:
    """The checkpoint the run resumes from (``--resume``; with ``--overwrite`` the main process clears the output
    directory first), checked for drift against the saved recipe; then the run's first line, what this machine
    makes of the recipe (``_machine_notices``) and summary.json's facts."""
    import torch

    recipe, say, output_dir = run.recipe, run.say, run.output_dir
    with ranks.main_process_first(cpu=not run.hw.cuda):  # with --overwrite the main process clears, others find it so
        resumed = checkpoints.resolve_resume(resume, output_dir, overwrite=overwrite and run.main)
    run.resume_from = resumed.path
    if run.resume_from is None and not overwrite:
        _said_before(run)
    for item in resumed.passed_over:
        say(f"ft: passing over a checkpoint that does not read back: {item.render()}")
    if resumed.final_problem:
        say(f"ft: the completed run's {output_dir / resumed.final_problem}; writing it again from {resumed.path}")
    if run.resume_from:
        harmless = check_drift(recipe, output_dir, run.resume_from, run.command, world_size=ranks.world_size())
        if harmless:
            say("ft: resuming with changes that leave the training as it was: "
                + "; ".join(change.render() for change in harmless))
    processes = f" × {ranks.world_size()} processes" if ranks.world_size() > 1 else ""
    say(f"ft: {recipe.method} on {run.hw.summary}{processes}; output in {output_dir}")
    threads = torch.get_num_threads()  # intra-op threads (OMP_NUM_THREADS sets them)
    for notice in _machine_notices(run, threads):
        say(notice)
    run.facts = {"device": run.hw.summary,
                 "peak_memory_source": "cuda_max_allocated" if run.hw.cuda else "process_max_rss",
                 "resumed_from": run.resume_from, "phase_seconds": run.phases, "versions": versions(),
                 "torch_threads": threads,
                 "failure": None, "unreadable_checkpoints": [item.as_dict() for item in resumed.passed_over]}
    if run.resume_from:
        _carry_over(run)


def _machine_notices(run: _Run, threads: int) -> list[str]:
    """What this machine makes of the recipe, said under the run's device line: bfloat16 asked for on a CPU that
    emulates it (``hardware.slow_bf16_notice``), and a CPU other processes keep busy, with the setting that helps
    (``hardware.busy_cpu_notice``)."""
    notices = [hardware.slow_bf16_notice(run.recipe, run.hw)]
    if not run.hw.cuda and hasattr(os, "getloadavg"):
        notices.append(hardware.busy_cpu_notice(os.getloadavg()[0], os.cpu_count() or 1, threads))
    return [notice for notice in notices if notice]


def _prepare(run: _Run, hooks: Hooks, callbacks) -> None:
    """The trainer and its data (``prepare_trainer``), then the output directory with the resolved recipe.yaml; a
    problem the model or tokenizer shows in the recipe is a RecipeError at the key's file and line."""
    try:
        run.trainer, run.prepared = prepare_trainer(run.recipe, hooks, run.hw, run.say, callbacks, phases=run.phases)
    except PluginError as exc:  # a recipe setting the model shows wrong (optimizer.groups matching no parameter)
        raise run.loaded.error([exc.problem]) from None
    except RecipeError as exc:  # one the tokenizer shows wrong (a train.pad_token it does not have)
        raise run.loaded.error(exc.problems) from None
    run.output_dir.mkdir(parents=True, exist_ok=True)
    if run.main:
        disk.hold_reserve(run.output_dir)  # room for the record of a failure on a disk that fills
        disk.write_whole(run.output_dir / "recipe.yaml", resolved_recipe_yaml(run.recipe))
    if run.resume_from:
        run.say(f"ft: resuming from {run.resume_from}")


def _answer_tokens(run: _Run, settings) -> int:
    """The tokens exact match lets each answer take: ``max_new_tokens`` where the recipe sets it, else the longest
    expected answer's with its end of turn (``exact_match.answer_tokens``). Set shorter than that answer, the run
    stops here, before training: that answer would be cut short and scored wrong before and after training, however
    well the model answers, and nothing would say why."""
    model = run.trainer.accelerator.unwrap_model(run.trainer.model)
    needed, index = exact_match.answer_tokens(model, run.trainer.processing_class, run.held_out)
    if settings.max_new_tokens is None:
        run.say(f"ft: exact match: answers may take {needed} tokens (the longest expected answer, its end of turn "
                "included; data.eval_exact_match.max_new_tokens sets it)")
        return needed
    if settings.max_new_tokens < needed:
        answer = run.held_out[index].answer
        shown = answer if isinstance(answer, str) else exact_match.call_text(answer)
        raise run.loaded.error([Problem(
            "data.eval_exact_match.max_new_tokens",
            f"is {settings.max_new_tokens}, and the expected answer of held-out row {index + 1} ({shown[:80]!r}) is "
            f"{needed} tokens for this model's tokenizer, its end of turn included: it would be cut short and scored "
            f"wrong before and after training, however well the model answers. Set it to at least {needed}, or "
            "remove it (ft then allows the longest expected answer's length).")])
    return settings.max_new_tokens


def _score_before_training(run: _Run) -> None:
    """With ``data.eval_exact_match``: its rows read now (a source without answers fails before training), and the
    baseline scored as the trained model will be (not on a resume: its loaded weights are not its start)."""
    settings = run.recipe.data.eval_exact_match
    seeing = getattr(run.trainer.processing_class, "image_processor", None) is not None  # a VLM: rows keep images
    calls = exact_match.reads_calls(run.trainer.processing_class)  # rows answered by tool calls are scored
    run.held_out = exact_match.held_out_rows(run.recipe, settings.n, seeing, calls, run.say) \
        if run.main and settings is not None else None
    if run.held_out is not None:
        run.answer_tokens = _answer_tokens(run, settings)
    with _timed(run.phases, "exact_match_before"):
        baseline = exact_match.before_training(run.recipe, run.trainer, run.held_out, run.answer_tokens, run.say) \
            if not run.resume_from else None
    if baseline is None:
        run.phases["exact_match_before"] = None  # not scored: no time of its own
    run.answers_before = baseline.pop("answers") if baseline is not None else None  # for exact_match.jsonl
    if baseline is not None:
        run.facts["exact_match_before"] = baseline
        exact_match.write_answers(run.output_dir / exact_match.ANSWERS, None, run.answers_before)  # kept if stopped
    elif run.held_out is not None and run.carried_before is not None and len(run.carried_before) == len(run.held_out):
        run.answers_before = run.carried_before  # the stopped part's, for the same rows
    if run.benchmarks is not None and "before" in run.benchmarks.when and not run.resume_from:
        out = run.output_dir / "eval" / "before.json"
        with _timed(run.phases, "benchmarks_before"):
            run.benchmarks_before = run.benchmarks.score(*_scored_model(run.trainer), out)
        run.say(in_run.line(run.benchmarks_before, "before training"))


def _scored_model(trainer) -> tuple:
    """The model a benchmark scores (unwrapped from DDP) and its text tokenizer."""
    return trainer.accelerator.unwrap_model(trainer.model), loading.text_tokenizer(trainer.processing_class)


@contextmanager
def _failure_recorded(run: _Run):
    """Around training and what follows it: an exception is raised on after summary.json says ``failed`` (then ft
    train prints its one paragraph and exits 1); a full disk is raised as ``DiskFull``, after what was half-written is
    removed. A failed push is raised as it is: the run is complete and its summary.json says so, with the push's
    failure."""
    run.started = time.perf_counter()  # set again as training starts
    phases = run.phases
    try:
        yield
    except hub_push.PushFailed:
        raise
    except Exception as exc:
        saving = phases["train"] is not None and phases["save"] is None  # between training and a whole final/
        full = disk.explain(exc, run.output_dir, run.command, final=saving) if run.main else None  # removes the half
        if ranks.world_size() > 1 and peers.peer_failure(exc):
            signals.hold_stops()  # the agent's SIGTERM to the ranks left must not cut this rank's report short
        lost = _peers_lost(run, exc)
        if run.main:
            disk.free_reserve(run.output_dir)  # the room summary.json and error.log are written in
            seconds = phases["train"] if phases["train"] is not None else time.perf_counter() - run.started
            log = _write_traceback(exc, run.output_dir)
            _write_failure(lost or exc, run.output_dir, run.recipe, run.prepared, run.trainer, seconds, run.facts,
                           run.wall_started, run.say, log)
        if full is not None:
            raise full from None
        if lost is not None:
            raise lost from exc
        raise


def _peers_lost(run: _Run, exc: Exception) -> peers.PeerLost | None:
    """On several processes, a collective that failed because other ranks are gone: the paragraph naming them
    (``ft.run.peers``); None for any other failure."""
    if ranks.world_size() == 1 or run.trainer is None or not peers.peer_failure(exc):
        return None
    state = run.trainer.state
    saved = checkpoints.complete_checkpoints(run.output_dir)
    return peers.explain(exc, peers.roll_call(), state.global_step, state.max_steps, run.trainer.args.ddp_timeout,
                         str(saved[-1]) if saved else None, run.command)


@contextmanager
def _stop_watch(run: _Run):
    """The stop watch over training and what follows it, to the run's last line (``StopWatch``): a stop signal
    during training saves a checkpoint at a step end, where JIT checkpoints are on (``trainers.preemption`` says why
    ft takes the stop itself); one after the last step is noted, and ``_finish`` saves final/ and skips what is left
    (``_late_signal``). With JIT checkpoints off the signals act as they would without ft."""
    trainer = run.trainer
    at_step_end = trainer.args.enable_jit_checkpoint
    together = ranks.world_size() > 1
    run.stop_wait = wait = 0 if together else signals.jit_kill_wait()
    with signals.StopWatch(pass_on=not at_step_end, resume_hint=f"To resume, run: {run.command}") as watch:
        if at_step_end:
            from ..trainers.preemption import StopAtStepEnd  # transformers: after prepare_trainer's imports

            trainer.add_callback(StopAtStepEnd(watch, trainer.ft_stop_point, wait, together))
        if run.benchmarks is not None and "each_save" in run.benchmarks.when:  # after StopAtStepEnd: it sees a stop
            trainer.add_callback(in_run.score_at_save(run.benchmarks, lambda: _scored_model(trainer),
                                                      run.output_dir / "eval", run.say))
        yield watch


def _train(run: _Run, watchdog) -> None:
    """``trainer.train``; its seconds go into ``phases``. A save the disk guard refused is raised as ``DiskFull``. A
    run resumed from a checkpoint of its last step trains nothing (``_nothing_left_to_train``)."""
    trainer = run.trainer
    if run.resume_from:
        trainer.add_callback(_nothing_left_to_train())
    run.started = time.perf_counter()
    peers.beat()  # several processes: what a survivor's roll call reads when ranks are lost
    try:
        trainer.train(resume_from_checkpoint=run.resume_from)
    except _NothingLeftToTrain:
        _end_without_training(run)
    run.seconds = time.perf_counter() - run.started
    run.phases["train"] = round(run.seconds, 3)
    if watchdog is not None and watchdog.refused:
        raise disk.DiskFull(watchdog.refused)


class _NothingLeftToTrain(Exception):
    """Raised at the start of ``trainer.train`` when the checkpoint it resumed from is of the run's last step."""


def _nothing_left_to_train():
    """A TrainerCallback that ends ``trainer.train`` before its first step when the checkpoint resumed from holds the
    run's last step (or a later one): its ``global_step`` at least ``max_steps``, as transformers computes it for this
    recipe and data (``train.max_steps``, else the epochs' steps).

    Why: transformers resumed at its last step still trains one more (it checks for the end after a step, and
    ``num_train_epochs`` counts whole epochs: ``step 61/60``, a ``checkpoint-61``), so a run killed after its last
    checkpoint, or whose final/ write failed on a full disk, would end with weights no uninterrupted run has. At
    ``on_train_begin`` transformers has loaded the checkpoint's weights (every distributed kind), optimizer and state,
    and trained nothing; every process of a run raises there alike. ``_end_without_training`` ends what training
    would have ended (transformers 5.25, ``Trainer._finalize_training``)."""
    from transformers import TrainerCallback

    class NothingLeft(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if state.max_steps > 0 and state.global_step >= state.max_steps:
                raise _NothingLeftToTrain

    return NothingLeft()


def _end_without_training(run: _Run) -> None:
    """The run resumed from a checkpoint of its last step: what the end of training does, without a step (the best
    checkpoint loaded when ``load_best_model_at_end`` asks, the callbacks told the training ended), then ``_finish``
    writes final/ from the weights the checkpoint holds, those the uninterrupted run ended with."""
    trainer = run.trainer
    state = trainer.state
    where = (f"step {state.global_step}, past the {state.max_steps} steps this recipe trains" if state.global_step >
             state.max_steps else f"step {state.global_step} of {state.max_steps}, the run's last")
    run.say(f"ft: {run.resume_from} is {where}: nothing is left to train; final/ is written from it")
    if trainer.args.load_best_model_at_end and state.best_model_checkpoint is not None:
        trainer._load_best_model()  # transformers' own step at the end of training (no public name for it)
    trainer.control = trainer.callback_handler.on_train_end(trainer.args, state, trainer.control)
    trainer.is_in_train = False


def _stopped_by_signal(run: _Run, signum: int) -> RunResult:
    """A stop signal ended training before its last step: the checkpoint saved at a step end, summary.json
    ``stopped``, and the command that resumes (exit 128 + the signal's number)."""
    state = run.trainer.state
    saved = checkpoints.complete_checkpoints(run.output_dir)
    summary = summarize("stopped", state.log_history, steps=state.global_step, train_seconds=run.seconds,
                        final_eval=None, extra=run.extra())
    name = signals.signal_name(signum)
    summary.update(checkpoint=str(saved[-1]) if saved else None, stopped_by=name, resume_command=run.command)
    run.report(summary)
    wait = run.stop_wait
    after = (f"ft waits {wait} s after the signal, in case a SIGKILL follows, then saves at the end of a step"
             if wait else "every process saved at the same step end")
    run.say(f"ft: stopped by {name} at step {state.global_step} of {state.max_steps}; saved "
            f"{summary['checkpoint']} ({after}). To resume from it, run the same command again: {run.command}")
    return RunResult("stopped", run.output_dir, summary, signum)


def _stopped_before_training(run: _Run, signum: int) -> RunResult:
    """A stop signal came before the first step: nothing was trained and there is no checkpoint. summary.json says
    ``stopped`` and in which phase (``stopped_in``), one line says so, and the run exits 128 + the signal's number;
    the same command starts the run over (``_said_before``)."""
    name = signals.signal_name(signum)
    if run.phase == PREPARING:  # prepare_trainer times the data, then the model
        run.phase = "loading the model" if run.phases["prepare_data"] is not None else "preparing the data"
    summary = summarize("stopped", [], steps=0, train_seconds=0.0, final_eval=None)
    summary.update(stopped_by=name, stopped_in=run.phase, checkpoint=None, resume_command=run.command)
    if run.main:
        run.output_dir.mkdir(parents=True, exist_ok=True)
        write_summary(run.output_dir, {**summary, **run.facts, "phase_seconds": run.phases,
                                       "wall_seconds": round(time.perf_counter() - run.wall_started, 3)})
    run.say(f"ft: stopped by {name} while {run.phase}, before the first step: nothing was trained and no checkpoint "
            f"was saved. Run the same command to start over: {run.command}")
    return RunResult("stopped", run.output_dir, summary, signum)


def _previous_summary(run: _Run) -> dict:
    """The summary.json the last run in the output directory left ({} where there is none that reads)."""
    try:
        found = json.loads((run.output_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _carry_over(run: _Run) -> None:
    """A resumed run keeps what the parts before it measured: their steps and times (``earlier_parts``: ``ft
    report`` sums them and marks the run resumed), and the baseline exact match they scored (the model as loaded at
    the start, which a resume cannot score again), with its answers (``exact_match.jsonl``'s ``before``)."""
    previous = _previous_summary(run)
    if not previous:
        return
    part = {key: previous.get(key) for key in ("steps", "train_seconds", "wall_seconds", "stopped_by")}
    run.facts["earlier_parts"] = [*(previous.get("earlier_parts") or []), part]
    if previous.get("exact_match_before") is not None:
        run.facts["exact_match_before"] = previous["exact_match_before"]
        try:
            lines = (run.output_dir / exact_match.ANSWERS).read_text().splitlines()
            run.carried_before = [{"got": json.loads(line)["before"]} for line in lines]
        except (OSError, ValueError, KeyError, TypeError):
            run.carried_before = None  # the score is kept; its answers row by row are not


def _said_before(run: _Run) -> None:
    """A fresh start where the last run in the output directory was stopped before its first step says so: that run
    left nothing to resume from, so this one starts over."""
    previous = _previous_summary(run)
    if previous.get("status") == "stopped" and previous.get("stopped_in") and not previous.get("steps"):
        run.say(f"ft: the last run in {run.output_dir} was stopped by {previous.get('stopped_by')} while "
                f"{previous['stopped_in']}, before its first step; it left no checkpoint, so this run starts over")


def _stream_failed(run: _Run) -> RunResult:
    """A streamed source failed mid-run: the Trainer saved the last finished step (``FtTrainerMixin``); say what
    failed and how to go on from there (exit 1)."""
    state, failure = run.trainer.state, run.trainer.ft_stream_failure
    saved = checkpoints.complete_checkpoints(run.output_dir)
    summary = summarize("stopped", state.log_history, steps=state.global_step, train_seconds=run.seconds,
                        final_eval=None, extra=run.extra())
    summary.update(checkpoint=str(saved[-1]) if saved else None, stopped_by="data", data_failure=str(failure),
                   resume_command=run.command)
    run.report(summary)
    run.say(f"ft: {failure}\nft: training stopped at step {state.global_step} of {state.max_steps} and saved "
            f"{summary['checkpoint']}; every row before it is trained, none after. Make the source readable again "
            f"(or fix the row), then resume with the same command: {run.command}")
    return RunResult("stopped", run.output_dir, summary)


def _finish(run: _Run, watch: signals.StopWatch) -> RunResult:
    """Training reached its end: the final evaluation (the one at the last step, when there was one), final/, the
    summary with exact match scored on the held-out rows, plots, and the push to the Hub (exit 0). A stop signal that
    came in the run's last moments, or comes now, leaves the run completed with final/ saved and skips the parts that
    only score or publish it (``_late_signal``)."""
    trainer, phases, output_dir = run.trainer, run.phases, run.output_dir
    skipped: list[str] = []
    final_eval = _evaluated_at_last_step(trainer) if run.prepared.eval is not None else None
    if final_eval is not None:
        phases["evaluate"] = 0.0  # the evaluation at the last step (timed in train) is the final one
    elif run.prepared.eval is not None:
        if _late_signal(run, watch):
            skipped.append("the final evaluation")
        else:
            with _timed(phases, "evaluate"):
                final_eval = trainer.evaluate()
    with _timed(phases, "save"):
        distributed.full_state_dict_for_final(trainer)  # FSDP with sharded checkpoints: final/ is a whole model
        _save_final(trainer, output_dir, run.main)
    late = _late_signal(run, watch)
    state = trainer.state
    summary = summarize("completed", state.log_history, steps=state.global_step, train_seconds=run.seconds,
                        final_eval=final_eval, extra=run.extra())
    if run.held_out is not None and late:
        skipped.append("exact match")
        summary["exact_match"] = None
    elif run.held_out is not None:  # greedy answers to the held-out prompts, on this (the main) process alone
        with _timed(phases, "exact_match"):
            summary["exact_match"] = exact_match.after_training(run.recipe, trainer, run.held_out,
                                                                run.answer_tokens, run.say)
        if summary["exact_match"] is not None:
            exact_match.write_answers(output_dir / exact_match.ANSWERS, summary["exact_match"], run.answers_before)
        else:
            phases["exact_match"] = None  # skipped (a sharded model): no time of its own
    if run.benchmarks is not None and late:
        skipped.append("the benchmarks")
    elif run.benchmarks is not None:
        with _timed(phases, "benchmarks"):
            summary["benchmarks"] = _benchmarks(run)
    push = run.main and trainer.args.push_to_hub
    if push and late:
        skipped.append("the push to the Hub")
    if late:
        summary["late_signal"] = {"signal": signals.signal_name(late), "skipped": skipped}
    run.report(summary)
    run.say(f"ft: done in {time.perf_counter() - run.wall_started:.1f}s ({_phase_times(phases)}); model in "
            f"{output_dir / 'final'}")
    if late:
        run.say(f"ft: {signals.signal_name(late)} came after the last step: the run is complete and final/ is saved; "
                f"skipped so that it ends now: {', '.join(skipped) or 'nothing'}. `ft eval {output_dir}` scores it"
                + (f"; to push it: {hub_push.by_hand(trainer.hub_model_id, trainer.args.hub_revision, output_dir)}"
                   if push else "") + ".")
    elif push:
        _push(trainer, output_dir, summary, run.say)
    return RunResult("completed", output_dir, summary)


def _late_signal(run: _Run, watch: signals.StopWatch) -> int:
    """The stop signal (its number; 0 for none) that came while training ran its last steps or after them, which
    leaves the run completed: what only scores or publishes the model is skipped, so that a preempted machine's
    grace period goes to final/. Every process asks at the same points and they agree (``preemption.agreed``).
    With JIT checkpoints off (``pass_on``) a signal has already ended the process."""
    received = 0 if watch.pass_on else (watch.received or 0)
    if ranks.world_size() > 1:
        from ..trainers.preemption import agreed

        return agreed(received, run.trainer.args.device)
    return received


def _phase_times(phases: dict) -> str:
    """``prepare_data 3.1s, load_model 12.0s, train 600.2s, …``: the phases that ran, as summary.json times them."""
    return ", ".join(f"{name} {seconds:.1f}s" for name, seconds in phases.items() if seconds is not None)


def _benchmarks(run: _Run) -> dict:
    """summary.json ``benchmarks``: the scores ``before`` training and at the ``end`` (``{task: {metric: value}}``;
    None where not asked, or before on a resume) and at each checkpoint (``steps``, from the log history)."""
    end = None
    if "end" in run.benchmarks.when:
        end = run.benchmarks.score(*_scored_model(run.trainer), run.output_dir / "eval" / "end.json")
        run.say(in_run.line(end, "after training"))
    history = run.trainer.state.log_history
    steps = {str(step): scores for step, scores in in_run.by_step(history).items()}
    # the plots draw each metric from before training to the end, across the checkpoints' scores
    if run.benchmarks_before is not None:
        history.insert(0, {**in_run.flat(run.benchmarks_before), "step": 0})
    if end is not None:
        history.append({**in_run.flat(end), "step": run.trainer.state.global_step})
    return {"before": run.benchmarks_before, "end": end, "steps": steps}


def _save_final(trainer, output_dir: Path, main: bool) -> None:
    """final/, whole or not at all: the model is saved into ``final.writing/`` and renamed to ``final/`` once every
    process has written its part, so a kill or a full disk never leaves a final/ cut short (the next run writes it
    again: ``outputs.checkpoints``). A final/ left by an earlier attempt is removed first."""
    final, writing = output_dir / checkpoints.FINAL, output_dir / checkpoints.FINAL_WRITING
    if main:
        for stale in (writing, final):
            if stale.is_dir():
                shutil.rmtree(stale)
    trainer.accelerator.wait_for_everyone()  # no process writes into final.writing/ before it is cleared
    trainer.save_model(str(writing))
    trainer.accelerator.wait_for_everyone()  # every process has written its part
    if main:
        os.replace(writing, final)


def _push(trainer, output_dir: Path, summary: dict, say: Callable[[str], None]) -> None:
    """final/ and summary.json to the Hub (``outputs.hub_push``); summary.json here then records where they went, or
    why they did not."""
    try:
        summary["hub"] = hub_push.push_final(trainer, output_dir, say)
    except hub_push.PushFailed as failed:
        summary["hub"] = failed.record
        raise
    finally:
        write_summary(output_dir, summary)


def prepare_trainer(recipe: Recipe, hooks: Hooks, hw: hardware.Hardware, say: Callable[[str], None] = print,
                    callbacks=(), *, phases: dict | None = None) -> tuple[object, data.PreparedData]:
    """Processing class, datasets, model and trainer, as ``ft train`` builds them before it trains; the seconds each
    part took go into ``phases`` (``prepare_data``: processing class and data; ``load_model``: model, adapter and
    trainer). The processing class (a tokenizer, or a processor holding one: ``ft.model.loading``) goes to the
    trainer, which saves it with every checkpoint and final/; the data and the embeddings are fitted to the text
    tokenizer inside it."""
    clock = time.perf_counter()
    bnb_import.import_bitsandbytes(uses_it=bnb_import.uses_bitsandbytes(recipe))  # before PEFT imports it: see there
    processing_class = locate.start_processing_class(recipe.model, say)  # model.name may be a run: ft.model.locate
    tokenizer = loading.text_tokenizer(processing_class)
    problems = loading.token_problems(recipe, tokenizer)
    if problems:  # located by train(): file and line
        raise RecipeError(problems)
    template = data.chat_template_for(recipe, processing_class)
    if template is not None:
        processing_class.chat_template = template  # final/ ships the template the model was trained with
        # ... and how to read calls back from what it writes (exact match; anyone's tokenizer.parse_response)
        tokenizer.response_template = data.response_template_for(recipe.data.chat_template, tokenizer)
    # one process writes data.prepared_path, the others wait for it outside any collective (no timeout)
    if ranks.world_size() > 1 and recipe.data.prepared_path is not None:
        say(f"data: the other {ranks.world_size() - 1} processes read {recipe.data.prepared_path} once this one has "
            "it ready (they wait without a time limit)")
    # the main process may write data.prepared_path: held meanwhile (outputs.lock), after any other writer of it
    held = contextlib.nullcontext()
    if ranks.is_main() and recipe.data.prepared_path is not None:
        held = lock.prepared_path(Path(recipe.data.prepared_path), wait=True, say=say, only_if_writable=True)
    with held:
        prepared = data.prepare_data(recipe, processing_class, template, say,
                                     rebuild_ok=not recipe.data.require_prepared, builder=ranks.is_main(),
                                     world_size=ranks.world_size())
    data_ready = time.perf_counter()
    model = locate.load_start(recipe, seed=recipe.train_args.get("seed", 42), say=say)
    model, new_token_ids = adapters.prepare_base(model, recipe, tokenizer, say)
    # ft's defaults: this machine's, then what distributed: maps to (over the machine's), then JIT checkpointing
    defaults = {**hardware.device_defaults(recipe, hw),
                **distributed.training_args(recipe, ranks.world_size(), cuda=hw.cuda, model=model),
                **distributed.collective_timeout(recipe), **checkpoints.JIT_DEFAULT}
    sharded = bool(defaults.get("fsdp") or defaults.get("deepspeed"))
    # a vision-language model's adapter goes on its language model only (said, with how to opt the tower in)
    lora = adapters.lora_config(recipe.adapter, new_token_ids, METHODS[recipe.method].peft_task)
    lora = adapters.fit_lora_targets(lora, model, say)
    inputs = TrainerInputs(model, processing_class, prepared.train, prepared.eval, hooks, defaults, tuple(callbacks),
                           hardware.optimizer_defaults(recipe, hw), lora,
                           preflight.settings_for(recipe, hw.cuda, sharded, say))
    trainer = build_trainer(recipe, inputs)
    if trainer.args.push_to_hub and trainer.args.hub_always_push:
        trainer.add_callback(hub_push.one_push_at_a_time(trainer))
    if phases is not None:
        phases.update(prepare_data=round(data_ready - clock, 3), load_model=round(time.perf_counter() - data_ready, 3))
    return trainer, prepared


def _disk_guard(run: _Run):
    """A run that saves checkpoints: a warning now if the disk will not hold those it keeps, and a callback that
    stops cleanly before a save that would not fit (``outputs.disk``). None when the run saves no checkpoint."""
    from ..plan.shape import PlanError
    from ..plan.suggest import step_figures

    trainer, output_dir = run.trainer, run.output_dir
    if trainer.args.save_strategy == "no":
        return None
    try:
        size = step_figures(run.recipe, "cuda" if run.hw.cuda else "cpu").checkpoint
    except PlanError:
        size = 0.0
    warning = disk.start_warning(output_dir, size, trainer.args.save_total_limit)
    if warning:
        run.say(warning)
    agree = None
    if ranks.world_size() > 1:
        from ..trainers.preemption import agreed as agree  # every process's answer at the same step end
    watchdog = disk.guard(output_dir, size, run.command, agree)
    trainer.add_callback(watchdog)
    return watchdog


def _evaluated_at_last_step(trainer) -> dict | None:
    """The metrics of the evaluation the trainer ran at its last step (``eval_strategy`` landing on it), which serve as
    the final evaluation instead of a second identical one; None when the last evaluation came earlier, or when the
    trainer loaded the best checkpoint at the end (the model evaluated then is another one)."""
    state = trainer.state
    if trainer.args.load_best_model_at_end:
        return None
    entry = last_eval(state.log_history)
    if entry is None or entry.get("step") != state.global_step:
        return None
    return {key: value for key, value in entry.items() if key != "step"}


@contextmanager
def _timed(phases: dict, name: str):
    """``phases[name]``: the seconds the block took, set only when it ends without an exception."""
    clock = time.perf_counter()
    yield
    phases[name] = round(time.perf_counter() - clock, 3)


def _write_report(output_dir: Path, summary: dict, log_history: list[dict], main: bool, facts: dict,
                  wall_started: float, say: Callable[[str], None]) -> None:
    """plots/, log_history.json and summary.json, from the main process: ``facts`` (device, versions, phase times,
    …) and the wall time since ``wall_started`` are added to ``summary``. Plots that cannot be drawn are said and
    left out: they must not cost the summary."""
    if main:
        try:
            plots = write_plots(output_dir, log_history)
        except Exception as problem:
            plots = []
            say(f"ft: could not draw the plots ({type(problem).__name__}: {first_line(problem)}); summary.json is "
                "written without them")
        write_log_history(output_dir, log_history)
        summary.update(facts, wall_seconds=round(time.perf_counter() - wall_started, 3), plots=plots)
        write_summary(output_dir, summary)


def _write_traceback(exc: Exception, output_dir: Path) -> Path | None:
    """``<output_dir>/error.log``: the traceback of the failure summary.json records, written here so that the file
    the summary names exists however the failure is reported (a full disk is ``DiskFull``, which the cli explains
    without a traceback; FT_DEBUG=1 raises it). The exception carries the path (``ft_error_log``) for the cli's
    paragraph. None when it cannot be written."""
    path = output_dir / "error.log"
    try:
        disk.write_whole(path, "".join(traceback.format_exception(exc)))
    except OSError:
        return None
    with contextlib.suppress(AttributeError):  # an exception class with __slots__ takes no attribute
        exc.ft_error_log = str(path)
    return path


def _write_failure(exc: Exception, output_dir: Path, recipe: Recipe, prepared: data.PreparedData, trainer,
                   seconds: float, facts: dict, wall_started: float, say: Callable[[str], None],
                   log: Path | None) -> None:
    """summary.json with status ``failed`` (the exception's type and first line, and ``log``, the file its traceback
    was written to: ``_write_traceback``; null when it could not be written), then the plots and log_history.json of
    what was logged so far, and the summary again with the plots. The summary comes first, in the room the disk's
    reserve left (``disk.free_reserve``: a full disk is a common failure); when its figures cannot be gathered, it
    holds the status, the failure and the run's facts. A failed run leaves a summary.json."""
    failure = {"type": type(exc).__name__, "message": first_line(exc), "traceback": str(log) if log else None}
    try:
        state = trainer.state
        summary = summarize("failed", state.log_history, steps=state.global_step, train_seconds=seconds,
                            final_eval=None, extra=_extra(recipe, prepared, trainer, seconds))
    except Exception as problem:  # the failure being reported is what the user must see; this one is a footnote
        say(f"ft: summary.json holds the failure alone: its figures could not be gathered ({type(problem).__name__}: "
            f"{first_line(problem)})")
        summary = {"status": "failed"}
    try:
        write_summary(output_dir, {**summary, **facts, "failure": failure, "plots": [],
                                   "wall_seconds": round(time.perf_counter() - wall_started, 3)})
        _write_report(output_dir, summary, trainer.state.log_history, True, {**facts, "failure": failure},
                      wall_started, say)
    except Exception as problem:
        say(f"ft: could not write the run's report after the failure ({type(problem).__name__}: "
            f"{first_line(problem)})")


def _silent(_message: str) -> None:
    """``say`` on the processes other than the main one."""


def _extra(recipe: Recipe, prepared: data.PreparedData, trainer, train_seconds: float) -> dict:
    """summary.json beyond the losses: epochs, data counts, processes, and the main process's token and sample
    counts. Its ``tokens_per_second`` is ``tokens / train_seconds`` (``samples_per_second`` likewise), over the same
    clock as ``train_seconds`` (the log lines' running figure counts from the first training batch instead)."""
    stats = trainer.ft_stats()
    seconds = round(train_seconds, 3)  # as summary.json records it, so that the ratios hold on the written figures
    stats["tokens_per_second"] = round(stats["tokens"] / seconds, 1) if seconds else None
    stats["samples_per_second"] = round(stats["samples"] / seconds, 3) if seconds else None
    epoch = trainer.state.epoch
    extra = {"epochs": round(epoch, 4) if epoch is not None else None, "data": prepared.stats,
             "world_size": trainer.args.world_size, **stats, "preflight": trainer.ft_preflight_result,
             "best": best_checkpoint(trainer.state, trainer.args),
             "headline": headline(recipe.method, trainer.state.log_history)}
    return extra if recipe.adapter is None else {**extra, "base_model": base_model(recipe)}


def base_model(recipe: Recipe) -> dict:
    """The base an adapter run's final/ needs (``ft merge`` and ``ft generate`` read it): a model built from its
    config (``init: random``) is rebuilt from the same config and seed."""
    model = recipe.model
    return {"name": model.name, "revision": model.revision, "init": model.init, "dtype": model.dtype,
            "seed": recipe.train_args.get("seed", 42),
            "quantization": model.quantization.model_dump() if model.quantization else None,
            **({"gguf_file": model.gguf_file} if model.gguf_file else {})}
