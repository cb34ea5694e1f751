"""Several processes of one run (``torchrun`` / ``accelerate launch``, which set RANK and WORLD_SIZE): which one
speaks and writes the run's files, and shared work done by the main process first.

Every process runs ``ft train`` whole; the Trainer (through accelerate) does the data-parallel part. What ft
adds around it, recipe.yaml, summary.json, plots and its messages, comes from the main process only.
"""

from __future__ import annotations

import contextlib
import os


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


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
