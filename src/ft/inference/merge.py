"""``ft merge``: a LoRA adapter folded into the base it was trained on, saved as a plain model.

QLoRA: the adapter is merged into the base loaded unquantized in the quantization's compute dtype. Training saw
4/8-bit weights, so the merged model differs slightly from the model as it was during training (by the
quantization error of the base weights); that is the usual QLoRA merge, and the only one that gives plain weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .locate import InferenceError, load_adapter_model, locate


def merge(source: Path, out: Path, dtype: str | None = None, say: Callable[[str], None] = print) -> Path:
    """Fold the adapter of ``source`` into its base and save a plain model (weights, config, tokenizer, chat
    template) in ``out``: a model any transformers-based tool loads without PEFT or ft."""
    found = locate(source, "RUN_OR_ADAPTER_DIR")
    if found.kind == "full":
        raise InferenceError(f"RUN_OR_ADAPTER_DIR: {found.path} holds a full model (config.json and weights), not a "
                             "LoRA adapter, so it needs no merge: use it as it is (ft generate, "
                             "from_pretrained). Only runs with an `adapter:` section leave an adapter to merge.")
    _check_out(out, found.path)
    model, tokenizer = load_adapter_model(found, dtype, "RUN_OR_ADAPTER_DIR", say)
    merged = model.merge_and_unload(safe_merge=True)  # safe_merge: refuse NaNs instead of writing them
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)  # with the chat template the run trained with (chat_template.jinja)
    say(f"ft: merged {found.path} into {out}")
    return out


def _check_out(out: Path, adapter: Path) -> None:
    """Never write into the adapter's own folder or over another model: --out must be new or empty."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InferenceError(f"--out: {out} already exists and is not an empty directory; choose a new directory "
                             "(ft merge writes config.json, weights and tokenizer files there) or empty it first.")
    if out.resolve() == adapter.resolve():
        raise InferenceError("--out: choose a directory other than the adapter's own.")
