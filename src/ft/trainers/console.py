"""What ``ft train`` prints while it trains: one readable line per log event, on stderr, from the main process.

transformers prints each log event as a raw dict (``PrinterCallback``, or ``ProgressCallback`` above its tqdm bar),
on stdout, with every metric at four significant digits, evaluation noise included (``eval_num_tokens``,
``eval_runtime``, …). ``install`` swaps both for ``ConsoleCallback``:

    step  20/400  loss 1.234  lr 2.7e-03  grad 1.08  acc 0.412  tok/s 21.5k
    step 100/400  eval  loss 1.101  acc 0.620
    trained 400 steps in 312.4 s, mean loss 0.857

Training lines carry the step, loss, learning rate, gradient norm, the method's headline figures (its
``Method.headlines`` with a label: token accuracy for SFT; reward accuracy and margin for DPO and ORPO, the margin for
KTO; mean reward for GRPO) and tokens per second.
Evaluation lines carry the evaluation metrics without the runtime, samples/s, steps/s, token count and entropy, nor
the detail families (``logits/…``, ``logps/…``, chosen/rejected rewards). Every value, these included, still goes to the
trackers (``train.report_to``) and to ``trainer_state.json``'s log history. A tqdm bar counts the training steps
when stderr is a terminal; piped (and with ``TQDM_DISABLE=1`` or ``train.disable_tqdm: true``) only the lines are
written. The bars of data preparation are datasets' own and are left alone.

A heartbeat says the run is alive whatever ``logging_steps`` says: after the first step, and whenever a minute of
training passes without a line, one line with the step, the time per step and the time left at that pace:

    step   1/400  31.2 s/step  left 3h27m
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from ..recipe.methods import METHODS

# a log key -> (its label on the line, its format), in line order: these, the method's headline figures, then RATE
GENERIC: dict[str, tuple[str, str | None]] = {
    "loss": ("loss", "{:.3f}"),
    "learning_rate": ("lr", "{:.1e}"),
    "grad_norm": ("grad", "{:.3g}"),
}
HEADLINE_FORMAT = "{:.3f}"
RATE: dict[str, tuple[str, str | None]] = {"tokens_per_second": ("tok/s", None)}  # ft's (FtTrainerMixin), by _rate
# the keys some method's line shows under a label: never shown by their own name on an evaluation line (DPO also logs
# a mean_token_accuracy, SFT's headline, which its reward accuracy stands for)
LABELLED = frozenset(figure.key for method in METHODS.values() for figure in method.headlines if figure.label)
# evaluation keys (without eval_) never shown: timing noise, a running token count, and detail families
EVAL_HIDDEN = {"runtime", "samples_per_second", "steps_per_second", "num_tokens", "entropy", "epoch"}
# the train summary transformers logs once training ends
SUMMARY_KEYS = ("train_runtime", "train_loss")
HEARTBEAT_SECONDS = 60.0  # the longest training goes without a console line


def labels(method: str | None) -> dict[str, tuple[str, str | None]]:
    """A log key -> (label, format) for the lines of ``method`` (None: the keys every method logs), in line order."""
    figures = METHODS[method].headlines if method is not None else ()
    return {**GENERIC, **{figure.key: (figure.label, HEADLINE_FORMAT) for figure in figures if figure.label}, **RATE}


def install(trainer, method: str | None = None) -> None:
    """Replace transformers' printing callbacks on ``trainer`` with ``ConsoleCallback`` for ``method``'s lines (a
    notebook's own progress table, where transformers chose one, stays)."""
    for callback in list(trainer.callback_handler.callbacks):
        if type(callback) in (PrinterCallback, ProgressCallback):  # exactly these: a recipe's subclass stays
            trainer.remove_callback(callback)
    if not any(type(cb).__name__ == "NotebookProgressCallback" for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(ConsoleCallback(method=method))


def wants_bar(disable_tqdm: bool | None, stream=None) -> bool:
    """A progress bar only on a terminal, and not when tqdm is turned off (``TQDM_DISABLE``, ``disable_tqdm``)."""
    stream = stream or sys.stderr
    if disable_tqdm or os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class ConsoleCallback(TrainerCallback):
    """One line per log event on stderr (main process only), above a tqdm bar of the steps on a terminal."""

    def __init__(self, stream=None, method: str | None = None, clock: Callable[[], float] = time.monotonic):
        self.stream = stream  # None: sys.stderr as it is when writing (tests and tools swap it)
        self.method = method  # whose headline figures the lines carry
        self.clock = clock  # seconds, for the heartbeat (tests hand their own)
        self.bar = None
        self.eval_bar = None
        self.start_step = 0  # the step training (re)started from: the summary counts this run's steps
        self.started = 0.0  # when training (re)started, by ``clock``
        self.last_line = 0.0  # when the last line was written, by ``clock``

    @property
    def _out(self):
        return self.stream or sys.stderr

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_step = state.global_step
        self.started = self.last_line = self.clock()
        if state.is_world_process_zero and wants_bar(args.disable_tqdm, self._out):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, initial=state.global_step, file=self._out, dynamic_ncols=True,
                            unit="step", leave=False)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)
        if not state.is_world_process_zero:
            return
        now, done = self.clock(), state.global_step - self.start_step
        every = max(int(state.logging_steps or 0), 1)
        logs_now = (args.logging_strategy == "steps" and state.global_step % every == 0) or (
            args.logging_first_step and state.global_step == 1)  # its own line follows this step at once
        if done >= 1 and not logs_now and (done == 1 or now - self.last_line >= HEARTBEAT_SECONDS):
            self._write(heartbeat_line(state.global_step, state.max_steps, done, now - self.started))

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if self.bar is None or not state.is_world_process_zero:
            return
        if self.eval_bar is None:
            try:
                total = len(eval_dataloader)
            except TypeError:
                return
            from tqdm.auto import tqdm

            self.eval_bar = tqdm(total=total, file=self._out, dynamic_ncols=True, unit="batch", desc="eval",
                                 leave=False)
        self.eval_bar.update(1)

    def on_evaluate(self, args, state, control, **kwargs):
        self._close_eval_bar()

    def on_predict(self, args, state, control, **kwargs):
        self._close_eval_bar()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        self._write(format_log(logs, state.global_step, state.max_steps, self.start_step, self.method))

    def on_train_end(self, args, state, control, **kwargs):
        self._close_eval_bar()
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _close_eval_bar(self) -> None:
        if self.eval_bar is not None:
            self.eval_bar.close()
            self.eval_bar = None

    def _write(self, line: str) -> None:
        self.last_line = self.clock()
        if self.bar is not None:
            from tqdm.auto import tqdm

            tqdm.write(line, file=self._out)
        else:
            print(line, file=self._out, flush=True)


