"""Where a run resumes from: the newest complete checkpoint, a path, or nothing (and then not on top of another run).

``--resume never`` into a directory that holds another run's checkpoints, ``final/`` or summary is refused unless
``--overwrite`` clears them first: a fresh run would leave the old run's higher-numbered checkpoints in place, where
a later ``--resume auto`` would pick them up. How a run stops by signal is in ``ft.run.signals``.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

from ..recipe.redact import REDACTED, SECRET_KEY

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


def previous_run(output_dir: Path) -> list[str]:
    """What another run left in ``output_dir`` (its checkpoints, ``final/``, ``summary.json``), by name. The summary
    of a run that failed before any checkpoint or ``final/`` is not counted: a new run has nothing to mix with."""
    names = sorted((p.name for p in output_dir.glob("checkpoint-*") if p.is_dir()), key=_step)
    names += ["final"] if (output_dir / "final").exists() else []
    summary = output_dir / "summary.json"
    return names + (["summary.json"] if summary.exists() and (names or _status(output_dir) != "failed") else [])


def clear_previous_run(output_dir: Path) -> None:
    """Delete what a run writes in ``output_dir`` (``--overwrite``); files of the user's own stay."""
    names = ("final", "plots", "summary.json", "log_history.json", "recipe.yaml",
             "tb", "trackio")  # the trackers' folders under output_dir (ft.trainers.trackers.LOCAL_DIRS)
    for path in [*output_dir.glob("checkpoint-*"), *output_dir.glob("error*.log"),
                 *(output_dir / name for name in names)]:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def resolve_resume(mode: str, output_dir: Path, overwrite: bool = False) -> str | None:
    """``auto``: the newest complete checkpoint, if any (an error when the run there already completed);
    ``never``: start fresh, where no other run is (or after clearing it, with ``overwrite``); else a path."""
    if overwrite:
        if mode not in ("auto", "never"):
            raise ResumeError(f"--overwrite deletes the run in {output_dir} and starts over, so it cannot resume from "
                              f"{mode}; drop one of the two.")
        clear_previous_run(output_dir)
        return None
    if mode == "never":
        found = previous_run(output_dir)
        if found:
            shown = ", ".join(found[:4]) + (", …" if len(found) > 4 else "")
            raise ResumeError(f"--resume never: {output_dir} holds another run ({shown}); a new run there would mix "
                              "with it (a later --resume auto would pick up its checkpoints). Add --overwrite to "
                              "delete them first, or set train.output_dir to a new directory.")
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


def _step(name: str) -> int:
    match = re.fullmatch(r"checkpoint-(\d+)", name)
    return int(match.group(1)) if match else -1


def resume_command(argv: list[str], parent_cmdline: Path | None = None) -> str:
    """The command that resumes this run, quoted for a shell: the command that started it, without ``--resume``
    (``auto``, the default, picks the newest complete checkpoint) and ``--overwrite`` (which would delete it), and
    with the values of credential-named ``--set`` keys redacted (it is printed and saved in summary.json).
    Under torchrun (``parent_cmdline``: the launcher's /proc/<pid>/cmdline) the launcher's command line is used."""
    if parent_cmdline is not None:
        try:
            argv = [part.decode() for part in parent_cmdline.read_bytes().split(b"\0") if part]
        except OSError:
            argv = ["torchrun", "…", "-m", "ft", *argv[1:]]
    else:
        argv = ["ft", *argv[1:]]
    kept, skip = [], False
    for part in argv:
        if skip:
            skip = False
        elif part == "--resume":
            skip = True
        elif part != "--overwrite" and not part.startswith("--resume="):
            kept.append(_redacted(part) if kept and kept[-1] == "--set" else part)
    return shlex.join(kept)


def _redacted(assignment: str) -> str:
    key, sep, _ = assignment.partition("=")
    return f"{key}={REDACTED}" if sep and SECRET_KEY.search(key.rpartition(".")[2]) else assignment


def _completed(output_dir: Path) -> bool:
    return _status(output_dir) == "completed"


def _status(output_dir: Path) -> str | None:
    """The ``status`` of ``output_dir``'s summary.json; None when there is none (or it cannot be read)."""
    try:
        return json.loads((output_dir / "summary.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None
