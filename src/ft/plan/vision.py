"""A vision-language model's vision side for ``ft plan``: the vision tower's and projector's parameters, counted from
the model's config as ``shape`` counts the language model's (no weights, no model built), and the images a row puts
through them (``ImageLoad``): read from the recipe's data with the model's own processor when both can be read, else
from the processor alone at the largest size it keeps an image, else from the config alone.

Each family is a row of two tables: ``TOWERS`` (the vision config's ``model_type`` -> its tensors: ViTs of the CLIP and
SigLIP kind, Idefics3's, Qwen2-VL's and Qwen2.5-VL's, Pixtral's) and ``FAMILIES`` (the model's ``model_type`` -> where
its language model, vision tower and projector sit, the projector's tensors and how image patches become language-model
tokens). Tensors are named by the module paths transformers gives them, so LoRA and GaLore targets match them as PEFT
and transformers do; ``tests/test_plan_vision.py`` compares each family's tensors with a model built from its config.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .parts import Linear, PlanError

SAMPLE_ROWS = 256  # rows read from each training source to count their images
PARTS = ("vision", "projector")


@dataclass(frozen=True)
class Weight:
    """One parameter tensor as a matrix: ``rows`` outputs by ``cols`` inputs (a conv kernel flattened to out ×
    in·k·k; a vector has one column, and one Weight may sum a layer's vectors). ``kind``: linear (an ``nn.Linear``:
    bitsandbytes quantizes it, LoRA may adapt it), conv, embedding (an ``nn.Embedding``), matrix (a bare parameter in a
    matmul) or vector. ``part``: vision, projector or language (LLaVA-NeXT's ``image_newline``, outside both parts).
    ``reads``, for a tower layer's linears: what it reads (``Linear.reads``)."""

    module: str
    rows: int
    cols: int
    kind: str
    part: str
    reads: str = ""

    @property
    def numel(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class VisionShape:
    """The vision tower and projector of a vision-language model, from its config. ``block`` is one tower layer's
    tensors, their module names holding ``{i}`` for the layer's index; ``stem`` the rest of the tower (patch
    embedding, position embedding, outer norms, a pooling head); ``projector`` what maps the tower's features into the
    language model (Qwen2-VL's merger, inside the tower, included)."""

    family: str  # the model's model_type
    tower: str  # its vision config's model_type
    language: str  # the language model's module path
    hidden: int
    intermediate: int
    layers: int
    heads: int
    head_dim: int
    norm: str  # layer (LayerNorm: keeps its input and two statistics) | rms (RMSNorm, as the language model's)
    act: str  # the MLP's activation
    gated: bool  # a gated MLP (gate, up, down) rather than fc1, fc2
    patch: int
    channels: int
    temporal: int  # frames per patch (Qwen2-VL's images are two identical frames); 1 elsewhere
    image_size: int  # the longest edge an image is kept at (0: a pixel budget instead, Qwen2-VL's processor's)
    tiled: bool  # every tile is resized to an image_size square (a ViT's learned positions); else the image keeps its
    # aspect ratio, and its patches follow its size
    class_token: bool  # CLIP's: one more token per tile
    merge: int  # patches per language-model token along each side (Idefics3's scale factor, Qwen2-VL's merge size)
    fixed_tokens: int  # language-model tokens per image whatever its size (Gemma 3's pooled 256; 0: from patches)
    stem: tuple[Weight, ...] = field(default=())
    block: tuple[Weight, ...] = field(default=())
    projector: tuple[Weight, ...] = field(default=())

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def grid(self) -> int:
        """Patches per tile of a tower that resizes to a fixed square (0 where the image keeps its size)."""
        return (self.image_size // self.patch) ** 2 if self.tiled else 0

    def weights(self) -> list[Weight]:
        block = [Weight(w.module.format(i=i), w.rows, w.cols, w.kind, w.part, w.reads)
                 for i in range(self.layers) for w in self.block]
        return [*self.stem, *block, *self.projector]

    def layer_linears(self, i: int) -> list[Linear]:
        """Tower layer ``i``'s linears, as the language model's (what each reads: its activation formula)."""
        return [Linear(w.module.format(i=i), w.cols, w.rows, w.reads, w.part) for w in self.block if w.kind == "linear"]

    def linears(self) -> list[Linear]:
        """Every ``nn.Linear`` of the tower and projector (LoRA's candidates)."""
        return [Linear(w.module, w.cols, w.rows, w.reads, w.part) for w in self.weights() if w.kind == "linear"]

    def count(self, part: str) -> int:
        return sum(w.numel for w in self.weights() if w.part == part)

    def encoder_tokens(self, patches: int) -> int:
        """Tokens the tower runs on for ``patches`` patches: CLIP adds a class token to each tile."""
        return patches + (patches // self.grid if self.class_token and self.grid else 0)

    def language_tokens(self, patches: int) -> int:
        """Language-model tokens of one image of ``patches`` patches, by the config alone (the processor's own count
        also holds the tokens around an image and between its tiles' rows)."""
        return self.fixed_tokens or patches // self.merge**2


# --- the towers ----------------------------------------------------------------------------------------------------


def _vector(module: str, size: int, part: str = "vision") -> Weight:
    return Weight(module, size, 1, "vector", part)


def _linear(module: str, fan_out: int, fan_in: int, reads: str = "", part: str = "vision") -> Weight:
    return Weight(module, fan_out, fan_in, "linear", part, reads)


@dataclass(frozen=True)
class Tower:
    """What a tower reader gives: its dimensions (``VisionShape``'s fields) and its tensors."""

    dims: dict
    stem: list[Weight]
    block: list[Weight]
    projector: list[Weight] = field(default_factory=list)


def _vit(vc, path: str) -> Tower:
    """CLIP's and SigLIP's ViT (LLaVA, Gemma 3, PaliGemma) and Idefics3's (SmolVLM): a conv patch embedding, learned
    positions, pre-norm layers of q/k/v/out projections and an fc1/fc2 MLP, all with biases; CLIP adds a class token and
    a norm before the layers, SigLIP a pooling head (``vision_use_head``) that its vision-language models never run."""
    d, inter, size, patch, channels = (vc.hidden_size, vc.intermediate_size, vc.image_size, vc.patch_size,
                                       vc.num_channels)
    clip = vc.model_type == "clip_vision_model"
    grid = (size // patch) ** 2
    emb = f"{path}.embeddings"
    stem = [Weight(f"{emb}.patch_embedding", d, channels * patch * patch, "conv", "vision"),
            Weight(f"{emb}.position_embedding", grid + clip, d, "embedding", "vision"),
            _vector(f"{path}.post_layernorm", 2 * d)]
    stem += ([_vector(f"{emb}.class_embedding", d), _vector(f"{path}.pre_layrnorm", 2 * d)] if clip
             else [_vector(f"{emb}.patch_embedding.bias", d)])
    if vc.model_type == "siglip_vision_model" and getattr(vc, "vision_use_head", True):
        head = f"{path}.head"
        stem += [_vector(f"{head}.probe", d), Weight(f"{head}.attention.in_proj_weight", 3 * d, d, "matrix", "vision"),
                 _linear(f"{head}.attention.out_proj", d, d), _linear(f"{head}.mlp.fc1", inter, d),
                 _linear(f"{head}.mlp.fc2", d, inter),
                 _vector(f"{head}.biases_and_norm", 3 * d + d + inter + d + 2 * d)]
    layer = f"{path}.encoder.layers.{{i}}"
    block = [_linear(f"{layer}.self_attn.{name}_proj", d, d, "attn_in") for name in ("q", "k", "v")]
    block += [_linear(f"{layer}.self_attn.out_proj", d, d, "attn_out"), _linear(f"{layer}.mlp.fc1", inter, d, "mlp_in"),
              _linear(f"{layer}.mlp.fc2", d, inter, "mlp_mid"),
              _vector(layer, 4 * d + inter + d + 4 * d)]  # q/k/v/out and fc1/fc2 biases, two LayerNorms
    dims = dict(hidden=d, intermediate=inter, layers=vc.num_hidden_layers, heads=vc.num_attention_heads,
                head_dim=d // vc.num_attention_heads, norm="layer", act=vc.hidden_act, gated=False, patch=patch,
                channels=channels, temporal=1, image_size=size, tiled=True, class_token=clip)
    return Tower(dims, stem, block)


def _qwen2_vl(vc, path: str) -> Tower:
    """Qwen2-VL's tower: a conv over two frames of each patch, layers of a fused qkv, proj and an fc1/fc2 MLP with
    LayerNorms, and the merger (a LayerNorm and two linears over each 2×2 group of patches) as its projector."""
    d, inter, patch, frames, channels = (vc.embed_dim, vc.embed_dim * vc.mlp_ratio, vc.patch_size,
                                         vc.temporal_patch_size, vc.in_channels)
    layer = f"{path}.blocks.{{i}}"
    block = [_linear(f"{layer}.attn.qkv", 3 * d, d, "attn_in"), _linear(f"{layer}.attn.proj", d, d, "attn_out"),
             _linear(f"{layer}.mlp.fc1", inter, d, "mlp_in"), _linear(f"{layer}.mlp.fc2", d, inter, "mlp_mid"),
             _vector(layer, 3 * d + d + inter + d + 4 * d)]  # biases, two LayerNorms
    dims = dict(hidden=d, intermediate=inter, layers=vc.depth, heads=vc.num_heads, head_dim=d // vc.num_heads,
                norm="layer", act=vc.hidden_act, gated=False)
    return _qwen_tower(vc, path, d, dims, block, merger_norm=2 * d, patch=patch, frames=frames, channels=channels,
                       out=vc.hidden_size)


def _qwen2_5_vl(vc, path: str) -> Tower:
    """Qwen2.5-VL's tower: as Qwen2-VL's with RMSNorms and a gated MLP with biases; its merger's norm an RMSNorm."""
    d, inter = vc.hidden_size, vc.intermediate_size
    layer = f"{path}.blocks.{{i}}"
    block = [_linear(f"{layer}.attn.qkv", 3 * d, d, "attn_in"), _linear(f"{layer}.attn.proj", d, d, "attn_out"),
             _linear(f"{layer}.mlp.gate_proj", inter, d, "mlp_in"), _linear(f"{layer}.mlp.up_proj", inter, d, "mlp_in"),
             _linear(f"{layer}.mlp.down_proj", d, inter, "mlp_mid"),
             _vector(layer, 3 * d + d + 2 * inter + d + 2 * d)]  # biases, two RMSNorms
    dims = dict(hidden=d, intermediate=inter, layers=vc.depth, heads=vc.num_heads, head_dim=d // vc.num_heads,
                norm="rms", act=vc.hidden_act, gated=True)
    return _qwen_tower(vc, path, d, dims, block, merger_norm=d, patch=vc.patch_size, frames=vc.temporal_patch_size,
                       channels=vc.in_channels, out=vc.out_hidden_size)


def _qwen_tower(vc, path, d, dims, block, *, merger_norm, patch, frames, channels, out) -> Tower:
    """The parts Qwen2-VL's and Qwen2.5-VL's towers share: the patch embedding (a conv over ``frames`` frames of each
    patch, no bias) and the merger (a norm and two linears, with biases, over each spatial_merge_size² group)."""
    merged = d * vc.spatial_merge_size**2
    merger = f"{path}.merger"
    projector = [_vector(f"{merger}.ln_q", merger_norm, "projector"),
                 _linear(f"{merger}.mlp.0", merged, merged, part="projector"),
                 _linear(f"{merger}.mlp.2", out, merged, part="projector"),
                 _vector(f"{merger}.mlp.biases", merged + out, "projector")]
    stem = [Weight(f"{path}.patch_embed.proj", d, channels * frames * patch * patch, "conv", "vision")]
    return Tower({**dims, "patch": patch, "channels": channels, "temporal": frames, "image_size": 0, "tiled": False,
                  "class_token": False}, stem, block, projector)


def _pixtral(vc, path: str) -> Tower:
    """Pixtral's tower (Mistral 3): a conv patch embedding without bias, RMSNorms, q/k/v/o and a gated MLP, no
    biases; an image keeps its aspect ratio up to ``image_size``."""
    d, inter, heads = vc.hidden_size, vc.intermediate_size, vc.num_attention_heads
    head_dim = getattr(vc, "head_dim", None) or d // heads
    q = heads * head_dim
    layer = f"{path}.transformer.layers.{{i}}"
    block = [_linear(f"{layer}.attention.{name}_proj", q, d, "attn_in") for name in ("q", "k", "v")]
    block += [_linear(f"{layer}.attention.o_proj", d, q, "attn_out"),
              _linear(f"{layer}.feed_forward.gate_proj", inter, d, "mlp_in"),
              _linear(f"{layer}.feed_forward.up_proj", inter, d, "mlp_in"),
              _linear(f"{layer}.feed_forward.down_proj", d, inter, "mlp_mid"), _vector(layer, 2 * d)]
    stem = [Weight(f"{path}.patch_conv", d, vc.num_channels * vc.patch_size**2, "conv", "vision"),
            _vector(f"{path}.ln_pre", d)]
    dims = dict(hidden=d, intermediate=inter, layers=vc.num_hidden_layers, heads=heads, head_dim=head_dim, norm="rms",
                act=vc.hidden_act, gated=True, patch=vc.patch_size, channels=vc.num_channels, temporal=1,
                image_size=vc.image_size, tiled=False, class_token=False)
    return Tower(dims, stem, block)


# the vision config's model_type -> the reader of its tower (config, module path) -> Tower
TOWERS: dict[str, Callable[[object, str], Tower]] = {
    **dict.fromkeys(("clip_vision_model", "siglip_vision_model", "idefics3_vision", "smolvlm_vision"), _vit),
    "qwen2_vl_vision": _qwen2_vl,
    "qwen2_5_vl_vision": _qwen2_5_vl,
    "pixtral": _pixtral,
}


# --- the projectors ------------------------------------------------------------------------------------------------


def _feature_layers(config) -> int:
    layers = getattr(config, "vision_feature_layer", -1)
    return len(layers) if isinstance(layers, (list, tuple)) else 1


def _two_linears(config, path: str, d: int, text: int, bias_default: bool) -> list[Weight]:
    bias = getattr(config, "multimodal_projector_bias", bias_default)
    return [_linear(f"{path}.linear_1", text, d * _feature_layers(config), part="projector"),
            _linear(f"{path}.linear_2", text, text, part="projector"),
            *([_vector(f"{path}.biases", 2 * text, "projector")] if bias else [])]


def _llava(config, path: str, d: int, text: int) -> list[Weight]:
    """LLaVA's two linears over the chosen layers' features (LLaVA-NeXT and -OneVision also learn a vector that ends
    each row of an image's tiles, ``model.image_newline``, outside the projector)."""
    newline = [_vector("model.image_newline", text, "language")] if hasattr(config, "image_grid_pinpoints") else []
    return _two_linears(config, path, d, text, True) + newline


def _connector(config, path: str, d: int, text: int) -> list[Weight]:
    """Idefics3's connector: one linear, without bias, over each scale_factor² group of patches (a pixel shuffle)."""
    return [_linear(f"{path}.modality_projection.proj", text, d * config.scale_factor**2, part="projector")]


def _gemma3(config, path: str, d: int, text: int) -> list[Weight]:
    """Gemma 3's: an RMSNorm and a bare matrix from the tower's width to the language model's."""
    return [Weight(f"{path}.mm_input_projection_weight", text, d, "matrix", "projector"),
            _vector(f"{path}.mm_soft_emb_norm", d, "projector")]


def _mistral3(config, path: str, d: int, text: int) -> list[Weight]:
    """Mistral 3's: an RMSNorm, a patch merger (one linear over each spatial_merge_size² group), two linears."""
    merge = config.spatial_merge_size
    return [_vector(f"{path}.norm", d, "projector"),
            _linear(f"{path}.patch_merger.merging_layer", d, d * merge**2, part="projector"),
            *_two_linears(config, path, d, text, False)]


def _paligemma(config, path: str, d: int, text: int) -> list[Weight]:
    out = config.vision_config.projection_dim
    return [_linear(f"{path}.linear", out, d, part="projector"), _vector(f"{path}.linear.bias", out, "projector")]


@dataclass(frozen=True)
class Family:
    """Where a vision-language family's parts sit (the module paths ``ft.model.adapters.VISION_PARTS`` finds), its
    projector's tensors (config, path, tower width, language width; none where the tower holds it), and how many
    patches along a side make one language-model token (``merge``) or a fixed count per image (``fixed``)."""

    language: str
    tower: str
    projector: str
    projector_weights: Callable[[object, str, int, int], list[Weight]] | None
    merge: Callable[[object], int] = lambda config: 1
    fixed: Callable[[object], int] = lambda config: 0


LLAVA = Family("model.language_model", "model.vision_tower", "model.multi_modal_projector", _llava)
IDEFICS3 = Family("model.text_model", "model.vision_model", "model.connector", _connector,
                  merge=lambda config: config.scale_factor)
QWEN2_VL = Family("model.language_model", "model.visual", "model.visual.merger", None,
                  merge=lambda config: config.vision_config.spatial_merge_size)
FAMILIES: dict[str, Family] = {
    **dict.fromkeys(("llava", "llava_next", "llava_onevision"), LLAVA),
    **dict.fromkeys(("idefics3", "smolvlm"), IDEFICS3),
    **dict.fromkeys(("qwen2_vl", "qwen2_5_vl"), QWEN2_VL),
    "gemma3": Family("model.language_model", "model.vision_tower", "model.multi_modal_projector", _gemma3,
                     fixed=lambda config: config.mm_tokens_per_image),
    "mistral3": Family("model.language_model", "model.vision_tower", "model.multi_modal_projector", _mistral3,
                       merge=lambda config: config.spatial_merge_size),
    "paligemma": Family("model.language_model", "model.vision_tower", "model.multi_modal_projector", _paligemma),
}


def read_vision(config, name: str) -> VisionShape:
    """The vision side of the vision-language model ``config`` describes (``name``: its ``model.name``, for the
    error). Raises PlanError for a family or tower the tables do not hold."""
    kind = getattr(config, "model_type", "?")
    vision_config = getattr(config, "vision_config", None)
    tower_kind = getattr(vision_config, "model_type", None)
    family = FAMILIES.get(kind)
    if family is None or tower_kind not in TOWERS:
        raise PlanError(
            f"model.name: {name!r} is a vision-language model ({kind}, vision tower {tower_kind}) whose vision side "
            "`ft plan` does not model; it models LLaVA (-NeXT, -OneVision), Idefics3/SmolVLM, Qwen2-VL, Qwen2.5-VL, "
            "Gemma 3, Mistral 3 and PaliGemma. Plan one of those, or set model.modality: text to estimate the "
            "language model alone where transformers also loads the family as text (Gemma 3, Llama 4).")
    tower = TOWERS[tower_kind](vision_config, family.tower)
    text = config.get_text_config().hidden_size
    projector = list(tower.projector)
    if family.projector_weights is not None:
        projector += family.projector_weights(config, family.projector, tower.dims["hidden"], text)
    return VisionShape(kind, tower_kind, family.language, **tower.dims, merge=family.merge(config),
                       fixed_tokens=family.fixed(config), stem=tuple(tower.stem), block=tuple(tower.block),
                       projector=tuple(projector))


def lora_parts(targets: str | tuple[str, ...]) -> Callable[[str, str], bool]:
    """Whether a new LoRA adapter may reach a part, as ``ft.model.adapters.fit_lora_targets`` fits its targets to a
    vision-language model: ``all-linear`` keeps to the language model; a regular expression is taken as written (every
    part); a list reaches a part when one of its names has the part's module name in its dotted path
    (``multi_modal_projector.linear_1``). Returns ``reaches(part, part_path)``."""
    if isinstance(targets, str):
        everywhere = targets.lower() != "all-linear"
        return lambda part, path: part == "language" or everywhere
    named = {piece for target in targets for piece in target.split(".")}
    return lambda part, path: part == "language" or path.rpartition(".")[2] in named


def part_path(vision: VisionShape, part: str) -> str:
    family = FAMILIES[vision.family]
    return {"vision": family.tower, "projector": family.projector}.get(part, vision.language)


# --- the images a row puts through the tower -----------------------------------------------------------------------


@dataclass(frozen=True)
class ImageLoad:
    """What one row's images cost: the most language-model tokens one image became (``tokens_per_image``) and the
    tower tokens it ran on (``patches_per_image``), the most images, image tokens and tower tokens in one row, and
    where they were found (``source``: data, processor or config; ``detail`` says how, or why the data was not
    read). Without data the row is taken to hold one image (``images_per_row`` None: not known)."""

    source: str
    detail: str
    tokens_per_image: int  # 0: not known
    patches_per_image: int
    row_tokens: int
    row_patches: int
    images_per_row: int | None = None
    mean_images: float | None = None
    rows: int = 0


def _nominal_size(recipe, vision: VisionShape, image_processor=None) -> tuple[int, int] | None:
    """The size an image is counted at without data: ``data.image.size``, else the largest square within
    ``data.image.max_pixels``, else the largest image the processor keeps (a ViT's tile or its processor's longest
    edge, Idefics3's splitting into most tiles; Qwen2-VL's pixel budget, ``max_pixels``); None when nothing says."""
    sizing = recipe.data.image
    if sizing is not None and sizing.size is not None:
        return sizing.size[0], sizing.size[1]
    if sizing is not None and sizing.max_pixels is not None:
        side = math.isqrt(sizing.max_pixels)
        return side, side
    size = dict(getattr(image_processor, "size", None) or {})
    if vision.image_size:
        side = max([vision.image_size, *(size[key] for key in ("longest_edge", "height") if key in size)])
        return side, side
    budget = getattr(image_processor, "max_pixels", None) or size.get("longest_edge")
    return (math.isqrt(budget),) * 2 if budget else None


def config_load(recipe, vision: VisionShape, why: str = "") -> ImageLoad:
    """One image a row at the nominal size, its tokens by the config alone (one tile: a processor that splits large
    images into tiles, Idefics3's, is needed to count them)."""
    size = _nominal_size(recipe, vision)
    if size is None:
        return ImageLoad("config", f"{why}no image size known: set data.image.max_pixels or data.image.size", 0, 0,
                         0, 0)
    scale = min(1.0, vision.image_size / max(size)) if vision.image_size else 1.0  # kept within its longest edge
    patches = vision.grid or math.prod(math.ceil(side * scale / vision.patch) for side in size)
    tokens, encoder = vision.language_tokens(patches), vision.encoder_tokens(patches)
    return ImageLoad("config", f"{why}the config's count for one image at {size[0]}×{size[1]}", tokens, encoder,
                     tokens, encoder)


class _Measure:
    """Tokens of an image of a given size, the processor's own (``ft.data.images.ImageTokens``, as the data is
    prepared), and the tower tokens of the pixels its image processor makes, once per size."""

    def __init__(self, tokens, vision: VisionShape):
        self.tokens, self.vision, self.seen = tokens, vision, {}

    def __call__(self, size: tuple[int, int]) -> tuple[int, int]:
        if size not in self.seen:
            import numpy as np
            from PIL import Image

            pixels = self.tokens.processor.image_processor(images=[Image.new("RGB", size)], return_tensors="np")
            values = np.asarray(pixels["pixel_values"]).size
            v = self.vision
            patches = values // (v.channels * v.patch * v.patch * v.temporal)
            self.seen[size] = (len(self.tokens.expansion(size)), v.encoder_tokens(patches))
        return self.seen[size]


def _row_images(recipe) -> list[list[str]]:
    """The images of the first ``SAMPLE_ROWS`` rows of each training source, read as ``ft train`` reads them (paths
    resolved, each image checked), without the progress bars of a full read."""
    import datasets

    from ..data.formats import normalize
    from ..data.rows import BadRows
    from ..data.sources import read_source

    data, report, rows = recipe.data, BadRows(), []
    shown = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        for i, source in enumerate(data.train):
            key = f"data.train.{i}"
            raw = read_source(source, seed=data.seed, on_bad_row=data.on_bad_row, report=report, key=key)
            raw = raw.select(range(min(SAMPLE_ROWS, len(raw))))
            canonical = normalize(raw, source, key=key, on_bad_row=data.on_bad_row, report=report, images=True)
            rows += canonical["images"] if "images" in canonical.column_names else [[] for _ in canonical]
    finally:
        if shown:
            datasets.enable_progress_bars()
    return rows


def _first_line(exc: BaseException) -> str:
    """The gist of an error, for a clause of the report: its first sentence (with the next line where the first
    introduces a list, ``1 bad row in …:``)."""
    lines = [line.strip() for line in str(exc).strip().splitlines()] or [type(exc).__name__]
    gist = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return gist.split(". ")[0].rstrip(".")


def image_load(recipe, vision: VisionShape) -> ImageLoad:
    """The images a row of ``recipe`` puts through the model: from its first rows and the model's processor (each
    image's tokens as the data's preparation counts them; the worst row's), else the processor alone at the nominal
    size (one image a row), else the config alone (``config_load``); each fallback says why."""
    from ..data.images import ImageTokens, image_size
    from ..errors import FtError
    from ..model.loading import load_processor

    problems = (FtError, OSError, ValueError, ImportError)  # unreadable files, a processor that cannot run here
    try:
        measure = _Measure(ImageTokens(load_processor(recipe.model), recipe.data.image), vision)
    except problems as exc:
        return config_load(recipe, vision, f"no processor ({_first_line(exc)}); ")
    try:
        rows = _row_images(recipe)
        counted = [[measure(image_size(ref, recipe.data.image)) for ref in images] for images in rows]
    except problems as exc:
        why = f"data not read ({_first_line(exc)})"
        size = _nominal_size(recipe, vision, measure.tokens.processor.image_processor)
        try:
            tokens, patches = measure(size) if size is not None else (0, 0)
        except problems as again:
            return config_load(recipe, vision, f"{why}; the processor failed ({_first_line(again)}); ")
        if not tokens:
            return config_load(recipe, vision, why + "; ")
        return ImageLoad("processor", f"{why}; the processor's count for one image at {size[0]}×{size[1]}", tokens,
                         patches, tokens, patches)
    images = [image for row in counted for image in row]
    largest = max(images, default=(0, 0))
    sources = len(recipe.data.train)
    read = (f"the first {len(rows)} rows of data.train" if sources == 1
            else f"{len(rows)} rows, the first of each of the {sources} data.train sources")
    return ImageLoad("data", read, largest[0], largest[1],
                     max((sum(t for t, _ in row) for row in counted), default=0),
                     max((sum(p for _, p in row) for row in counted), default=0),
                     max((len(row) for row in counted), default=0), len(images) / max(len(rows), 1), len(rows))
