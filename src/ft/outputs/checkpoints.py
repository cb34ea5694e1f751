"""Where a run resumes from: the newest complete checkpoint that reads back, a path, or nothing (and then not on top of
another run).

``--resume never`` into a directory that holds another run's checkpoints, ``final/`` or summary is refused unless
``--overwrite`` clears them first: a fresh run would leave the old run's higher-numbered checkpoints in place, where
a later ``--resume auto`` would pick them up. How a run stops by signal is in ``ft.run.signals``.

A checkpoint that finished writing can still be damaged later (a disk or copy fault). Before a run resumes, the files
resuming reads are checked to read back (``unreadable_files``); ``--resume auto`` passes over a damaged checkpoint,
naming the file and what is wrong, to the newest one that reads back.

``final/`` is written as ``final.writing/`` and renamed when whole (``ft.run.train``), so a kill or a full disk never
leaves a ``final/`` cut short; one damaged later, or written cut short by an older ft, is judged by the weights it
holds (``final_problem``). A completed run whose ``final/`` does not read back resumes from its newest checkpoint,
which writes ``final/`` again (from the last step's checkpoint, without training: ``ft.run.train``).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import FtError
from ..recipe.errors import first_line
from ..recipe.redact import redact_arguments

INCOMPLETE_MARKER = "checkpoint-is-incomplete.txt"  # written by transformers while a JIT save runs
FINAL = "final"  # the trained model, in the output directory
FINAL_WRITING = "final.writing"  # final/ while it is written; renamed to final/ when whole
RESERVE = ".ft-reserve"  # disk space a run keeps for the record of its failure (ft.outputs.disk.hold_reserve)


class ResumeError(FtError):
    pass


@dataclass(frozen=True)
class Unreadable:
    """A file of a checkpoint that does not read back, and what is wrong with it."""

    checkpoint: str
    file: str
    problem: str

    def render(self) -> str:
        return f"{Path(self.checkpoint) / self.file}: {self.problem}"

    def as_dict(self) -> dict:
        return {"checkpoint": self.checkpoint, "file": self.file, "problem": self.problem}


@dataclass(frozen=True)
class Resume:
    """The checkpoint a run resumes from (None: a fresh start), the newer ones passed over as damaged, and what is
    wrong with a completed run's ``final/`` that is to be written again from it."""

    path: str | None
    passed_over: tuple[Unreadable, ...] = ()
    final_problem: str | None = None


# torch archives (optimizer, scheduler, RNG states) up to this size are read whole to check every member's CRC; a
# larger one (the optimizer state of a large model) has its archive directory checked, which a cut-short file lacks
CRC_CHECKED_BYTES = 256 * 2**20


def unreadable_files(checkpoint: Path) -> list[tuple[str, str]]:
    """(file name, what is wrong) for each file of ``checkpoint`` that resuming reads and that does not read back:
    ``trainer_state.json`` (whole JSON), weights in safetensors (the header and the file covering every tensor it
    lists; safetensors keeps no checksum, so flipped bits inside a tensor go unseen), and torch archives (optimizer,
    scheduler, scaler and RNG states; ``pytorch_model.bin``). Files a checkpoint does not have are not judged (the
    trainer says what it misses); sharded FSDP and DeepSpeed states in sub-folders are not read here."""
    found = []
    if not _state_readable(checkpoint):
        found.append(("trainer_state.json", "is not a whole JSON object (cut short or damaged)"))
    for path in sorted(p for p in checkpoint.iterdir() if p.is_file()):
        if path.suffix == ".safetensors":
            problem = _safetensors_problem(path)
        elif path.suffix in (".pt", ".pth") or path.name == "pytorch_model.bin":
            problem = _torch_archive_problem(path)
        else:
            continue
        if problem:
            found.append((path.name, problem))
    return found


def _safetensors_problem(path: Path) -> str:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt"):
            return ""
    except Exception as exc:  # safetensors' own error: a header cut short, a file that does not cover its tensors
        return f"does not read back as safetensors ({first_line(exc)})"


def _torch_archive_problem(path: Path) -> str:
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip() if path.stat().st_size <= CRC_CHECKED_BYTES else None
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        return f"is not a whole torch archive ({first_line(exc)})"
    return f"its part {bad} fails its checksum (damaged)" if bad else ""


def final_problem(final: Path) -> str | None:
    """What is wrong with a ``final/`` folder, or None when it holds a model that reads back: weights in safetensors
    (a sharded model: every shard its index lists) or a torch archive, each checked as a checkpoint's are
    (``unreadable_files``), and a ``config.json`` or ``adapter_config.json``."""
    if not final.is_dir():
        return "is missing"
    weights = sorted(p for p in final.iterdir() if p.is_file() and (
        p.suffix == ".safetensors" or (p.name.startswith("pytorch_model") and p.suffix == ".bin")))
    for index in sorted(final.glob("*.index.json")):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"{index.name} is not a whole index of the weights (cut short or damaged)"
        missing = sorted(name for name in shards if not (final / name).is_file())
        if missing:
            return f"{missing[0]}, listed in {index.name}, is missing"
    if not weights:
        return "holds no weights file (model.safetensors, adapter_model.safetensors or pytorch_model.bin)"
    for path in weights:
        problem = _safetensors_problem(path) if path.suffix == ".safetensors" else _torch_archive_problem(path)
        if problem:
            return f"{path.name} {problem}"
    if not (final / "config.json").is_file() and not (final / "adapter_config.json").is_file():
        return "holds no config.json (nor adapter_config.json)"
    return None


