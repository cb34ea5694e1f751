"""``ft merge``: a LoRA adapter folded into the base it was trained on, saved as a plain model.

QLoRA: the adapter is merged into the base loaded unquantized in the quantization's compute dtype. Training saw
4/8-bit weights, so the merged model differs from the model as it was during training (by the quantization error of
the base weights); that is the usual QLoRA merge, and the only one that gives plain weights (peft #2321: merging
into the quantized weights themselves answers differently again).

The merge is checked on a few rows of the run's data (``CHECK_ROWS``): the merged model's logits against the adapter
on the unmerged base (the fold itself: equal up to rounding), and for a quantized base against the model as trained
(the 4/8-bit base + adapter). Below ``AGREEMENT_WARN`` of the positions with the same top-1 token, ft warns.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..model.locate import find_base, load_adapter_model, load_as_trained, locate
from ..recipe.errors import first_line
from .generate import InferenceError

CHECK_ROWS = 4
AGREEMENT_WARN = 0.98  # share of positions whose most likely next token is the same


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
    recipe = find_base(found, "RUN_OR_ADAPTER_DIR").recipe
    batch, why = _check_batch(recipe, tokenizer)
    unmerged = _logits(model, batch) if batch is not None else None
    merged = model.merge_and_unload(safe_merge=True)  # safe_merge: refuse NaNs instead of writing them
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    # with the chat template the run trained with (chat_template.jinja); a vision-language run's processor writes its
    # image processor's config and processor_config.json too, so AutoProcessor loads the merged folder as one
    tokenizer.save_pretrained(out)
    say(f"ft: merged {found.path} into {out}")
    if batch is None:
        say(f"ft: merge check skipped: {why}")
        return out
    after = _logits(merged, batch)
    say(f"ft: merge check on {len(batch)} rows of the run's data, against the adapter on the unmerged "
        f"base: {_agreement(after, unmerged)[1]}")
    if recipe.model.quantization is not None:
        del merged, model
        trained = load_as_trained(found, tokenizer, "RUN_OR_ADAPTER_DIR")
        agreement, line = _agreement(after, _logits(trained, batch))
        bits = recipe.model.quantization.bits
        say(f"ft: merge check against the model as trained ({bits}-bit base + adapter): {line}")
        if agreement < AGREEMENT_WARN:
            say(f"ft: warning: the merged model's most likely next token differs from the model you trained at "
                f"{1 - agreement:.1%} of the positions checked (more than {1 - AGREEMENT_WARN:.0%}): merging undoes "
                f"the {bits}-bit base's rounding that the adapter was trained on. Serve the adapter on the base "
                f"loaded in {bits} bits as in training (PEFT's PeftModel over the quantized base), or train without "
                "`model.quantization` when a merged model is the goal.")
    return out


def _check_batch(recipe, tokenizer):
    """(the first CHECK_ROWS rows of the run's data, each tokenized alone: no padding, so no pad token needed; None)
    or (None, why not). A vision-language run's processor is handed each row's images with its text (read as
    training reads them, ``data.image`` applied), and the rows are not cut: a cut could fall inside an image."""
    if recipe is None:
        return None, "no recipe.yaml next to the adapter says which data the run trained on"
    from ..data.build import read_splits
    from ..data.images import load_image
    from .generate import sees

    seeing = sees(tokenizer)
    try:
        train, evaluation, _ = read_splits(recipe, lambda _: None, images=seeing)
        rows = (evaluation if evaluation is not None and len(evaluation) else train)
        rows = [rows[i] for i in range(min(CHECK_ROWS, len(rows)))]
        if seeing:
            return [tokenizer(text=[row_text(row, tokenizer)], return_tensors="pt",
                              **({"images": [[load_image(ref, recipe.data.image) for ref in row["images"]]]}
                                 if row.get("images") else {}))
                    for row in rows], None
        return [tokenizer(row_text(row, tokenizer), return_tensors="pt", truncation=True,
                          max_length=recipe.data.max_length) for row in rows], None
    except Exception as exc:  # the data is not on this machine, or its rows do not render: the merge stands alone
        return None, f"the run's data could not be read or rendered here ({type(exc).__name__}: {first_line(exc)})"


def row_text(row: dict, tokenizer) -> str:
    """A canonical row as the model read it: a chat rendered with the run's template, or prompt + answer."""
    if "messages" in row:
        return tokenizer.apply_chat_template(row["messages"], tokenize=False)
    prompt = row.get("prompt") or ""
    answer = row.get("completion", row.get("chosen")) or ""
    if isinstance(prompt, list):
        reply = answer if isinstance(answer, list) else [{"role": "assistant", "content": answer}]
        return tokenizer.apply_chat_template(prompt + reply, tokenize=False)
    return prompt + (answer if isinstance(answer, str) else "")


def _logits(model, batch: list):
    """Every position's logits of the rows, one after another (a reward model's one score per row)."""
    import torch

    with torch.no_grad():
        outputs = [model(**row).logits.float() for row in batch]
    return torch.cat([logits.reshape(-1, logits.shape[-1]) for logits in outputs])  # a reward model: [1, 1] each


def _agreement(ours, theirs) -> tuple[float, str]:
    """The share of positions with the same top-1 token, and a line with it and the largest logit gap (a reward
    model's scores: the largest score gap)."""
    gap = float((ours - theirs).abs().max())
    if ours.shape[-1] == 1:
        return 1.0, f"largest score gap {gap:.2g} over {len(ours)} rows"
    share = float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())
    return share, f"top-1 token the same at {share:.1%} of {len(ours)} positions, largest logit gap {gap:.2g}"


def _check_out(out: Path, adapter: Path) -> None:
    """Never write into the adapter's own folder or over another model: --out must be new or empty."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InferenceError(f"--out: {out} already exists and is not an empty directory; choose a new directory "
                             "(ft merge writes config.json, weights and tokenizer files there) or empty it first.")
    if out.resolve() == adapter.resolve():
        raise InferenceError("--out: choose a directory other than the adapter's own.")
