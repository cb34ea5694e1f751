"""Model and processing-class loading: a hub id or a local directory, pretrained weights or random init, or a GGUF
file.

A model has a modality (``modality_of``: text, or images and text), read from its config through transformers' own
auto tables; with the method it decides the model's auto class (``ft.recipe.methods.MODEL_CLASSES``) and what
prepares its inputs, the ``processing_class`` (TRL's name): a tokenizer for a text model, a processor for a
vision-language one (``load_processing_class``).

``init: random`` builds the model from the same ``config.json`` that ``init: pretrained`` would load
weights for, so both go through one code path (the quickstart uses it to run with no hub access).
Adapters are in ``ft.model.adapters``: a new LoRA config is handed to TRL, which wraps the model itself.

``model.gguf_file``: transformers reads the config, tokenizer and weights of a GGUF file (llama.cpp's format) through
the ``gguf`` package and de-quantizes the weights; the tokenizer and config of a local file are converted once and
then read from ft's cache (``ft.model.gguf_cache``). The model it returns keeps a GGUF quantizer attached, which refuses
``save_pretrained``; ft moves the de-quantized weights into a plain model of the same config (``_plain``), so that
checkpoints, ``final/`` and ``ft merge`` save it like any other. ``gguf_problems`` checks a recipe's file before any
model or data loads.
"""

from __future__ import annotations

import copy
from pathlib import Path

from ..errors import FtError
from ..recipe import Problem, Recipe
from ..recipe.errors import first_line
from ..recipe.methods import METHODS
from ..recipe.processes import uses_fsdp
from ..recipe.schema import ModelSection, QuantizationSection
from . import gguf_cache

GGUF_MISSING = ("reading a GGUF file needs the `gguf` package, which is not installed here; run "
                "`pip install 'ft[gguf]'` (or `pip install gguf`).")


class ModelLoadError(FtError):
    """The model or tokenizer named in the recipe could not be loaded (exit code 2)."""


GET_SMOLLM2 = "scripts/get_smollm2.py"  # the repository's one command that places the real model's GGUF file


def names_a_path(name: str) -> bool:
    """``model.name`` is a path (absolute, ./ ../ ~, or more than one ``/``), not a hub id (``org/name``): where it
    does not exist, it is a missing folder rather than a model to download."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _common_kwargs(section: ModelSection) -> dict:
    """What every ``from_pretrained`` of the model's files takes: revision, remote code, the GGUF file."""
    kwargs = {"revision": section.revision, "trust_remote_code": section.trust_remote_code}
    return {**kwargs, "gguf_file": section.gguf_file} if section.gguf_file else kwargs


def load_config(section: ModelSection):
    """The model's config (``config.json``, or a GGUF file's metadata: converted once, then read from ft's cache),
    without its weights."""
    from transformers import AutoConfig

    def convert():
        return AutoConfig.from_pretrained(section.name, **_common_kwargs(section))

    return gguf_cache.config(section.name, section.gguf_file, convert) if section.gguf_file else convert()


def load_tokenizer(section: ModelSection, say=None):
    """The tokenizer; one without a pad token pads with its end-of-sequence token (said through ``say``)."""
    from transformers import AutoTokenizer

    def convert():
        return AutoTokenizer.from_pretrained(section.name, **_common_kwargs(section))

    try:
        tokenizer = gguf_cache.tokenizer(section.name, section.gguf_file, convert) if section.gguf_file else convert()
    except (OSError, ValueError) as exc:
        raise ModelLoadError(_explain(section, "tokenizer", exc)) from None
    except ImportError:  # the gguf package, which only a GGUF file needs; another (a model's own code) is raised on
        if not section.gguf_file:
            raise
        raise ModelLoadError(f"model.gguf_file: {GGUF_MISSING}") from None
    _pad_with_eos(tokenizer, say)
    return tokenizer


def _pad_with_eos(tokenizer, say) -> None:
    """A tokenizer without a pad token pads with its end-of-sequence token (said through ``say``)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        if say is not None:
            say(f"tokenizer: it has no pad token; padding with its end-of-sequence token {tokenizer.eos_token!r} "
                f"(id {tokenizer.eos_token_id}), which padded positions never train on")


def load_processor(section: ModelSection, say=None):
    """The processor of a vision-language model (``AutoProcessor``: its tokenizer and image processor); a tokenizer
    without a pad token pads with its end-of-sequence token, as ``load_tokenizer`` says."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(section.name, **_common_kwargs(section))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(_explain(section, "processor", exc)) from None
    _pad_with_eos(text_tokenizer(processor), say)
    return processor