def _in_final(problem: str) -> str:
    """``final_problem``'s text after the folder's name: ``final/ is missing``, ``final/model.safetensors does …``."""
    return f"{FINAL}/ {problem}" if problem.startswith(("is ", "holds ")) else f"{FINAL}/{problem}"


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """``checkpoint-N`` folders that finished writing, oldest first.

    transformers writes ``trainer_state.json`` last (after weights, optimizer, scheduler and RNG states) and marks
    a JIT save in progress with ``INCOMPLETE_MARKER``: a folder counts when its state file is there, whole (a
    kill during that very write leaves it truncated) and no marker is left.
    """
    return [path for path in _saved(output_dir) if _state_readable(path)]


def _saved(output_dir: Path) -> list[Path]:
    """``checkpoint-N`` folders whose save got as far as ``trainer_state.json`` (whole or not) and left no in-progress
    marker, oldest first."""
    found = [(_step(path.name), path) for path in output_dir.glob("checkpoint-*")]
    return [path for step, path in sorted(found) if step >= 0 and path.is_dir()
            and (path / "trainer_state.json").is_file() and not (path / INCOMPLETE_MARKER).exists()]


def _state_readable(checkpoint: Path) -> bool:
    try:
        return isinstance(json.loads((checkpoint / "trainer_state.json").read_text()), dict)
    except (OSError, ValueError):
        return False


# ft turns checkpointing on SIGTERM on unless the recipe sets ``train.enable_jit_checkpoint`` (a default: it fills only
# what the recipe left unset, see ft.trainers.build); ft takes that stop itself, at a step end (ft.trainers.preemption)
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
    names = (FINAL, FINAL_WRITING, RESERVE, "plots", "summary.json", "log_history.json", "recipe.yaml",
             "exact_match.jsonl", "tb", "trackio")  # tb, trackio: the trackers' (ft.machine.trackers.LOCAL_DIRS)
    for path in [*output_dir.glob("checkpoint-*"), *output_dir.glob("error*.log"),
                 *(output_dir / name for name in names)]:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def resolve_resume(mode: str, output_dir: Path, overwrite: bool = False) -> Resume:
    """``auto``: the newest complete checkpoint that reads back, if any (an error when the run there already
    completed with a ``final/`` that reads back, or when no checkpoint reads back; a completed run whose ``final/``
    does not read back resumes from its newest checkpoint, which writes it again); ``never``: start fresh, where no
    other run is (or after clearing it, with ``overwrite``); else a path, which must read back."""
    if overwrite:
        if mode not in ("auto", "never"):
            raise ResumeError(f"--overwrite deletes the run in {output_dir} and starts over, so it cannot resume from "
                              f"{mode}; drop one of the two.")
        clear_previous_run(output_dir)
        return Resume(None)
    if mode == "never":
        found = previous_run(output_dir)
        if found:
            shown = ", ".join(found[:4]) + (", …" if len(found) > 4 else "")
            raise ResumeError(f"--resume never: {output_dir} holds another run ({shown}); a new run there would mix "
                              "with it (a later --resume auto would pick up its checkpoints). Add --overwrite to "
                              "delete them first, or set train.output_dir to a new directory.")
        return Resume(None)
    if mode == "auto":
        if not _completed(output_dir):
            return _newest_that_reads_back(output_dir)
        problem = final_problem(output_dir / FINAL)
        if problem is None:
            raise ResumeError(f"{output_dir} already holds a completed run ({output_dir / 'summary.json'} says "
                              "`completed`; its model is in final/). To train it again from the start in the same "
                              "folder, deleting that run, add `--resume never --overwrite`; to keep it, set "
                              "`train.output_dir` elsewhere.")
        found = _newest_that_reads_back(output_dir)
        if found.path is None:
            raise ResumeError(f"{output_dir} holds a completed run whose {_in_final(problem)}, and no checkpoint to "
                              "write it again from. Restore final/ from a copy, or train the run again: `--resume "
                              "never --overwrite` (deletes the run there) or another `train.output_dir`.")
        return Resume(found.path, found.passed_over, _in_final(problem))
    path = Path(mode)
    if not (path / "trainer_state.json").exists():
        raise ResumeError(f"--resume {mode}: not a complete checkpoint folder (no trainer_state.json there); "
                          "pass a checkpoint-N folder, `auto` or `never`.")
    damaged = unreadable_files(path)
    if damaged:
        listed = "; ".join(f"{name} {problem}" for name, problem in damaged)
        raise ResumeError(f"--resume {mode}: the checkpoint does not read back: {listed}. Pass another checkpoint-N "
                          "folder, or `--resume auto` (the newest one that reads back).")
    return Resume(str(path))


def _newest_that_reads_back(output_dir: Path) -> Resume:
    """The newest finished checkpoint whose files read back, and the damaged newer ones passed over. Folders whose
    save did not finish (no trainer_state.json, or transformers' in-progress marker) are passed over as before."""
    passed_over: list[Unreadable] = []
    for path in reversed(_saved(output_dir)):
        damaged = unreadable_files(path)
        if not damaged:
            return Resume(str(path), tuple(passed_over))
        passed_over += [Unreadable(str(path), name, problem) for name, problem in damaged]
    if passed_over:
        listed = "\n".join(f"  - {item.render()}" for item in passed_over)
        raise ResumeError(f"--resume auto: no checkpoint in {output_dir} reads back:\n{listed}\nRestore the damaged "
                          "files (from a copy of the output directory), or start over: `--resume never --overwrite` "
                          "(deletes the run there) or another `train.output_dir`.")
    return Resume(None)


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
            kept.append(part)
    return shlex.join(redact_arguments(kept))


def _completed(output_dir: Path) -> bool:
    return _status(output_dir) == "completed"


def _status(output_dir: Path) -> str | None:
    """The ``status`` of ``output_dir``'s summary.json; None when there is none (or it cannot be read)."""
    try:
        return json.loads((output_dir / "summary.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None
