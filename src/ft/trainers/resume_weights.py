"""A full model's weights read back from a checkpoint under the names the model has now.

transformers 5 saves a model under its family's hub names (LLaVA's ``language_model.model.*``, Gemma 3's, Qwen2-VL's)
and renames them as ``from_pretrained`` loads them (the model's conversion mapping). ``Trainer._load_from_checkpoint``
(transformers 5.25, issue #43701) loads a checkpoint with ``load_state_dict`` on the saved names, without that
renaming: for those families no tensor matches, a warning is logged, and a resumed full fine-tune goes on from the
weights it was built with (its start) with the checkpoint's optimizer state: silently not the run it resumes. Here
the saved names go through the same mapping first. Models saved under their own names (Llama, Idefics3) and LoRA
adapters (PEFT loads those) are left to the Trainer, as are FSDP and DeepSpeed checkpoints (their engines load them).
"""

from __future__ import annotations

import json
from pathlib import Path

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"


def shard_files(folder: str | Path) -> list[Path] | None:
    """The safetensors files of a checkpoint's full model (one file, or the shards its index names); None if the
    checkpoint holds no full model in safetensors."""
    folder = Path(folder)
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    if (folder / INDEX).is_file():
        shards = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
        return [folder / shard for shard in shards]
    return None


def renamed_state(model, files: list[Path]) -> dict | None:
    """The tensors of ``files`` keyed by ``model``'s own parameter names (through its conversion mapping); None when
    the mapping renames nothing, so the Trainer's own loading is right."""
    import safetensors.torch
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    conversions = get_model_conversion_mapping(model) or []
    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    if not renamings:
        return None
    state: dict = {}
    for file in files:
        for key, tensor in safetensors.torch.load_file(str(file), device="cpu").items():
            state[rename_source_key(key, renamings, converters)[0]] = tensor
    return state