# the loader of each modality's processing class (``ft.recipe.methods.MODALITIES``)
PROCESSING_CLASSES = {"text": load_tokenizer, "vision": load_processor}


def load_processing_class(section: ModelSection, say=None, modality: str | None = None):
    """What prepares the model's inputs, TRL's ``processing_class``: the tokenizer of a text model, the processor of a
    vision-language one (``modality``: the model's, read from its config when not given). It is carried as one object
    from loading to the data, the trainer, ``final/``, generate, merge and export; code that needs the text tokenizer
    itself asks ``text_tokenizer``."""
    return PROCESSING_CLASSES[modality or model_modality(section)](section, say)


def text_tokenizer(processing_class):
    """The tokenizer inside a processing class: a processor's ``tokenizer``, or the tokenizer itself."""
    return getattr(processing_class, "tokenizer", processing_class)


def modality_of(config) -> str:
    """What the model of ``config`` reads, by transformers' own auto tables: ``text`` for a model transformers loads as
    a causal LM (multimodal families that have a text-only class, Llama 4 and Gemma 3, included), ``vision`` for an
    image-text-to-text model with no causal LM class (Qwen2-VL, Idefics3/SmolVLM, LLaVA, PaliGemma)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    kind = getattr(config, "model_type", None)
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return "vision"
    return "text"


def model_modality(section: ModelSection) -> str:
    """The modality of the model ``section`` names: ``model.modality`` where the recipe sets it (checked against the
    config where that can be read: ``modality_problem``), else from its config. A GGUF file holds a text decoder
    (transformers reads no other from GGUF), and is not parsed for it; a config that cannot be read is taken as
    text, and the load that follows says what is missing."""
    if section.gguf_file:
        return section.modality or "text"
    try:
        config = load_config(section)
    except (OSError, ValueError, ImportError):
        return section.modality or "text"
    problem = modality_problem(section.modality, config)
    if problem:
        raise ModelLoadError(f"model.modality: {problem}")
    return section.modality or modality_of(config)


def modality_problem(modality: str | None, config) -> str | None:
    """Why a model of ``config`` cannot be trained as ``modality`` (None: it can): ``vision`` needs a family
    transformers loads as image-text-to-text, ``text`` one it loads as a causal LM."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    kind = getattr(config, "model_type", None)
    tables = {"vision": MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES, "text": MODEL_FOR_CAUSAL_LM_MAPPING_NAMES}
    if modality is None or kind in tables[modality]:
        return None
    reads = "images and text" if modality == "vision" else "text alone"
    return (f"is {modality}, and the model's family ({kind}) has no class in transformers that reads {reads}; "
            f"remove model.modality to train it as what its config says ({modality_of(config)}).")


TOKEN_KEYS = ("pad_token", "eos_token")  # train.* keys that name a token of the tokenizer (TRL's SFT, DPO, reward)


def named_tokens(recipe: Recipe) -> dict[str, str]:
    """The tokens the recipe names by ``train.<key>`` (``TOKEN_KEYS``): key -> token."""
    return {key: recipe.train_args[key] for key in TOKEN_KEYS if recipe.train_args.get(key)}


def token_problems(recipe: Recipe, tokenizer) -> list[Problem]:
    """A token the recipe names (``train.pad_token``, ``train.eos_token``) that the tokenizer does not have: TRL pads
    and ends rows only with tokens of the vocabulary, and fails building the trainer otherwise. ft adds no tokens."""
    vocabulary = tokenizer.get_vocab()
    return [Problem(f"train.{key}", f"{token!r} is not a token of the tokenizer of model.name ({recipe.model.name!r}), "
                    f"so TRL cannot use it; name one of its tokens (its end-of-sequence token is "
                    f"{tokenizer.eos_token!r}), or remove the key (ft then pads with the tokenizer's pad token, else "
                    "its end-of-sequence token).")
            for key, token in named_tokens(recipe).items() if token not in vocabulary]