def format_log(logs: dict, step: int, max_steps: int, start_step: int = 0, method: str | None = None) -> str:
    """The console line of one log event of a ``method`` run (training, evaluation, or the end-of-training summary)."""
    if all(key in logs for key in SUMMARY_KEYS):
        return _summary_line(logs, step, start_step)
    where = f"step {step:>{len(str(max_steps))}}/{max_steps}" if max_steps else f"step {step}"
    shown = labels(method)
    evaluation = {key[5:]: value for key, value in logs.items() if key.startswith("eval_")}
    if evaluation:
        return f"{where}  eval  {_fields(evaluation, shown, shown_rest=True)}".rstrip()
    return f"{where}  {_fields(logs, shown, shown_rest=False) or _fields(logs, shown, shown_rest=True)}".rstrip()


def heartbeat_line(step: int, max_steps: int, done: int, seconds: float) -> str:
    """``step   1/400  31.2 s/step  left 3h27m``: ``done`` steps of this run took ``seconds``; the time left is the
    steps left at that pace."""
    where = f"step {step:>{len(str(max_steps))}}/{max_steps}" if max_steps else f"step {step}"
    each = seconds / done
    pace = f"{each:.1f} s/step" if each >= 1 else f"{1 / each:.1f} steps/s" if each > 0 else ""
    left = f"  left {_duration(each * (max_steps - step))}" if max_steps and max_steps > step else ""
    return f"{where}  {pace}{left}".rstrip()


def _duration(seconds: float) -> str:
    """3h27m, 12m05s, 42s."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _fields(logs: dict, shown: dict[str, tuple[str, str | None]], *, shown_rest: bool) -> str:
    """``label value`` pairs: the ``shown`` keys in order, then (evaluation) the other metrics by their own names."""
    parts = []
    for key, (label, fmt) in shown.items():
        value = logs.get(key)
        if _number(value):
            parts.append(f"{label} {_rate(value) if fmt is None else fmt.format(value)}")
    if shown_rest:
        for key, value in logs.items():
            if key in shown or key in LABELLED or key in EVAL_HIDDEN or "/" in key or not _number(value):
                continue
            parts.append(f"{key} {value:.4g}")
    return "  ".join(parts)


def _summary_line(logs: dict, step: int, start_step: int) -> str:
    trained = step - start_step
    text = f"trained {trained} step{'s' if trained != 1 else ''}"
    if start_step:
        text += f" (steps {start_step + 1}-{step})"
    text += f" in {logs['train_runtime']:.1f} s"
    if _number(logs.get("train_loss")):
        text += f", mean loss {logs['train_loss']:.3f}"
    return text


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # nan and inf shown as such


def _rate(value: float) -> str:
    """21500 -> 21.5k; 372.4 -> 372; 1.2e6 -> 1.2M."""
    if not math.isfinite(value):
        return str(value)
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"
