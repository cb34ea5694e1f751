"""Byte amounts as people read them, the one formatting every report, warning and error of ft uses."""

from __future__ import annotations

KiB, MiB, GiB = 2**10, 2**20, 2**30


def human(n: float) -> str:
    """``n`` bytes in the largest binary unit it reaches, two decimals: ``1.50 GiB``, ``512 B``."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"