def _weights_kwargs(section: ModelSection, fsdp: bool = False) -> dict:
    """dtype, attention kernel and quantization for ``from_pretrained`` (shared by policy and reference); ``fsdp``:
    the model will be sharded by FSDP (``bnb_config``)."""
    import torch

    kwargs = {"dtype": "auto" if section.dtype == "auto" else getattr(torch, section.dtype)}
    if section.attn_implementation:
        kwargs["attn_implementation"] = section.attn_implementation
    if section.quantization is not None:
        kwargs["quantization_config"] = bnb_config(section.quantization, fsdp=fsdp)
    return kwargs


def model_class(recipe: Recipe, modality: str = "text"):
    """The transformers auto class of the model the recipe's method trains, for a model of ``modality``
    (``Method.model_class``: the method table's (method × modality) entry): a causal LM, a reward model's sequence
    classifier with one score, an image-text-to-text model. A modality the method does not train is refused here,
    before any weights load."""
    import transformers

    method = METHODS[recipe.method]
    name = method.model_class(modality)
    if name is None:
        raise ModelLoadError(
            f"model.name: {recipe.model.name!r} is a {modality} model (transformers has no text-only class for it), "
            f"and ft trains {' or '.join(method.modalities)} models with method {recipe.method}; name a text model "
            "(or the language model of this family); docs/vision.md says which methods train vision-language "
            "models.")
    return getattr(transformers, name)


def _seed_new_head(recipe: Recipe, seed: int) -> None:
    """A pretrained model given a new head (a reward model's score) draws it from the RNG: seeded, it is the same each
    run (and ``ft merge`` rebuilds it). A causal LM draws nothing here, and the RNG is left as it was."""
    if METHODS[recipe.method].scores:
        from transformers import set_seed

        set_seed(seed)


def _head_kwargs(recipe: Recipe) -> dict:
    """A scoring model has one output (the reward), read at the last non-pad token, so its config needs the pad id."""
    return {"num_labels": 1} if METHODS[recipe.method].scores else {}


def load_model(recipe: Recipe, seed: int):
    """The base model: pretrained weights, or built from its config with ``seed``; quantized as the recipe says. A
    scoring method's head (a reward model's score) is new: it is drawn with ``seed`` too."""
    import torch
    from transformers import AutoConfig, set_seed

    section = recipe.model
    auto = model_class(recipe, model_modality(section))
    kwargs = {**_weights_kwargs(section, fsdp=uses_fsdp(recipe)), **_head_kwargs(recipe)}
    try:
        if section.init == "pretrained" and section.gguf_file:
            from transformers import GgufConfig

            quantization = kwargs.pop("quantization_config", None)  # of the de-quantized weights, as for random init
            dense = GgufConfig(dequantize=True)  # never left in GGUF blocks (kept with a matmul kernel installed)
            config = copy.deepcopy(load_config(section))  # handed over: from_pretrained would convert it again
            for key in _head_kwargs(recipe):
                setattr(config, key, kwargs.pop(key))
            kept = gguf_cache.weights(section.name, section.gguf_file, lambda: _dequantized(section))
            _seed_new_head(recipe, seed)
            if kept is None:
                model = _plain(auto.from_pretrained(section.name, **_common_kwargs(section), **kwargs, config=config,
                                                    quantization_config=dense), section, auto)
            else:  # the same de-quantized values, read from ft's cache (as a GGUF load names its model)
                model = auto.from_pretrained(kept, **kwargs, config=config)
                model.config._name_or_path = model.name_or_path = section.name
            return model if quantization is None else _quantized_copy(model, section, kwargs, quantization, auto)
        if section.init == "pretrained":
            _seed_new_head(recipe, seed)
            return auto.from_pretrained(section.name, **_common_kwargs(section), **kwargs)
        config = AutoConfig.from_pretrained(section.name, **_common_kwargs(section), **_head_kwargs(recipe))
        set_seed(seed)
        quantization = kwargs.pop("quantization_config", None)
        kwargs.pop("num_labels", None)  # in the config already
        if kwargs["dtype"] == "auto":
            kwargs["dtype"] = torch.float32
        model = auto.from_config(config, trust_remote_code=section.trust_remote_code, **kwargs)
        return model if quantization is None else _quantized_copy(model, section, kwargs, quantization, auto)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(_explain(section, "model", exc)) from None
    except ImportError:  # the gguf package, which only a GGUF file needs; another (a model's own code) is raised on
        if not section.gguf_file:
            raise
        raise ModelLoadError(f"model.gguf_file: {GGUF_MISSING}") from None


