"""The libraries a command runs on, imported at once with Python's cyclic garbage collector paused, then frozen.

Importing torch, transformers' Trainer, PEFT, accelerate, datasets and TRL creates some 700,000 objects. While they
are created the collector runs again and again, and each full collection walks every object created so far; each
full collection later in the run (accelerate runs one itself as the trainer is built) walks them all again. Together
about 2 s of the 13-14 s of CPU a fresh one-step ``ft train`` of a tiny model takes on a 2-core machine
(benchmarks/train_startup.py measures it). ``import_stack`` imports them with collections paused and then freezes
what exists (``gc.freeze``: left out of every later collection, what fork servers do before they fork), so the
imports cost no collections and later collections walk only what the command creates itself. Reference counting
still frees whatever is dropped; the only cost is that reference cycles among the frozen objects (modules, classes,
functions: they live as long as the process) are never collected, the imports' own leftovers among them (some
thousands of small objects).

Called by the CLI in the process that does the work (a rank, or the one process), never by ``ft.run.train.train``
itself: programs that drive ft in their own long-lived processes (a test session, a notebook) keep their collector
as they set it. ft's launcher of several processes does not call it: it imports torch's elastic agent alone, and the
ranks import the rest. Importing early changes nothing else: each library would be imported by the command anyway,
and what must precede an import is done first (bitsandbytes before PEFT: ``ft.model.bnb_import``; the trackers'
folders are set before TRL's trainers, which are not imported here).
"""

from __future__ import annotations

import gc
import importlib

from ..model import bnb_import
from ..recipe import Recipe

# what ``ft train`` imports before its first step: transformers' trainer module imports PEFT and accelerate
TRAINING = ("torch", "transformers.trainer", "datasets", "trl")


def import_stack(modules: tuple[str, ...], recipe: Recipe | None = None) -> None:
    """Import ``modules`` with collections paused, then freeze every object alive and resume collections. With
    ``recipe`` (a run's), bitsandbytes is imported first as that run needs it (``bnb_import``). Collections stay
    paused or frozen as the caller left them if it paused them itself."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if recipe is not None:
            bnb_import.import_bitsandbytes(uses_it=bnb_import.uses_bitsandbytes(recipe))
        for name in modules:
            importlib.import_module(name)
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()
