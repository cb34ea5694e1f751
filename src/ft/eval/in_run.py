"""A recipe's ``benchmarks:`` scored in process on the model being trained: no reload, on the main process alone.

- ``check`` resolves the tasks and refuses what cannot run (lm-eval missing, a task unknown or on the Hub while it is
  switched off) before any model or data loads.
- ``InRun.score`` scores the model as it is in memory (``before`` training: the model as loaded, not on a resume; at
  the ``end``: the trained one), each score's lm-eval results file written into ``<output_dir>/eval/``.
- ``ScoreAtSave`` scores it as each checkpoint is about to be written (``each_save``): at the end of a step the
  Trainer will save, before the save, so the scores (``benchmark/<task>/<metric>`` in the trainer state's log
  history) are in that checkpoint and survive a resume. A step where training stops (its last, or a stop by signal:
  the checkpoint then must be written at once) is not scored there; the ``end`` scores the trained model.

lm-eval seeds Python's, NumPy's and torch's generators; each score keeps every generator's state (and the model's
train mode) as it found it, so the training that follows draws what it would have drawn without the score, and a
resumed run ends bit-identical to an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .score import Settings, metrics, score
from .tasks import Tasks, check, resolve

PREFIX = "benchmark/"  # log-history keys: benchmark/<task>/<metric>


@dataclass(frozen=True)
class InRun:
    """A recipe's benchmarks, checked: its tasks, lm-eval's task manager, the settings, the moments to score."""

    tasks: Tasks
    manager: object
    settings: Settings
    when: tuple[str, ...]

    def score(self, model, tokenizer, out: Path) -> dict[str, dict[str, float]]:
        """``{task: {metric: value}}`` of ``model`` (lm-eval's results file ``out``: ``eval/<moment>.json`` becomes
        ``eval/<moment>_<time>.json``), every random generator and the model's train mode as they were."""
        with _random_state_kept():
            results, _ = score(model, tokenizer, self.tasks, self.manager, self.settings, out)
        return metrics(results)


def prepare(section, main: bool) -> InRun | None:
    """The recipe's ``benchmarks`` section checked (on the main process; the others score nothing), or None."""
    if section is None or not main:
        return None
    tasks = resolve(section.tasks, Path.cwd(), "benchmarks.tasks")  # task files are absolute once validated
    settings = Settings(section.limit, section.num_fewshot, section.batch_size, section.chat_template, section.system)
    return InRun(tasks, check(tasks, "benchmarks.tasks"), settings, tuple(section.when))


def flat(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    """``{benchmark/<task>/<metric>: value}``: scores as log-history keys."""
    return {f"{PREFIX}{task}/{metric}": value for task, values in scores.items() for metric, value in values.items()}


def line(scores: dict[str, dict[str, float]], when: str) -> str:
    shown = ", ".join(f"{task} {metric} {value:.4f}" for task, values in scores.items()
                      for metric, value in values.items())
    return f"ft: benchmarks {when}: {shown}"


def score_at_save(in_run: InRun, model_and_tokenizer: Callable[[], tuple], out: Path, say: Callable[[str], None]):
    """The callback that scores the model at each checkpoint (``each_save``), its results files in the folder
    ``out`` (``step-<N>_<time>.json``)."""
    from transformers import TrainerCallback

    class ScoreAtSave(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if not control.should_save or control.should_training_stop or not state.is_world_process_zero:
                return control
            model, tokenizer = model_and_tokenizer()
            scores = in_run.score(model, tokenizer, out / f"step-{state.global_step}.json")
            state.log_history.append({**flat(scores), "step": state.global_step})  # saved with the checkpoint
            say(line(scores, f"at step {state.global_step}"))
            return control

    return ScoreAtSave()


def by_step(log_history: list[dict]) -> dict[int, dict[str, dict[str, float]]]:
    """The scores at each checkpoint, from a log history: ``{step: {task: {metric: value}}}``."""
    found: dict[int, dict[str, dict[str, float]]] = {}
    for entry in log_history:
        for key, value in entry.items():
            if key.startswith(PREFIX):
                task, _, metric = key.removeprefix(PREFIX).partition("/")
                found.setdefault(entry["step"], {}).setdefault(task, {})[metric] = value
    return found


@contextmanager
def _random_state_kept():
    import random

    import numpy as np
    import torch

    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