def load_weights(recipe: Recipe, seed: int, config, state_dict: dict):
    """The model the recipe trains, from weights already in memory (a LoRA run folded into its base:
    ``ft.model.locate.load_start``), loaded as ``load_model`` loads a folder: the recipe's class (a scoring
    method's head new, drawn with ``seed``), dtype, attention kernel and quantization. transformers'
    ``from_pretrained(None, config=..., state_dict=...)`` loads them; the auto classes need a name to read, so the
    concrete class is taken from one built on the meta device (no memory, no weights drawn)."""
    import torch

    section = recipe.model
    auto = model_class(recipe, section.modality or modality_of(config))
    config = copy.deepcopy(config)
    for key, value in _head_kwargs(recipe).items():
        setattr(config, key, value)
    try:
        with torch.device("meta"):
            concrete = type(auto.from_config(config, trust_remote_code=section.trust_remote_code))
        _seed_new_head(recipe, seed)
        model = concrete.from_pretrained(None, config=config, state_dict=state_dict,
                                         **_weights_kwargs(section, fsdp=uses_fsdp(recipe)))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(_explain(section, "model", exc)) from None
    model.config._name_or_path = model.name_or_path = section.name  # what an adapter records as its base
    return model


def _dequantized(section: ModelSection):
    """The GGUF file's causal LM, de-quantized to float32 in a plain model (what ft's cache keeps of its weights:
    ``gguf_cache.weights``)."""
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    config = copy.deepcopy(load_config(section))
    model = AutoModelForCausalLM.from_pretrained(section.name, **_common_kwargs(section), config=config,
                                                 dtype=torch.float32, quantization_config=GgufConfig(dequantize=True))
    return _plain(model, section, AutoModelForCausalLM)


def _plain(model, section: ModelSection, auto):
    """The de-quantized weights of a model loaded from a GGUF file in a plain model of its config (no quantizer
    attached: it saves), built on the meta device and handed the tensors themselves (no copy, no random init); the
    buffers a state dict leaves out (rotary frequencies) are handed over too."""
    import torch

    config = copy.deepcopy(model.config)  # GGUF's config, read once: each read parses the whole file (seconds)
    config.__dict__.pop("quantization_config", None)  # the de-quantizer's, not this model's
    with torch.device("meta"):
        plain = auto.from_config(config, dtype=model.dtype, trust_remote_code=section.trust_remote_code)
    state = model.state_dict()
    plain.load_state_dict(state, assign=True)
    for name, buffer in model.named_buffers():
        if name not in state:  # not persistent
            owner, _, leaf = name.rpartition(".")
            plain.get_submodule(owner).register_buffer(leaf, buffer, persistent=False)
    plain.tie_weights()
    if getattr(model, "generation_config", None) is not None:  # a scoring model (reward) has none
        plain.generation_config = model.generation_config
    plain.config._name_or_path = plain.name_or_path = model.name_or_path  # what an adapter records as its base
    return plain.train(model.training)


def gguf_problems(section: ModelSection) -> list:
    """What stops ``model.gguf_file`` from loading, before any model or data loads: the ``gguf`` package missing, a
    local file missing or not a whole GGUF file, an architecture transformers cannot read from GGUF. A file in a hub
    repository is judged when it is downloaded."""
    from ..recipe import Problem

    if not section.gguf_file:
        return []
    key = "model.gguf_file"
    try:
        from gguf import GGUFReader
    except ImportError:
        return [Problem(key, GGUF_MISSING)]
    path = Path(section.name) / section.gguf_file
    if not Path(section.name).is_dir() and not names_a_path(section.name):
        return []  # a hub repository: transformers downloads the file, and says when it cannot
    if not path.is_file():
        return [Problem(key, f"{path} does not exist; name a .gguf file inside the folder `model.name` names "
                        f"(the shipped smollm2-* recipes read the file `python {GET_SMOLLM2}` puts there).")]
    try:
        architecture = _whole_gguf_architecture(path, GGUFReader)
    except Exception as exc:  # the readers' errors: a bad magic number, a file cut short (tensors past its end)
        return [Problem(key, f"{path} is not a whole GGUF file ({first_line(exc)}): a download or copy cut short, or "
                        "another format; fetch it again.")]
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        readable = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
        return [Problem(key, f"{path} holds a `{architecture}` model, which transformers cannot read from GGUF (it "
                        f"reads {readable}); use the model's own checkpoint (safetensors) instead.")]
    return []


