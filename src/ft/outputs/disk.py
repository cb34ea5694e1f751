"""The disk under the output directory: foreseen before each save, and named when it fills anyway.

A checkpoint written onto a full disk fails half way ("[enforce fail at inline_container.cc] unexpected pos …" from
torch's writer, or ``OSError: [Errno 28] No space left on device``), leaves a half-written folder, and summary.json
cannot be written either. ``DiskGuard`` compares the free space with the size of the newest complete checkpoint
before each save (before the first, with ``ft plan``'s figure: trained weights plus optimizer state) and stops
training cleanly at that step end instead of saving, leaving the last complete checkpoint to resume from.
``explain`` turns a failure that is a full disk into a ``DiskFull`` message: the device, the bytes free, the
checkpoint being written (removed: it cannot be resumed from, and it holds the space), the last complete one, and the
command that resumes.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from ..errors import FtError
from ..units import human
from .checkpoints import FINAL, FINAL_WRITING, RESERVE, complete_checkpoints

MARGIN = 1.2  # free space wanted per checkpoint: its size and a fifth more (trainer state, RNG files, a grown state)
RESERVE_BYTES = 256 * 2**10  # held for the record of a failure: summary.json and error.log (see hold_reserve)
_FULL = re.compile(r"No space left on device|unexpected pos \d+ vs \d+|file write failed")  # torch's writer too


class DiskFull(FtError, exit_code=1):
    """The output directory's disk is full, or too full for the next checkpoint (exit code 1). The message is for the
    user."""


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding ``path`` (its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def size_of(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def hold_reserve(output_dir: Path, size: int = RESERVE_BYTES) -> None:
    """Keep ``size`` bytes of the output directory's disk in a file of their own (``.ft-reserve``), freed by
    ``free_reserve`` when the run fails, before it writes summary.json and error.log: a disk another program filled
    still takes the record of why the run ended. Where even that does not fit, there is no reserve (the run is told of
    the full disk when it writes)."""
    path = output_dir / RESERVE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:  # pragma: no cover - macOS: the blocks written
                os.pwrite(fd, bytes(size), 0)
        finally:
            os.close(fd)
    except OSError:
        path.unlink(missing_ok=True)


def free_reserve(output_dir: Path) -> None:
    """The reserve ``hold_reserve`` kept, given back to the disk (at a failure, and when the run ends)."""
    (output_dir / RESERVE).unlink(missing_ok=True)


def write_whole(path: Path, text: str) -> Path:
    """``text`` into ``path``, whole or not at all: written under a temporary name beside it, flushed to the disk,
    then renamed over it (``os.replace``, atomic on one filesystem). A full disk or a kill mid-write leaves the
    previous version (or no file), never one cut short; the temporary file is removed when the write fails."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.writing")
    try:
        with open(temporary, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def start_warning(output_dir: Path, checkpoint_bytes: float, kept: int | None) -> str | None:
    """A warning when the free space will not hold the checkpoints the run keeps (one more while the next is written
    and the oldest not yet removed), by ``ft plan``'s size of one; None when it will."""
    if checkpoint_bytes <= 0:
        return None
    free = free_bytes(output_dir)
    count = (kept + 1) if kept else None
    need = checkpoint_bytes * MARGIN * (count or 2)
    if free >= need:
        return None
    keeping = f"keeps {kept} (and writes the next before removing the oldest)" if kept else \
        "keeps every checkpoint (train.save_total_limit is unset)"
    return (f"ft: warning: {human(free)} free on the disk of {output_dir}; a checkpoint is about "
            f"{human(checkpoint_bytes)} (ft plan: trained weights and optimizer state) and the run {keeping}, so the "
            "disk may fill before the run ends. ft stops cleanly before a save that would not fit; to avoid that, free "
            "space, set train.output_dir on a larger disk, or lower train.save_total_limit.")


def explain(exc: BaseException, output_dir: Path, command: str, final: bool = False) -> DiskFull | None:
    """A ``DiskFull`` for a failure that is a full disk (anywhere in the exception's chain), else None. What was being
    written is removed (a half-written checkpoint cannot be resumed from, and it holds the space a resume needs):
    ``final/`` when ``final`` (training had ended: its temporary folder, and a ``final/`` it was to replace), else the
    checkpoint folders that are not complete."""
    seen, current = [], exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    if not any((isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or _FULL.search(str(e))
               for e in seen):
        return None
    complete = complete_checkpoints(output_dir)
    partial = [output_dir / FINAL_WRITING, output_dir / FINAL] if final else [
        p for p in output_dir.glob("checkpoint-*") if p.is_dir() and p not in complete]
    for folder in partial:
        shutil.rmtree(folder, ignore_errors=True)
    writing = f"{FINAL}/" if final else ", ".join(p.name + "/" for p in partial) or "a file of the run"
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return DiskFull(
        f"the disk holding {output_dir} is full: writing {writing} failed ({type(exc).__name__}: {first}); "
        f"{human(free_bytes(output_dir))} free after removing what was half-written. " + _resume(complete, command))


def _resume(complete: list[Path], command: str) -> str:
    if complete:
        return (f"The last complete checkpoint is {complete[-1].name}. Free space on that disk, then run the same "
                f"command, which resumes from it: {command}")
    return f"No checkpoint is complete. Free space on that disk (or set train.output_dir on a larger one), then run: " \
        f"{command}"


class DiskGuard:
    """A TrainerCallback (the class is made by ``guard``, importing transformers only in ``ft train``): before each
    save, the free space against the newest complete checkpoint's size (or ``first_bytes`` before the first); when
    it falls short, the save is skipped and training stops at this step end, and ``refused`` says why.

    On several processes every one asks, and they agree (``agree``: the largest of every process's answer, by a
    collective each makes at the same step end): the disks they see may differ (a node's own disk) or change between
    two of them asking, and a process that stopped while another went on would leave that one waiting in the next
    step's all-reduce until the collective timeout."""

    def __init__(self, output_dir: Path, first_bytes: float, command: str,
                 agree: Callable[[int, object], int] | None = None):
        self.output_dir, self.first_bytes, self.command, self.agree = output_dir, first_bytes, command, agree
        self.refused: str | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if not control.should_save:
            return control
        complete = complete_checkpoints(self.output_dir)
        size = size_of(complete[-1]) if complete else self.first_bytes
        free = free_bytes(self.output_dir)
        short = bool(size and free < size * MARGIN)
        if not (self.agree(int(short), args.device) if self.agree is not None else short):
            return control
        control.should_save, control.should_training_stop = False, True
        step = state.global_step
        if short:
            basis = f"the size of {complete[-1].name}" if complete else "ft plan's size of one"
            why = (f"the disk holding {self.output_dir} has {human(free)} free and a checkpoint needs about "
                   f"{human(size * MARGIN)} ({basis}, and a fifth more), so it would be written half way")
        else:
            why = "another process found too little free space on the disk it saves to (its own line says which)"
        self.refused = f"stopped at step {step} before saving checkpoint-{step}: {why}. " + _resume(complete,
                                                                                                  self.command)
        return control


def guard(output_dir: Path, first_bytes: float, command: str, agree: Callable[[int, object], int] | None = None):
    """A ``DiskGuard`` that is a transformers TrainerCallback."""
    from transformers import TrainerCallback

    class _Guard(DiskGuard, TrainerCallback):
        pass

    return _Guard(output_dir, first_bytes, command, agree)
