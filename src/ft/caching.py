"""ft's own cache: the folder where it keeps what it derives once and reuses, and the switches that ask for more.

The folder is ``$FT_CACHE_DIR``, else ``$XDG_CACHE_HOME/ft``, else ``~/.cache/ft``. What is always kept there is
small (a GGUF file's converted tokenizer and config: ``ft.model.gguf_cache``); what costs disk in proportion to a
model or a dataset is kept only where a switch asks for it: ``FT_CACHE_GGUF_WEIGHTS`` (a GGUF file's de-quantized
weights) and ``FT_CACHE_DATA`` (a recipe's tokenized data: ``ft.data.cache``).
"""

from __future__ import annotations

import os
from pathlib import Path

ON = {"1", "true", "yes", "on"}  # the values that turn a switch on


def cache_root() -> Path:
    """Where ft keeps what it derives once and reuses (``$FT_CACHE_DIR``, else the XDG cache folder's ``ft``)."""
    if os.environ.get("FT_CACHE_DIR"):
        return Path(os.environ["FT_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "ft"


def switched_on(variable: str) -> bool:
    """Whether the environment variable ``variable`` is set to 1, true, yes or on."""
    return os.environ.get(variable, "").strip().lower() in ON
