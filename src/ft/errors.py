"""The one root of every failure ft reports to a user: an ``FtError`` carries its exit code and says its one
paragraph (the recipe key, file and line or row, and the fix) as its ``str``. ``ft.cli`` catches this class alone;
anything else reaching it is a bug and shows its traceback.

Exit codes (docs/cli.md): 2 for what the user can fix before anything runs or loads (a recipe, a path, a name, an
argument), 1 for a run that started and failed. A subclass sets ``exit_code``; an instance may override it."""

from __future__ import annotations


class FtError(Exception):
    """A failure ft explains: ``str(error)`` is the paragraph shown, ``exit_code`` the process's exit status."""

    exit_code: int = 2

    def __init__(self, *args, exit_code: int | None = None):
        super().__init__(*args)
        if exit_code is not None:
            self.exit_code = exit_code
