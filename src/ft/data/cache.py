"""The prepared-dataset cache: a fingerprint of everything that shaped a tokenized dataset.

``ft preprocess`` writes ``<prepared_path>/{train,eval}`` (``save_to_disk``) and ``ft_prepared.json``
with the fingerprint's components; ``ft train`` compares them with the current recipe, data files (and the file of
tool definitions ``data.tools`` names: its contents, wherever it lies) and tokenizer, and reuses, rebuilds or (with
``data.require_prepared``) refuses, naming what changed.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import xxhash

from .. import __version__
from ..recipe import Recipe

MANIFEST = "ft_prepared.json"
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
