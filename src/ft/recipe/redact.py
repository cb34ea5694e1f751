"""Secrets in recipe values: which keys name credentials, and a value with them replaced.

Pure functions over plain data: the resolved recipe (``recipe.resolved``), the rules, the importers and the resume
command (``ft.outputs.checkpoints``) all redact with these; a recipe's error messages show values through ``shown``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# names of credentials, not of vocabulary tokens (eos_token, max_new_tokens stay visible)
SECRET_KEY = re.compile(
    r"^(token|hub_token|hf_token|access_token|auth_token|api_key|apikey|secret|password)$"
    r"|_(api_key|secret|password)$",
    re.IGNORECASE,
)
REDACTED = "<redacted>"


def redact(value, key: str = "", under_secret: bool = False):
    """``value`` (YAML data) with every value under a credential-named key replaced by ``REDACTED``, at any depth
    below it (``hub_token: {a: ...}`` hides ``a``'s value too)."""
    secret = under_secret or bool(SECRET_KEY.search(key))
    if isinstance(value, dict):
        return {k: redact(v, str(k), secret) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key, secret) for v in value]
    if value is not None and secret and not isinstance(value, bool):
        return REDACTED
    return value


def redact_arguments(argv: Sequence[str]) -> list[str]:
    """A command line with the values of credential-named ``--set`` keys replaced by ``REDACTED`` (``--set
    hub_token=...`` and ``--set=hub_token=...``): what ft prints or saves of a command (the resume command, the holder
    of a run's lock) never holds a token given on it."""
    out: list[str] = []
    for part in argv:
        if out and out[-1] == "--set":
            out.append(_redacted_assignment(part))
        elif part.startswith("--set="):
            out.append("--set=" + _redacted_assignment(part.removeprefix("--set=")))
        else:
            out.append(part)
    return out


def _redacted_assignment(assignment: str) -> str:
    key, sep, _ = assignment.partition("=")
    return f"{key}={REDACTED}" if sep and SECRET_KEY.search(key.strip().rpartition(".")[2]) else assignment


def shown(value, path: Sequence = (), limit: int = 100) -> str:
    """``value`` as an error message shows it (``got ...``): ``REDACTED`` when a key on its ``path`` names a
    credential; a mapping by its keys alone, since the values under keys no schema knows may be credentials
    (``run_name: {api_key: ...}``); cut to ``limit`` characters, since aliases can make a value large."""
    if value is not None and not isinstance(value, bool) and any(SECRET_KEY.search(str(p)) for p in path):
        return REDACTED
    text = _brief(value, limit)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _brief(value, limit: int) -> str:
    """The repr of ``value`` with a mapping's values elided, stopping once past ``limit`` characters."""
    if not isinstance(value, (dict, list)):
        return repr(value)
    items = value if isinstance(value, list) else [f"{key!r}: …" for key in value]
    parts: list[str] = []
    for item in items:
        parts.append(item if isinstance(value, dict) else _brief(item, limit))
        if sum(map(len, parts)) > limit:
            break
    inner = ", ".join(parts)
    return "{" + inner + "}" if isinstance(value, dict) else "[" + inner + "]"
