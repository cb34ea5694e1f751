"""Recipe problems as data: every error names a dotted key path, where it came from, and the fix."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from ..errors import FtError


@dataclass(frozen=True)
class Problem:
    """One thing wrong (or worth a warning) in a recipe.

    ``path`` is the dotted key path (``train.per_device_train_batch_size``, ``data.train.0.path``);
    ``where`` is ``file:line`` or ``--set key=value`` when known.
    """

    path: str
    message: str
    where: str = ""
    level: str = "error"  # "error" | "warning"

    def render(self) -> str:
        head = f"{self.where}: " if self.where else ""
        key = self.path or "(recipe)"
        return f"{head}{key}: {self.message}"


@dataclass
class RecipeError(FtError, prefix=""):
    """Raised with *all* problems found, so the user fixes them in one pass (exit code 2)."""

    problems: list[Problem] = field(default_factory=list)
    source: str = ""

    def __str__(self) -> str:
        errors = [p for p in self.problems if p.level == "error"]
        noun = "problem" if len(errors) == 1 else "problems"
        head = f"{self.source}: {len(errors)} {noun} in the recipe" if self.source else "invalid recipe"
        return "\n".join([head + ":", *("  - " + p.render() for p in errors)])


def did_you_mean(word: str, options) -> str:
    """' Did you mean 'x'?' or '' — the suffix every unknown-name message uses."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=3, cutoff=0.6)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


def first_line(text: object) -> str:
    """The first non-blank line of ``text`` (an exception's message, a docstring), stripped; an exception without
    a message gives its type's name. Error paragraphs quote one line of a library's message, never a dump."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    if lines:
        return lines[0]
    return type(text).__name__ if isinstance(text, BaseException) else ""
