"""The failure of an export (exit code 2): an output path, architecture, tensor, RoPE scaling or chat template a
target cannot take, refused before the first byte is written."""

from __future__ import annotations

from ..errors import FtError


class ExportError(FtError):
    """What ``ft export`` refuses, with the reason and the fix."""
