"""The tokenizer and config of a local GGUF file, converted once and kept.

transformers builds a GGUF file's tokenizer and config from the file's metadata on every load: it reads the
vocabulary and merges array by array (gguf's ``GGUFReader``) and converts them, seconds for a 49k-token vocabulary
(SmolLM2: the config 5 s, the tokenizer 4-6 s), paid by every ``ft train``, ``ft preprocess``, ``ft plan`` and
smoke run of a recipe that names ``model.gguf_file``, and again inside ``from_pretrained`` unless it is handed the
config. Saved with ``save_pretrained``, each loads in a fraction of a second and is the same (the tokenizer's ids,
chat template and special tokens; every config value). ``tokenizer`` and ``config`` keep them in
``<cache>/gguf/<key>/{tokenizer,config}/``, the key a digest of the file's metadata section (the bytes before its
tensor data, which is all transformers builds either from) and of the transformers and tokenizers versions that
converted them: a file replaced by another has a new key, and so has an upgrade that may convert differently.

The cache is ``$FT_CACHE_DIR``, else ``$XDG_CACHE_HOME/ft``, else ``~/.cache/ft``. An entry is written in a
temporary folder beside its place and renamed into it, so processes converting the same file at once leave one whole
entry; a cache that cannot be written, or an entry that cannot be read, costs only the conversion. A GGUF file on the
hub (``model.name`` a hub id) is converted on every load, as transformers does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

SUBFOLDER = "gguf"


def cache_root() -> Path:
    """Where ft keeps what it derives once and reuses (``$FT_CACHE_DIR``, else the XDG cache folder's ``ft``)."""
    if os.environ.get("FT_CACHE_DIR"):
        return Path(os.environ["FT_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "ft"


def entry_key(path: Path) -> str | None:
    """The digest naming ``path``'s entry, or None where its metadata section cannot be found (a file transformers'
    header reader cannot parse, or a transformers without one: the file is then converted every time)."""
    try:
        from transformers.integrations.gguf.reader import GgufHeader
    except ImportError:
        return None
    import tokenizers
    import transformers
    import xxhash

    digest = xxhash.xxh3_128(f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}\n".encode())
    try:
        length = GgufHeader.from_file(str(path)).data_start
    except Exception:  # noqa: BLE001 (a file the header reader cannot parse: the conversion that follows says why)
        return None
    with path.open("rb") as f:
        while length > 0 and (chunk := f.read(min(length, 1 << 20))):
            digest.update(chunk)
            length -= len(chunk)
    return digest.hexdigest()


def tokenizer(folder: str, gguf_file: str, convert: Callable):
    """The tokenizer of the GGUF file ``gguf_file`` in ``folder`` (``model.name``): from the cache where it holds one
    for the file, else ``convert()`` (transformers' own load from the file), saved into the cache for next time. A
    folder that is not a local one (a hub id) is always ``convert()``."""
    from transformers import AutoTokenizer

    found = _cached(folder, gguf_file, "tokenizer", convert, AutoTokenizer.from_pretrained)
    found.name_or_path = folder  # as transformers names the tokenizer it converts from the file
    return found


def config(folder: str, gguf_file: str, convert: Callable):
    """The config of the GGUF file ``gguf_file`` in ``folder``, as ``tokenizer`` keeps the tokenizer."""
    from transformers import AutoConfig

    found = _cached(folder, gguf_file, "config", convert, AutoConfig.from_pretrained)
    found._name_or_path = folder  # as transformers names the config it converts from the file
    return found


def _cached(folder: str, gguf_file: str, part: str, convert: Callable, read: Callable):
    path = Path(folder).expanduser() / gguf_file
    key = entry_key(path) if path.is_file() else None
    if key is None:
        return convert()
    entry = cache_root() / SUBFOLDER / key / part
    broken = False
    if entry.is_dir():
        try:
            found = read(entry)
        except (OSError, ValueError):  # an entry cut short or from another layout: converted and written again
            broken = True
        else:
            return found
    converted = convert()
    _store(converted, entry, broken)
    return converted


def _store(converted, entry: Path, broken: bool) -> None:
    """``converted`` saved as the cache entry ``entry``: written beside it, then renamed into place. A ``broken``
    entry is replaced; one another process completed meanwhile is kept (the rename onto it fails)."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    except OSError:
        return
    try:
        converted.save_pretrained(staging)
        staging.chmod(0o755)  # mkdtemp's folder is its owner's alone; the entry is for anyone who can read the cache
        if broken:
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)
    except OSError:  # another process renamed its whole entry in first, or the cache cannot be written
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
