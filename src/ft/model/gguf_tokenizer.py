"""The tokenizer of a local GGUF file, converted once and kept.

transformers builds a GGUF file's tokenizer from the file's metadata on every load: it reads the vocabulary and merges
array by array and converts them into a fast tokenizer, seconds for a 49k-token vocabulary, paid by every ``ft
train``, ``ft preprocess`` and ``ft plan`` of a recipe that names ``model.gguf_file``. The converted tokenizer, saved
with ``save_pretrained``, loads in a fraction of that and is the same tokenizer (its ids, chat template and special
tokens). ``load`` keeps it in ``<cache>/gguf-tokenizers/<key>/``, the key a digest of the file's metadata section
(the bytes before its tensor data, which is all transformers builds the tokenizer from) and of the transformers and
tokenizers versions that converted it: a file replaced by another has a new key, and so has an upgrade that may
convert differently.

The cache is ``$FT_CACHE_DIR``, else ``$XDG_CACHE_HOME/ft``, else ``~/.cache/ft``. An entry is written in a
temporary folder beside its place and renamed into it, so processes converting the same file at once leave one whole
entry; a cache that cannot be written, or an entry that cannot be read, costs only the conversion. A GGUF file on the
hub (``model.name`` a hub id) is converted on every load, as transformers does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

SUBFOLDER = "gguf-tokenizers"


def cache_root() -> Path:
    """Where ft keeps what it derives once and reuses (``$FT_CACHE_DIR``, else the XDG cache folder's ``ft``)."""
    if os.environ.get("FT_CACHE_DIR"):
        return Path(os.environ["FT_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "ft"


def entry_key(path: Path) -> str | None:
    """The digest naming ``path``'s converted tokenizer, or None where its metadata section cannot be found (a
    transformers without its own GGUF header reader: the file is then converted every time)."""
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


def load(folder: str, gguf_file: str, convert):
    """The tokenizer of the GGUF file ``gguf_file`` in ``folder`` (``model.name``): from the cache where an entry for
    the file exists, else ``convert()`` (transformers' own load from the file), saved into the cache for next time. A
    folder that is not a local one (a hub id) is always ``convert()``."""
    from transformers import AutoTokenizer

    path = Path(folder).expanduser() / gguf_file
    key = entry_key(path) if path.is_file() else None
    if key is None:
        return convert()
    entry = cache_root() / SUBFOLDER / key
    broken = False
    if entry.is_dir():
        try:
            tokenizer = AutoTokenizer.from_pretrained(entry)
        except (OSError, ValueError):  # an entry cut short or from another layout: converted and written again
            broken = True
        else:
            tokenizer.name_or_path = folder  # as transformers names the file's own tokenizer
            return tokenizer
    tokenizer = convert()
    _store(tokenizer, entry, broken)
    return tokenizer


def _store(tokenizer, entry: Path, broken: bool) -> None:
    """``tokenizer`` saved as the cache entry ``entry``: written beside it, then renamed into place. A ``broken`` entry
    is replaced; one another process completed meanwhile is kept (the rename onto it fails)."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    except OSError:
        return
    try:
        tokenizer.save_pretrained(staging)
        staging.chmod(0o755)  # mkdtemp's folder is its owner's alone; the entry is for anyone who can read the cache
        if broken:
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)
    except OSError:  # another process renamed its whole entry in first, or the cache cannot be written
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
