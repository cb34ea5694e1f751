"""A stop by signal (SIGTERM, Ctrl-C) agreed by every process of a multi-process run.

transformers' JIT checkpoint acts on a timer started in each process when that process gets SIGTERM, so ranks can
stop one step apart: one saves ``checkpoint-N`` while another is still in step N+1's all-reduce (a hang, or a
checkpoint missing a rank's state). With several processes ft therefore notes the signal itself
(``ft.run.signals.StopWatch`` with ``pass_on=False``) and, at every step end, all ranks agree by an all-reduce whether
any of them got one; if so they all save the same ``checkpoint-<step>`` through the Trainer's regular save and stop.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from transformers import TrainerCallback


class StopTogether(TrainerCallback):
    def __init__(self, watch):
        self.watch = watch  # ft.run.signals.StopWatch

    def on_step_end(self, args, state, control, **kwargs):
        flag = torch.tensor([self.watch.received or 0], device=args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # one integer per optimizer step: the largest signal number
        if flag.item():
            self.watch.received = self.watch.received or int(flag.item())  # a rank the signal missed stops too
            control.should_save = True
            control.should_training_stop = True
        return control
