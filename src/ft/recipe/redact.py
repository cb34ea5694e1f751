"""Secrets in recipe values: which keys name credentials, and a value with them replaced.

Pure functions over plain data: the resolved recipe (``recipe.resolved``), the rules, the importers and the resume
command (``ft.outputs.checkpoints``) all redact with these.
"""

from __future__ import annotations

import re

# names of credentials, not of vocabulary tokens (eos_token, max_new_tokens stay visible)
SECRET_KEY = re.compile(
    r"^(token|hub_token|hf_token|access_token|auth_token|api_key|apikey|secret|password)$"
    r"|_(api_key|secret|password)$",
    re.IGNORECASE,
)
REDACTED = "<redacted>"


def redact(value, key: str = ""):
    """``value`` (YAML data) with every value under a credential-named key replaced by ``REDACTED``."""
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if value is not None and SECRET_KEY.search(key) and not isinstance(value, bool):
        return REDACTED
    return value
