"""A loaded transformers causal LM and its tokenizer written as one GGUF file (llama.cpp's format), through the ``gguf``
package: its writer, its tensor-name maps and its quantizers. ft writes no bytes of the format itself.

What ft adds is the part llama.cpp's converter script holds and the ``gguf`` package does not: which GGUF
architecture a transformers ``model_type`` becomes (``ARCHITECTURES``, the one table to extend), the metadata keys
read from the config, llama.cpp's row order for the query and key projections of Llama-family models (``permute``),
the RoPE factors of Llama 3 scaling as a tensor, and which tensors stay float32 (norms and other 1-D tensors, as
llama.cpp's converter keeps them). The tokenizer's metadata is in ``gguf_vocab``.

Tensors are converted and written one at a time (header first, from shapes alone), so a write needs the model in
memory and one converted tensor, not a second copy of the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import ExportError
from .gguf_vocab import add_tokenizer

QUANTS = ("f32", "f16", "bf16", "q8_0")  # --quant choices; the file type and tensor type of each: _types


@dataclass(frozen=True)
class Architecture:
    """How a transformers ``model_type`` is written: the GGUF architecture llama.cpp runs it as, and whether the
    query and key rows are reordered into llama.cpp's RoPE layout."""

    gguf_arch: str
    permute_qk: bool


# model_type -> how it is written. llama.cpp runs Mistral as its llama architecture (as its own converter writes it);
# transformers reads such a file back as Llama, the same computation.
ARCHITECTURES = {
    "llama": Architecture("llama", permute_qk=True),
    "mistral": Architecture("llama", permute_qk=True),
    "qwen2": Architecture("qwen2", permute_qk=False),
}


def unsupported(model_type: str | None, where: str) -> ExportError:
    return ExportError(f"{where}: the model's architecture is {model_type!r}, which ft export does not write to "
                       f"GGUF; it writes {', '.join(sorted(ARCHITECTURES))} (model_type in config.json). Nothing "
                       "was written. For another architecture use llama.cpp's convert_hf_to_gguf.py on a merged "
                       "model (ft merge).")


def architecture_of(model_type: str | None, where: str) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise unsupported(model_type, where)
    return ARCHITECTURES[model_type]


@dataclass(frozen=True)
class Planned:
    """One tensor of the file: its GGUF name, the source tensor (reordered when ``permute`` is set), its type."""

    name: str
    source: object  # torch.Tensor
    qtype: object  # gguf.GGMLQuantizationType
    permute_heads: int | None = None  # heads whose rows are reordered for llama.cpp's RoPE layout


@dataclass(frozen=True)
class Written:
    path: Path
    tensors: int
    nbytes: int
    fell_back: tuple[str, ...]  # tensors written as f16 because q8_0 needs rows in blocks of 32
    pre_tokenizer: str | None  # llama.cpp's name of the text split before BPE ("default": none matched)


