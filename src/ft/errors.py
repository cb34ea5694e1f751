"""The one root of every failure ft reports to a user: an ``FtError`` carries its exit code and says its one
paragraph (the recipe key, file and line or row, and the fix) as its ``str``. ``ft.cli`` catches this class alone
and prints ``render()``; anything else reaching it is a bug, reported as one and with its traceback in a file.

Exit codes (docs/cli.md): 2 for what the user can fix before anything runs or loads (a recipe, a path, a name, an
argument), 1 for a run that started and failed. A subclass sets ``exit_code`` and ``prefix`` in its class line
(``class DiskFull(FtError, exit_code=1):``), so each module's class says what the command ends with; an instance
may override ``exit_code``."""

from __future__ import annotations


class FtError(Exception):
    """A failure ft explains: ``render()`` is the paragraph shown (``prefix`` then ``str(error)``), ``exit_code`` the
    process's exit status."""

    exit_code: int = 2
    prefix: str = "ft: "  # what the command prints before the message; a recipe's problem list starts with its file

    def __init_subclass__(cls, *, exit_code: int | None = None, prefix: str | None = None, **kwargs):
        """``class X(FtError, exit_code=1, prefix="ft report: ")``: the subclass's exit code and prefix, given where
        it is defined."""
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code
        if prefix is not None:
            cls.prefix = prefix

    def __init__(self, *args, exit_code: int | None = None):
        super().__init__(*args)
        if exit_code is not None:
            self.exit_code = exit_code

    def render(self) -> str:
        """The paragraph ``ft`` prints to stderr for this failure."""
        return f"{self.prefix}{self}"
