"""Where a run resumes from, and whether it stopped for a JIT checkpoint.

Preemption: with ``train.enable_jit_checkpoint`` (on unless the recipe turns it off), transformers answers
SIGTERM by saving ``checkpoint-<step>`` at the next step boundary and ending training. ``SigtermWatch``
records that the signal came, so ft can tell that stop from a finished run (or an early-stopped one): it
then writes no ``final/``, marks the summary ``stopped`` and exits 143.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

INCOMPLETE_MARKER = "checkpoint-is-incomplete.txt"  # written by transformers while a JIT save runs


class ResumeError(Exception):
    pass


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """``checkpoint-N`` folders that finished writing, oldest first.

    transformers writes ``trainer_state.json`` last (after weights, optimizer, scheduler and RNG states) and marks
    a JIT save in progress with ``INCOMPLETE_MARKER``: a folder counts when its state file is there, whole (a
    kill during that very write leaves it truncated) and no marker is left.
    """
    found = []
    for path in output_dir.glob("checkpoint-*"):
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if match and path.is_dir() and _state_readable(path) and not (path / INCOMPLETE_MARKER).exists():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def _state_readable(checkpoint: Path) -> bool:
    try:
        return isinstance(json.loads((checkpoint / "trainer_state.json").read_text()), dict)
    except (OSError, ValueError):
        return False


# ft turns transformers' JIT checkpointing on unless the recipe sets ``train.enable_jit_checkpoint`` (a default:
# it fills only what the recipe left unset, see ft.trainers.build)
JIT_DEFAULT = {"enable_jit_checkpoint": True}


def resolve_resume(mode: str, output_dir: Path) -> str | None:
    """``auto``: the newest complete checkpoint, if any (an error when the run there already completed);
    ``never``: start fresh; else a path."""
    if mode == "never":
        return None
    if mode == "auto":
        if _completed(output_dir):
            raise ResumeError(f"{output_dir} already holds a completed run ({output_dir / 'summary.json'} says "
                              "`completed`; its model is in final/). To train it again from the start into the "
                              "same folder pass `--resume never`; to keep it, set `train.output_dir` elsewhere.")
        found = complete_checkpoints(output_dir)
        return str(found[-1]) if found else None
    path = Path(mode)
    if not (path / "trainer_state.json").exists():
        raise ResumeError(f"--resume {mode}: not a complete checkpoint folder (no trainer_state.json there); "
                          "pass a checkpoint-N folder, `auto` or `never`.")
    return str(path)


def _completed(output_dir: Path) -> bool:
    try:
        return json.loads((output_dir / "summary.json").read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        return False


class SigtermWatch:
    """While open, notes a SIGTERM. With ``pass_on`` it then calls the handler installed before (transformers' JIT
    checkpoint handler, or the default one, which ends the process as usual); without, the signal is only noted,
    for ``ft.trainers.preemption.StopTogether`` to act on in step with the other processes."""

    def __init__(self, pass_on: bool = True):
        self.received = False
        self.pass_on = pass_on
        self._previous = None

    def __enter__(self):
        self._previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        self.received = True
        if not self.pass_on:
            return
        if callable(self._previous):
            self._previous(signum, frame)
        elif self._previous != signal.SIG_IGN:  # the default action: end the process, killed by the signal
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def __exit__(self, *exc):
        if signal.getsignal(signal.SIGTERM) == self._handle:  # transformers may have restored its own already
            signal.signal(signal.SIGTERM, self._previous)
        return False


def stopped_by_sigterm(global_step: int, max_steps: int, sigterm: bool) -> bool:
    """True when training ended early after a SIGTERM: transformers then saved a JIT checkpoint (at the step
    boundary it reached: ``checkpoint-<global_step>``, or the step before when the signal was acted on just before
    an optimizer step). A SIGTERM in the last moments of a run that still reached ``max_steps`` leaves it
    completed."""
    return sigterm and global_step < max_steps
