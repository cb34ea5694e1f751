"""Stopping a run by signal: SIGTERM (preemption, ``docker stop``, ``kill``) and SIGINT (Ctrl-C).

With ``train.enable_jit_checkpoint`` (on unless the recipe turns it off), ``StopWatch`` notes the signal and when it
came (``pass_on=False``), and ``ft.trainers.preemption.StopAtStepEnd`` stops training at a step end with a regular
checkpoint of that step: one process waits ``jit_kill_wait`` seconds first, as transformers' JIT checkpoint does (a
SIGKILL that follows at once means there is no time to save); several processes agree on the step instead.
transformers' own JIT handler is not called: ``trainers.preemption`` says why. ft can then tell that stop from a
finished (or early-stopped) run: it writes no ``final/``, marks the summary ``stopped`` and exits 128 + the signal's
number (143 for SIGTERM, 130 for SIGINT).

- The first Ctrl-C is treated as a SIGTERM (the same checkpoint, the same wait); with JIT checkpointing off
  (``pass_on=True``) there is nothing to save: SIGTERM takes its default action and Ctrl-C ends the run at once.
- A second Ctrl-C ends the process at once. A checkpoint being written then stays incomplete (no
  ``trainer_state.json``, which transformers writes last) and ``--resume auto`` passes over it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code(signum: int) -> int:
    """The shell's status for a process ended by ``signum`` (143 for SIGTERM, 130 for SIGINT)."""
    return 128 + signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def jit_kill_wait() -> int:
    """Seconds transformers' JIT checkpoint waits after SIGTERM before it saves (``CheckpointManager``'s
    ``kill_wait``): ft waits as long before it stops one process."""
    import inspect

    from transformers.trainer_jit_checkpoint import CheckpointManager

    return inspect.signature(CheckpointManager).parameters["kill_wait"].default


class StopWatch:
    """While open, notes the first stop signal (``received``: its number, or None; ``received_at``: when, on the
    monotonic clock) and acts on it as above."""

    def __init__(self, pass_on: bool = True, resume_hint: str = ""):
        self.received: int | None = None
        self.received_at: float | None = None
        self.pass_on = pass_on
        self.resume_hint = resume_hint  # printed when a second Ctrl-C ends the process at once
        self._interrupts = 0
        self._previous: dict[int, object] = {}

    def __enter__(self):
        for signum, handler in ((signal.SIGTERM, self._on_sigterm), (signal.SIGINT, self._on_sigint)):
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, handler)
        return self

    def _note(self, signum: int) -> None:
        if self.received is None:
            self.received, self.received_at = signum, time.monotonic()

    def _on_sigterm(self, signum, frame):
        self._note(signum)
        if self.pass_on:
            self._pass_on_sigterm(frame)

    def _on_sigint(self, signum, frame):
        self._interrupts += 1
        if self._interrupts > 1:
            self._end_now()
        self._note(signum)
        if self.pass_on and not self._pass_on_sigterm(frame, end_if_default=False):
            self._end_now()  # JIT checkpointing is off: nothing would be saved, so there is nothing to wait for

    def _pass_on_sigterm(self, frame, end_if_default: bool = True) -> bool:
        """Call the SIGTERM handler installed before (a program's own); True if there was one. With none, SIGTERM's
        default action (ending the process, killed by the signal) when ``end_if_default``."""
        previous = self._previous[signal.SIGTERM]
        if callable(previous):
            previous(signal.SIGTERM, frame)
            return True
        if end_if_default and previous != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        return False

    def _end_now(self) -> None:
        print(f"\nft: interrupted; stopped at once without a new checkpoint. {self.resume_hint}", file=sys.stderr,
              flush=True)
        os._exit(exit_code(signal.SIGINT))

    def __exit__(self, *exc):
        """Put back the handlers from before; but after a stop taken at a step end (``pass_on`` off), SIGTERM stays
        ignored for the rest of the process. It is ending with that stop (its summary, exit 143), and on several
        processes torch's launcher stops a node's remaining ranks with SIGTERM once one has exited non-zero: with the
        default action, a rank still writing its summary was killed by it (and its launcher took the run for failed)."""
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) in (self._on_sigterm, self._on_sigint):  # transformers may have restored its
                stopping = signum == signal.SIGTERM and self.received is not None and not self.pass_on
                signal.signal(signum, signal.SIG_IGN if stopping else previous)
        return False


class StoppedBeforeTraining(BaseException):
    """A stop signal came before the first step (``StopsBeforeTraining``). A BaseException, as KeyboardInterrupt is:
    code that catches ``Exception`` to carry on (a cache that cannot be written) does not swallow the stop."""

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum


class StopsBeforeTraining:
    """While open (the machine checks, the data, the model, the baseline scores: nothing to checkpoint yet), SIGTERM
    and SIGINT raise ``StoppedBeforeTraining`` in the main thread where Python next runs, so the run ends with a
    message and a summary instead of the bare exit 143 (or a KeyboardInterrupt traceback) that the default handlers
    give. The handlers before are put back as it closes.

    Python can lose that raise: where the handler runs inside a ``__del__`` (a garbage collection during an import:
    regex's ``SetBase.__del__``, found by the moments check), a weakref callback or library code that catches
    ``BaseException``, it is printed as "Exception ignored" or swallowed, and the run went on to train as if never
    signalled. So the signal is also noted (``received``): ``check`` raises for a noted one (the run calls it as each
    phase begins), and the block raises it as it closes."""

    def __enter__(self):
        self.received: int | None = None
        self._previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._raise)
        return self

    def _raise(self, signum, frame):
        self.received = self.received or signum
        raise StoppedBeforeTraining(signum)

    def check(self) -> None:
        """Raise ``StoppedBeforeTraining`` for a stop signal noted since the block opened (its raise may be lost)."""
        if self.received is not None:
            raise StoppedBeforeTraining(self.received)

    def __exit__(self, exc_type, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if exc_type is None:
            self.check()
        return False


def hold_stops() -> None:
    """Ignore SIGTERM and SIGINT from here until the process exits, once what is left only reports how the run ended:
    ``ft``'s own exit after the run has said so (``cli._ending``), and a rank of several failing because another rank
    is gone, whose report (summary.json, the paragraph naming the lost rank and its step) must not be cut short by the
    SIGTERM torch's elastic agent sends the remaining ranks once it sees one end (its monitor looks every
    ``monitor_interval``, 0.5 s; under load that came first, and the rank died of it with nothing said: found by
    tests/test_launch.py in CI)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)


def stopped_early(global_step: int, max_steps: int, received: int | None) -> bool:
    """True when training ended early after a stop signal: ``checkpoint-<global_step>`` was then saved at the step end
    it stopped at. A signal in the last moments of a run that still reached ``max_steps`` leaves it completed."""
    return received is not None and global_step < max_steps
