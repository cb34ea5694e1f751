"""Where a run resumes from, and whether it stopped for a JIT checkpoint."""

from __future__ import annotations

import re
from pathlib import Path

INCOMPLETE_MARKER = "checkpoint-is-incomplete.txt"  # written by transformers while a JIT save runs


class ResumeError(Exception):
    pass


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """``checkpoint-N`` folders that finished writing, oldest first."""
    found = []
    for path in output_dir.glob("checkpoint-*"):
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        complete = (path / "trainer_state.json").exists() and not (path / INCOMPLETE_MARKER).exists()
        if match and path.is_dir() and complete:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def resolve_resume(mode: str, output_dir: Path) -> str | None:
    """``auto``: the newest complete checkpoint, if any; ``never``: start fresh; else a path."""
    if mode == "never":
        return None
    if mode == "auto":
        found = complete_checkpoints(output_dir)
        return str(found[-1]) if found else None
    path = Path(mode)
    if not (path / "trainer_state.json").exists():
        raise ResumeError(f"--resume {mode}: not a complete checkpoint folder (no trainer_state.json there); "
                          "pass a checkpoint-N folder, `auto` or `never`.")
    return str(path)


def stopped_for_jit(output_dir: Path, global_step: int, max_steps: int, jit_enabled: bool) -> bool:
    """True when training ended early because a SIGTERM triggered transformers' JIT checkpoint."""
    return jit_enabled and global_step < max_steps and (output_dir / f"checkpoint-{global_step}").is_dir()