def write_gguf(model, tokenizer, folder: Path, path: Path, quant: str, where: str,
               progress: Callable[[int, int], None] | None = None) -> Written:
    """Write ``model`` (a transformers causal LM) and ``tokenizer`` to ``path`` as GGUF with tensors in ``quant``.
    ``folder`` holds the tokenizer's and config's saved files, which ``gguf.SpecialVocab`` reads (special token ids,
    merges, chat template)."""
    import gguf

    config = model.config
    arch = architecture_of(config.model_type, where)
    planned = _plan(model, arch, quant, where)
    writer = gguf.GGUFWriter(None, arch.gguf_arch)
    _add_config(writer, config, _types(quant)[0])
    pre = add_tokenizer(writer, tokenizer, config.vocab_size, folder, where)
    stored = [_stored_shape(item) for item in planned]
    for item, (shape, dtype, nbytes) in zip(planned, stored, strict=True):
        writer.add_tensor_info(item.name, shape, dtype, nbytes, raw_dtype=item.qtype)
    writer.write_header_to_file(path=path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    total, done = sum(nbytes for *_, nbytes in stored), 0
    try:
        for item in planned:
            data = _convert(item, where)
            writer.write_tensor_data(data)
            done += data.nbytes
            if progress is not None:
                progress(done, total)
    finally:
        writer.close()
    fell_back = tuple(item.name for item in planned
                      if quant == "q8_0" and item.qtype == gguf.GGMLQuantizationType.F16)
    return Written(path, len(planned), path.stat().st_size, fell_back, pre)


def _types(quant: str):
    """(the file type recorded in general.file_type, the tensor type of the quantizable tensors)."""
    import gguf

    types = {
        "f32": (gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
        "f16": (gguf.LlamaFileType.MOSTLY_F16, gguf.GGMLQuantizationType.F16),
        "bf16": (gguf.LlamaFileType.MOSTLY_BF16, gguf.GGMLQuantizationType.BF16),
        "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
    }
    return types[quant]


def _add_config(writer, config, file_type) -> None:
    """The hyperparameters llama.cpp (and transformers' GGUF reader) take from the file, from the model's config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    # Not the bare family name: transformers 5.25 reads a llama file named exactly "mistral" as a Mistral GGUF
    # architecture the gguf package does not have, and fails.
    writer.add_name(f"{config.model_type} (ft export)")
    writer.add_type("model")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = rope_parameters(config)
    writer.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    kind = rope.get("rope_type", "default")
    if kind == "linear":
        import gguf

        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    writer.add_file_type(file_type)
    writer.add_quantization_version(2)  # gguf.GGML_QUANT_VERSION: the block layout of q8_0


ROPE_TYPES = ("default", "linear", "llama3")  # written: linear as metadata, llama3 as the rope_freqs tensor


def rope_parameters(config) -> dict:
    """The RoPE settings, from ``rope_parameters`` (transformers 5) or ``rope_theta`` and ``rope_scaling``."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "full_attention" in params:
        params = params["full_attention"]
    if isinstance(params, dict):
        return dict(params)
    return {"rope_theta": getattr(config, "rope_theta", 10000.0), **(getattr(config, "rope_scaling", None) or {})}


def _plan(model, arch: Architecture, quant: str, where: str) -> list[Planned]:
    """Every tensor the file will hold, in order, under its GGUF name and type. Refuses (before anything is
    written) a tensor the architecture's name map does not know and a RoPE scaling llama.cpp could not be told."""
    import gguf

    config = model.config
    kind = rope_parameters(config).get("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise ExportError(f"{where}: the model uses {kind!r} RoPE scaling (rope_parameters in config.json), which "
                          f"ft export does not write; it writes {', '.join(ROPE_TYPES)}. Nothing was written.")
    arch_id = next(key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == arch.gguf_arch)
    names = gguf.get_tensor_name_map(arch_id, config.num_hidden_layers)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    tied = bool(getattr(config, "tie_word_embeddings", False))
    chosen = _types(quant)[1]
    planned = []
    for source_name, tensor in model.state_dict().items():
        if tied and source_name == "lm_head.weight":
            continue  # one matrix for both ends: a file without output.weight says so
        found = names.get_type_and_name(source_name, try_suffixes=(".weight", ".bias"))
        if found is None:
            raise ExportError(f"{where}: the model holds a tensor {source_name!r} that GGUF's {arch.gguf_arch} "
                              "architecture has no name for, so llama.cpp would not use it. Nothing was written.")
        kind_of, name = found
        permute = None
        if arch.permute_qk and kind_of in (gguf.MODEL_TENSOR.ATTN_Q, gguf.MODEL_TENSOR.ATTN_K):
            permute = heads if kind_of == gguf.MODEL_TENSOR.ATTN_Q else kv_heads
        planned.append(Planned(name, tensor, _tensor_type(name, tensor, chosen), permute))
    if kind == "llama3":
        planned.append(Planned(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", _llama3_factors(model),
                               gguf.GGMLQuantizationType.F32))
    return planned


def _tensor_type(name: str, tensor, chosen):
    """Norms and 1-D tensors stay float32 (llama.cpp's kernels expect it); q8_0 needs rows in blocks of 32, and a
    tensor whose rows are not is written f16, as llama.cpp's converter does."""
    import gguf

    if tensor.dim() <= 1 or name.endswith("_norm.weight"):
        return gguf.GGMLQuantizationType.F32
    block = gguf.GGML_QUANT_SIZES[chosen][0]
    if tensor.shape[-1] % block:
        return gguf.GGMLQuantizationType.F16
    return chosen


def _llama3_factors(model):
    """llama.cpp's ``rope_freqs``: per frequency, how much Llama 3 scaling divides it by, read off the model's own
    rotary embedding (transformers computed the scaled frequencies) against the unscaled ones."""
    import torch

    rotary = model.get_decoder().rotary_emb
    scaled = rotary.inv_freq.detach().to(torch.float64)
    config = model.config
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    base = rope_parameters(config).get("rope_theta", 10000.0)
    plain = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    return (plain / scaled).to(torch.float32)


def _stored_shape(item: Planned):
    """(shape, numpy dtype, bytes) as the writer records them before the data: quantized types as byte rows."""
    import gguf
    import numpy as np

    shape = tuple(item.source.shape)
    count = int(np.prod(shape)) if shape else 1
    if item.qtype == gguf.GGMLQuantizationType.F32:
        return shape, np.dtype(np.float32), count * 4
    if item.qtype == gguf.GGMLQuantizationType.F16:
        return shape, np.dtype(np.float16), count * 2
    byte_shape = gguf.quant_shape_to_byte_shape(shape, item.qtype)
    return byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape))


def _convert(item: Planned, where: str):
    """The tensor's data as the file stores it (float32 first: numpy has no bfloat16, and every source dtype widens to
    float32 exactly). A value that overflows the chosen type stops the export rather than writing inf."""
    import gguf
    import numpy as np
    import torch

    data = item.source.detach().to(torch.float32).cpu()
    if item.permute_heads is not None:
        data = permute(data, item.permute_heads)
    array = data.numpy()
    converted = gguf.quants.quantize(array, item.qtype)
    if item.qtype == gguf.GGMLQuantizationType.F16 and not np.isfinite(converted).all() and np.isfinite(array).all():
        raise ExportError(f"{where}: {item.name} holds values beyond float16's range (±65504), so --quant f16 "
                          "would write inf; export with --quant bf16 (same size, float32's range) or f32.")
    return converted


def permute(weights, heads: int):
    """llama.cpp's row order for a query or key projection: within each head, the two halves that transformers'
    rotate_half pairs are interleaved (transformers' GGUF reader undoes exactly this)."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))