def _whole_gguf_architecture(path, reader_class) -> str:
    """The file's ``general.architecture``, once its header and tensor table are read and every tensor is seen to end
    inside the file. transformers' own header reader does this in milliseconds; gguf's ``GGUFReader`` (the fallback,
    for a transformers without it) parses every metadata array first, seconds for a 49k-token vocabulary."""
    try:
        from transformers.integrations.gguf.reader import GgufHeader
    except ImportError:
        field = reader_class(str(path)).fields["general.architecture"]  # checks the tensors' extent itself
        return bytes(field.parts[field.data[0]]).decode()
    header = GgufHeader.from_file(str(path))
    end = max((header.data_start + tensor.offset + tensor.nbytes for tensor in header.tensors), default=0)
    if end > path.stat().st_size:
        raise ValueError(f"its tensors end at byte {end}, past the file's {path.stat().st_size} bytes")
    return header.architecture


def _quantized_copy(model, section: ModelSection, kwargs: dict, quantization, auto):
    """A randomly initialised model, quantized: transformers quantizes while loading weights, so the new weights are
    saved to a temporary directory and loaded back through bitsandbytes (what a smoke test of a QLoRA recipe needs)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ft-random-base-") as folder:
        model.save_pretrained(folder)
        quantized = auto.from_pretrained(folder, trust_remote_code=section.trust_remote_code,
                                         **kwargs, quantization_config=quantization)
    # what an adapter records as its base (base_model_name_or_path), not the temporary folder
    quantized.config._name_or_path = quantized.name_or_path = section.name
    return quantized


def load_reference_model(name: str, section: ModelSection, fsdp: bool = False, key: str = "dpo.ref_model"):
    """The frozen reference model a method section declares (``key``, e.g. ``dpo.ref_model``): pretrained weights
    from ``name`` (hub id or directory) with the policy's dtype, attention kernel, remote-code and quantization
    settings (TRL shards it with FSDP too when the policy is: ``fsdp``)."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(name, trust_remote_code=section.trust_remote_code,
                                                     **_weights_kwargs(section, fsdp=fsdp))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{key}: could not load the reference model from {name!r}: {first_line(exc)}. "
                             "Use a directory that holds config.json and weights, or a hub id reachable from this "
                             "machine; unset it to use a frozen copy of the starting model.") from None
    return model.requires_grad_(False).eval()


def bnb_config(section: QuantizationSection, fsdp: bool = False):
    """bitsandbytes' config for ``model.quantization``. Under FSDP 4-bit weights are stored in the compute dtype
    (``bnb_4bit_quant_storage``): FSDP shards a parameter as a tensor of its storage dtype, and the default uint8
    packing does not survive FSDP2's DTensor conversion (accelerate's ``fsdp2_prepare_model`` then leaves such
    weights out of sharding, unsharded on every process, and says to "set bnb_4bit_quant_storage to a floating
    dtype"); the float storage holds the same packed bits, so the weights and the adapter trained on them are the
    same."""
    import torch
    from transformers import BitsAndBytesConfig

    if section.bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    compute = getattr(torch, section.compute_dtype)
    storage = {"bnb_4bit_quant_storage": compute} if fsdp else {}
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=section.quant_type,
        bnb_4bit_use_double_quant=section.double_quant,
        bnb_4bit_compute_dtype=compute,
        **storage,
    )


def _explain(section: ModelSection, what: str, exc: Exception) -> str:
    return (f"model.name: could not load the {what} from {section.name!r}: {first_line(exc)}. "
            "Use a local directory that holds config.json and tokenizer files, or a hub id reachable "
            "from this machine (log in with `hf auth login` for gated models).")
