"""A stop by signal (SIGTERM, Ctrl-C) taken at a step end, through the Trainer's regular checkpoint save.

transformers' own JIT checkpoint (``trainer_jit_checkpoint``) acts on a flag a timer sets ``kill_wait`` seconds after
SIGTERM, and checks it at three places of a step, one of them after the step's forward and backward and before its
optimizer step. A checkpoint taken there is named for the step before and holds that step's weights, but the random
state after the next step's forward (its dropout masks, NEFTune's noise, GRPO's samples): the resumed run replays
that step with other draws and continues on another trajectory. With several processes the timers also run apart,
and ranks can stop a step apart (one saving while another waits in the next step's all-reduce).

So ft notes the signal itself (``ft.run.signals.StopWatch`` with ``pass_on=False``; the Trainer's JIT callback is
removed as the trainer is built, ``without_transformers_stop``) and ``StopAtStepEnd`` stops training at a step end:
it sets ``should_save`` and ``should_training_stop``, and the Trainer saves ``checkpoint-<step>`` exactly as a
``save_steps`` checkpoint of that step (weights, optimizer, scheduler, every RNG of every rank as of the step's end,
after that step's logging and evaluation), then stops. It stops

- once ``wait`` seconds have passed since the signal (one process: transformers' ``kill_wait``, in case a SIGKILL
  follows at once and there is no time to save), and
- where the trainer carries nothing across steps that a checkpoint does not hold (``FtTrainerMixin.ft_stop_point``:
  GRPO at the end of a generation round, when its buffer of generated completions is used up).

With several processes every rank agrees by an all-reduce at every step end (one integer: the largest signal number
any rank has acted on), so all save the same step.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from transformers import TrainerCallback


def without_transformers_stop(trainer, sigterm_handler) -> None:
    """ft takes a stop by signal itself: the Trainer's JIT checkpoint callback (added for ``enable_jit_checkpoint``,
    which stays set in its arguments) is removed, and the SIGTERM handler that callback installed as the trainer was
    built is replaced by the one in place before (``sigterm_handler``), until ``ft.run.signals.StopWatch`` takes over
    for the training: a SIGTERM before then ends the process, as while the model and data load."""
    from transformers.trainer_jit_checkpoint import JITCheckpointCallback

    if trainer.pop_callback(JITCheckpointCallback) is not None:
        signal.signal(signal.SIGTERM, sigterm_handler)


class StopAtStepEnd(TrainerCallback):
    def __init__(self, watch, stop_point: Callable[[int], bool], wait: float = 0.0, together: bool = False):
        self.watch = watch  # ft.run.signals.StopWatch
        self.stop_point = stop_point  # global step -> whether a checkpoint there holds everything (ft_stop_point)
        self.wait = wait
        self.together = together

    def on_step_end(self, args, state, control, **kwargs):
        received = self.watch.received
        due = received is not None and time.monotonic() - self.watch.received_at >= self.wait
        signum = received if due and self.stop_point(state.global_step) else 0
        if self.together:
            signum = agreed(signum, args.device)  # one integer per optimizer step
        if signum:
            self.watch.received = self.watch.received or signum  # a rank the signal missed stops too
            control.should_save = True
            control.should_training_stop = True
        return control


def agreed(signum: int, device) -> int:
    """The largest of every rank's ``signum`` (0: none), by an all-reduce every rank makes at the same point: what
    each rank acts on, so that all take the same stop (a signal can reach one rank before another, or only one)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([signum], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())
