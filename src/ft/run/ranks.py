"""Several processes of one run (``torchrun`` / ``accelerate launch``, which set RANK and WORLD_SIZE): which one
speaks and writes the run's files, and shared work done by the main process first.

Every process runs ``ft train`` whole; the Trainer (through accelerate) does the data-parallel part. What ft
adds around it, recipe.yaml, summary.json, plots and its messages, comes from the main process only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_world_size() -> int | None:
    """The run's process count when this process is one rank of it (torchrun, accelerate and ``ft train
    --num-processes`` set WORLD_SIZE for each rank); None in a process no launcher started."""
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def rank() -> int:
    """This process's global rank (RANK, set by the launcher; 0 in a process no launcher started)."""
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


@contextlib.contextmanager
def main_process_first(cpu: bool):
    """The main process runs the block (e.g. builds and caches the prepared dataset) while the others wait; then
    they run it (and find the cache). A no-op with one process."""
    if world_size() == 1:
        yield
        return
    from accelerate import PartialState

    with PartialState(cpu=cpu).main_process_first():
        yield


def exit_without_finalizing(code: int) -> None:
    """End this process of a multi-process run with ``code``, without Python's interpreter finalization.

    Why: torch's gloo backend keeps worker threads that may still hold the last collective's work when the main
    thread exits. Releasing it frees a tensor, which needs the GIL; a thread that asks for the GIL while the
    interpreter finalizes is ended inside a C++ destructor, and the process aborts ("terminate called without an
    active exception", SIGABRT; pytorch/pytorch#190489). ``destroy_process_group`` does not join those workers
    once DistributedDataParallel has held the group. So ft runs the exit handlers itself (loggers, trackers,
    temporary folders: what a normal exit would run, while every thread can still take the GIL), flushes its
    output and leaves with ``os._exit``, which ends the threads without running their destructors.
    ``scripts/gloo_exit_race.py`` reproduces the abort and shows this path free of it.
    """
    atexit._run_exitfuncs()  # the handlers Python would run at exit (a stdlib function since Python 2)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
