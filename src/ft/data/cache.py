"""The prepared-dataset cache: a fingerprint of everything that shaped a tokenized dataset.

``ft preprocess`` writes ``<prepared_path>/{train,eval}`` (``save_to_disk``) and ``ft_prepared.json``
with the fingerprint's components; ``ft train`` compares them with the current recipe, data files (and the file of
tool definitions ``data.tools`` names: its contents, wherever it lies) and tokenizer, and reuses, rebuilds or (with
``data.require_prepared``) refuses, naming what changed.

Without ``data.prepared_path``, ``FT_CACHE_DATA=1`` keeps the tokenized data in ft's cache instead
(``<cache>/data/<digest of the fingerprint>``, ``ft.caching``): the next run of a recipe with the same data,
tokenizer and template reads it back in a fraction of a second instead of rendering and tokenizing every row again,
and says what building it said. It is asked for, not the default: it costs a copy of the tokenized data on disk for
every distinct data set-up. An entry is never replaced (another fingerprint is another entry); it is written beside its
place and renamed into it, so processes building the same data at once leave one whole entry.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import xxhash

from .. import __version__
from ..caching import cache_root, switched_on
from ..recipe import Recipe

MANIFEST = "ft_prepared.json"
DATA_SWITCH = "FT_CACHE_DATA"  # set to 1: tokenized data is kept in ft's cache when data.prepared_path is unset
SAID = "said"  # the stats key of the lines building an entry said, said again when it is reused
# data keys that do not change the tokenized rows (packing happens at train time, in TRL)
_NOT_SHAPING = {"prepared_path", "require_prepared", "num_proc", "packing"}


def _digest(*parts: bytes | str) -> str:
    h = xxhash.xxh3_128()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    h = xxhash.xxh3_128()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _source_digest(path: str, revision: str | None) -> str:
    local = Path(path)
    if local.is_file():
        return _file_digest(local)
    if local.is_dir():
        files = sorted(p for p in local.rglob("*") if p.is_file())
        return _digest(*(f"{p.relative_to(local)}:{_file_digest(p)}" for p in files))
    return f"hub:{path}@{revision or 'unpinned'}"  # a hub dataset: only a pinned revision is reproducible


def fingerprint(recipe: Recipe, tokenizer, template: str | None, image_processor=None) -> dict[str, str]:
    """Named components; the dataset is reusable when every component matches. ``image_processor``: a
    vision-language model's, whose settings decide how many tokens each image becomes (the images themselves are not
    read here: a prepared row whose image changed size since is stopped by name when its batch is built,
    ``ft.data.images.ImageBatches``)."""
    data = recipe.data.model_dump(mode="json", exclude=_NOT_SHAPING)
    if data.get("image") is None:
        data.pop("image", None)  # unset: a text recipe's fingerprint is what it was before images existed
    tools_file = data.pop("tools") if isinstance(recipe.data.tools, str) else None  # its contents, not its path
    components = {
        "ft version": __version__,
        "method": recipe.method,
        "data settings": _digest(json.dumps(data, sort_keys=True)),
        "length column": recipe.train_args.get("length_column_name", "length"),
        "tokenizer": _digest(tokenizer.backend_tokenizer.to_str(), json.dumps(tokenizer.special_tokens_map,
                                                                              sort_keys=True, default=str)),
        "chat template": _digest(template or ""),
    }
    if image_processor is not None:
        components["image processor"] = _digest(image_processor.to_json_string())
    if tools_file is not None:  # the tool definitions every chat row without its own is rendered with
        components["data.tools contents"] = _file_digest(Path(tools_file))
    for split, sources in (("train", recipe.data.train), ("eval", recipe.data.eval_sources)):
        for i, source in enumerate(sources):
            components[f"data.{split}.{i} contents"] = _source_digest(source.path, source.revision)
    return components


@dataclass(frozen=True)
class CacheState:
    status: str  # "missing" | "stale" | "fresh"
    changed: tuple[str, ...] = ()

    def describe(self, path: str) -> str:
        if self.status == "fresh":
            return f"reusing the prepared dataset at {path} (fingerprint matches)"
        if self.status == "missing":
            return f"no prepared dataset at {path} yet"
        return f"the prepared dataset at {path} is stale (changed: {', '.join(self.changed)})"


def check(path: Path, components: dict[str, str]) -> CacheState:
    manifest = path / MANIFEST
    if not manifest.is_file():
        return CacheState("missing")
    saved = json.loads(manifest.read_text()).get("fingerprint", {})
    changed = tuple(sorted(k for k in set(saved) | set(components) if saved.get(k) != components.get(k)))
    return CacheState("stale", changed) if changed else CacheState("fresh")


def load(path: Path) -> tuple[object, object | None, dict]:
    import datasets

    manifest = json.loads((path / MANIFEST).read_text())
    train = datasets.load_from_disk(str(path / "train"))
    evaluation = datasets.load_from_disk(str(path / "eval")) if (path / "eval").is_dir() else None
    return train, evaluation, manifest.get("stats", {})


def save(path: Path, train, evaluation, components: dict[str, str], stats: dict) -> None:
    """Write next to ``path`` and swap it in, so a crash never leaves a half-written cache behind."""
    staging = path.with_name(path.name + ".writing")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    train.save_to_disk(str(staging / "train"))
    if evaluation is not None:
        evaluation.save_to_disk(str(staging / "eval"))
    (staging / MANIFEST).write_text(json.dumps({"fingerprint": components, "stats": stats}, indent=1) + "\n")
    shutil.rmtree(path, ignore_errors=True)
    staging.rename(path)


def load_kept(entry: Path, discard: bool) -> tuple[object, object | None, dict] | None:
    """``load`` of an entry of ft's cache; None when it cannot be read (changed by hand: an Arrow file deleted under
    its whole manifest), and then the entry is removed when ``discard`` (the main process, which keeps a new one in
    its place: ``keep`` never replaces an entry that exists)."""
    try:
        return load(entry)
    except (OSError, ValueError):
        if discard:
            shutil.rmtree(entry, ignore_errors=True)
        return None


def kept_entry(components: dict[str, str]) -> Path | None:
    """Where ft's cache keeps the tokenized data of ``components`` (``fingerprint``), when ``FT_CACHE_DATA`` asks for
    it; None otherwise, and for data a fingerprint cannot pin (a hub dataset at no fixed revision)."""
    if not switched_on(DATA_SWITCH) or any(value.endswith("@unpinned") for value in components.values()):
        return None
    return cache_root() / "data" / _digest(json.dumps(components, sort_keys=True))


def keep(entry: Path, train, evaluation, components: dict[str, str], stats: dict) -> bool:
    """``save`` as the entry ``entry`` of ft's cache: written beside it and renamed into place, kept as it is when
    another process completed it first. False when the cache cannot be written (the run goes on without it)."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    except OSError:
        return False
    try:
        save(staging / "entry", train, evaluation, components, stats)
        os.replace(staging / "entry", entry)
    except OSError:  # another process renamed its whole entry in first, or the cache cannot be written
        return entry.is_dir()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True
