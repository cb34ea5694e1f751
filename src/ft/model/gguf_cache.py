"""The tokenizer and config of a local GGUF file, converted once and kept; its de-quantized weights too, where asked.

transformers builds a GGUF file's tokenizer and config from the file's metadata on every load: it reads the
vocabulary and merges array by array (gguf's ``GGUFReader``) and converts them, seconds for a 49k-token vocabulary
(SmolLM2: the config 5 s, the tokenizer 4-6 s), paid by every ``ft train``, ``ft preprocess``, ``ft plan`` and
smoke run of a recipe that names ``model.gguf_file``, and again inside ``from_pretrained`` unless it is handed the
config. Saved with ``save_pretrained``, each loads in a fraction of a second and is the same (the tokenizer's ids,
chat template and special tokens; every config value). ``tokenizer`` and ``config`` keep them in
``<cache>/gguf/<key>/{tokenizer,config}/``, the key a digest of the file's metadata section (the bytes before its
tensor data, which is all transformers builds either from) and of the transformers and tokenizers versions that
converted them: a file replaced by another has a new key, and so has an upgrade that may convert differently.

The cache is ft's (``ft.caching.cache_root``). An entry is written in a
temporary folder beside its place and renamed into it, so processes converting the same file at once leave one whole
entry; a cache that cannot be written, or an entry that cannot be read, costs only the conversion. A GGUF file on the
hub (``model.name`` a hub id) is converted on every load, as transformers does.

The weights are de-quantized on every load as well (``GGUFReader`` parses the file again, each tensor is renamed
and de-quantized: 12 s for SmolLM2-135M, minutes for a 7B file). With ``FT_CACHE_GGUF_WEIGHTS=1`` ``weights`` keeps
them as a plain checkpoint in ``<key>/weights/`` (``save_pretrained`` of the causal LM in float32, the values the
de-quantizer produced, so every ``model.dtype`` casts from the same numbers a GGUF load casts from), which
``from_pretrained`` reads in a fraction of a second. It is asked for, not the default, because it costs four bytes
per parameter of disk (28 GB for a 7B model) where the GGUF file cost a fraction of that.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..caching import cache_root, switched_on

SUBFOLDER = "gguf"
WEIGHTS_SWITCH = "FT_CACHE_GGUF_WEIGHTS"  # set to 1: the de-quantized weights are kept too (``weights``)


def entry_key(path: Path) -> str | None:
    """The digest naming ``path``'s entry, or None where its metadata section cannot be found (a file transformers'
    header reader cannot parse, or a transformers without one: the file is then converted every time). The versions
    of what converts it (transformers, tokenizers, gguf's de-quantizers) are part of it."""
    try:
        from transformers.integrations.gguf.reader import GgufHeader
    except ImportError:
        return None
    import tokenizers
    import transformers
    import xxhash

    try:
        gguf = version("gguf")
    except PackageNotFoundError:
        gguf = None
    digest = xxhash.xxh3_128(f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, "
                             f"gguf {gguf}\n".encode())
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


def weights_kept() -> bool:
    """Whether this machine keeps de-quantized GGUF weights (``FT_CACHE_GGUF_WEIGHTS`` set to 1, true, yes or on)."""
    return switched_on(WEIGHTS_SWITCH)


def weights(folder: str, gguf_file: str, convert: Callable) -> Path | None:
    """The folder of a plain checkpoint of the GGUF file ``gguf_file`` in ``folder``'s de-quantized weights (a causal
    LM in float32, saved by ``save_pretrained``), which ``from_pretrained`` loads as any model folder; None where
    weights are not kept (``weights_kept``), the file is not a local one, or the cache cannot be written (the caller
    then loads the GGUF file itself). ``convert()`` is the de-quantized model, called only when the cache holds no
    whole entry for the file."""
    path = Path(folder).expanduser() / gguf_file
    key = entry_key(path) if weights_kept() and path.is_file() else None
    if key is None:
        return None
    entry = cache_root() / SUBFOLDER / key / "weights"
    if not _whole_checkpoint(entry):
        _store(convert(), entry, broken=entry.exists())
    return entry if _whole_checkpoint(entry) else None


def _whole_checkpoint(entry: Path) -> bool:
    """``entry`` holds a config and every weights file it names, each with a readable header (an entry cut short or
    damaged is converted and written again, never loaded half)."""
    from safetensors import safe_open

    index = entry / "model.safetensors.index.json"
    try:
        files = set(json.loads(index.read_text())["weight_map"].values()) if index.is_file() else {"model.safetensors"}
        if not (entry / "config.json").is_file():
            return False
        for name in files:
            with safe_open(str(entry / name), "pt") as opened:
                opened.keys()
    except Exception:  # noqa: BLE001 (missing, cut short, not safetensors: each means convert again)
        return False
    return True


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
        for written in staging.iterdir():
            written.chmod(0o644)  # (safetensors writes its files for their owner alone)
        if broken:
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)
    except OSError:  # another process renamed its whole entry in first, or the cache cannot be written
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
