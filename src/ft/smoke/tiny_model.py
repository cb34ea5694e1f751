"""The tiny model ``--smoke`` trains: a random model of the recipe's family, 2 layers of width 64 (``TINY``).

The real config (a local directory, the HF cache, the hub when online) is shrunk to ``TINY`` and keeps the family's
own fields (rope scaling, sliding windows, soft-capping, …), with the real tokenizer and its chat template. Where
they cannot be read, the shipped ``assets/tiny-<family>/`` of this package (config and tokenizer with the family's
special tokens and chat template, written by ``scripts/make_tiny_model.py``) stands in: the family the real config's
model_type names, else the model name (``FAMILY_WORDS``). The assets are package data, read through
``importlib.resources``, so an installed ft finds them wherever it is installed.
"""

from __future__ import annotations

import copy
import importlib.resources
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..model.loading import ModelLoadError, names_a_path
from ..recipe import Problem
from ..recipe.adapter import AdapterSection
from ..recipe.errors import first_line

# family -> its folder under this package's assets/
FAMILIES = {"llama": "tiny-llama3", "qwen2": "tiny-qwen2", "mistral": "tiny-mistral", "gemma": "tiny-gemma"}
# a real config's model_type -> the family whose shipped tokenizer stands in when the real one cannot be read
FAMILY_OF_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen2_moe": "qwen2", "qwen3": "qwen2", "qwen3_moe": "qwen2",
                  "mistral": "mistral", "mixtral": "mistral", "ministral": "mistral", "gemma": "gemma",
                  "gemma2": "gemma", "gemma3_text": "gemma"}
# a word in model.name -> its family, when not even the config can be read (the earliest word in the name wins)
FAMILY_WORDS = {"llama": "llama", "qwen": "qwen2", "mistral": "mistral", "mixtral": "mistral", "gemma": "gemma"}
DEFAULT_FAMILY = "llama"  # a model another run has not written yet, with no recipe here that writes it

# the sizes a real config is shrunk to (never larger than it was); the shipped family assets have them too
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128}
TINY_MOE = {"num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 128}


class UnknownFamily(Exception):
    """No tiny model can stand in: the real config or tokenizer cannot be read and no family is known (a problem
    of ``model.name``)."""


@dataclass
class StandIn:
    """The tiny model, its tokenizer and generation config, and where each came from (summary.json's ``smoke``)."""

    model: object
    tokenizer: object
    generation: object | None
    described: dict

    @property
    def model_type(self) -> str:
        return self.described["model_type"]

    def save(self, folder: Path) -> None:
        """Weights, config, tokenizer and generation config, as a model directory ``init: pretrained`` loads."""
        folder.mkdir(parents=True)
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        if self.generation is not None:
            self.generation.save_pretrained(folder)


    def save_as_scorer(self, folder: Path, seed: int) -> None:
        """A random sequence classifier with one score of the same tiny config, with the tokenizer: the stand-in for a
        reward model (``rewards: [{model: ...}]``), which TRL runs with its own tokenizer and chat template."""
        import torch
        from transformers import AutoModelForSequenceClassification

        config = copy.deepcopy(self.model.config)
        config.num_labels = 1
        config.pad_token_id = self.tokenizer.pad_token_id
        torch.manual_seed(seed)
        scorer = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
        folder.mkdir(parents=True)
        scorer.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)


def asset(family: str) -> Path:
    """The shipped asset folder of ``family`` (``assets/<FAMILIES[family]>`` of this package), on disk."""
    resource = importlib.resources.files(__package__) / "assets" / FAMILIES[family]
    if not resource.joinpath("config.json").is_file():
        raise ModelLoadError(f"model.name: the smoke test needs ft's shipped tiny {family} model "
                             f"(assets/{FAMILIES[family]} of the ft.smoke package), which is missing from this "
                             "installation of ft; reinstall ft, or make the real config and tokenizer of the "
                             "recipe's model readable here instead.")
    return Path(str(resource))


def stand_in(name: str, revision: str | None, trust_remote_code: bool, seed: int, notes: list[str],
             named: str | None = None, gguf_file: str | None = None, tokens: dict[str, str] | None = None) -> StandIn:
    """A tiny random model for the model ``name`` (``gguf_file``: its config and tokenizer are a GGUF file's;
    ``named``: as the recipe names it, for messages; ``notes``: what was found out about it so far; ``tokens``: the
    tokens the recipe names, ``train.pad_token`` and the like, which a shipped tokenizer standing in for the real one
    is given where it lacks them). Raises UnknownFamily or ModelLoadError."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    named = named or name
    kwargs = {"revision": revision, "trust_remote_code": trust_remote_code,
              **({"gguf_file": gguf_file} if gguf_file else {})}
    config, config_error = _attempt(lambda: AutoConfig.from_pretrained(name, **kwargs))
    tokenizer, tokenizer_error = _attempt(lambda: AutoTokenizer.from_pretrained(name, **kwargs))
    family = FAMILY_OF_TYPE.get(config.model_type) if config is not None else family_from_name(name)
    if family is None and config is None and names_a_path(name):
        family = DEFAULT_FAMILY
        notes.append(f"{name} does not exist and no recipe next to this one writes it, so its family is unknown: "
                     f"the {DEFAULT_FAMILY} asset stands in")
    if family is None and (config is None or tokenizer is None):
        missing = (f"its config cannot be read ({config_error})" if config is None
                   else f"its tokenizer cannot be read ({tokenizer_error}) and ft ships no tiny tokenizer for "
                        f"model_type {config.model_type!r}")
        raise UnknownFamily(f"the smoke test cannot tell what tiny model stands in for {named!r}: {missing}, and its "
                            f"name names none of the families ft ships tiny assets for ({', '.join(FAMILIES)}). Make "
                            "the real config and tokenizer readable here (a local directory, or the HF cache).")
    described = {"family": family, "config": None, "tokenizer": None, "notes": notes}
    shipped = f"shipped assets/{FAMILIES[family]}" if family is not None else ""

    generation = None
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(asset(family))
        generation = GenerationConfig.from_pretrained(asset(family))
        described["tokenizer"] = f"{shipped} (the real one cannot be read: {tokenizer_error})"
        vocabulary = tokenizer.get_vocab()
        lacking = {key: token for key, token in (tokens or {}).items() if token not in vocabulary}
        if lacking:  # the real tokenizer is expected to have them: a real run checks (model.loading.token_problems)
            tokenizer.add_tokens(sorted(set(lacking.values())), special_tokens=True)
            notes.append("the shipped tokenizer is given the recipe's " + ", ".join(
                f"train.{key} {token!r}" for key, token in lacking.items()) + ", which it lacks (a real run checks "
                "that the real tokenizer has it)")
    else:
        described["tokenizer"] = f"the real one ({name})"
        generation, _ = _attempt(lambda: GenerationConfig.from_pretrained(name, **kwargs))
    tiny = None
    if config is not None:
        try:
            tiny, changed = shrink(config)
            described["config"] = f"the real one ({name}), shrunk: " + (", ".join(changed) or "already tiny")
        except Exception as exc:  # a config class that refuses the tiny sizes: the family asset, when there is one
            if family is None:
                raise ModelLoadError(f"model.name: the smoke test could not shrink the config of {name!r} "
                                     f"({first_line(exc)}).") from None
            config_error = f"shrinking it failed: {first_line(exc)}"
    if tiny is None:
        tiny = AutoConfig.from_pretrained(asset(family))
        described["config"] = f"{shipped} (the real one cannot be read: {config_error})"
    text = tiny.get_text_config()
    if described["config"].startswith("shipped") != described["tokenizer"].startswith("shipped"):
        # config and tokenizer from two places: the tokenizer's vocabulary and special tokens
        text.vocab_size = (len(tokenizer) + 7) // 8 * 8
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            setattr(text, key, getattr(tokenizer, key, None))
    text.vocab_size = max(text.vocab_size or 0, (len(tokenizer) + 7) // 8 * 8)

    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(tiny, dtype=torch.float32, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(f"model.name: the smoke test could not build a tiny model from the config of "
                             f"{name!r} ({first_line(exc)}).") from None
    described["model_type"] = tiny.model_type
    described["parameters"] = sum(p.numel() for p in model.parameters())
    return StandIn(model, tokenizer, generation, described)


def _attempt(load: Callable):
    try:
        return load(), None
    except Exception as exc:  # unreachable, gated, missing, malformed: the caller falls back and says why
        return None, first_line(exc)


def family_from_name(name: str) -> str | None:
    lowered = name.lower()
    found = [(lowered.find(word), family) for word, family in FAMILY_WORDS.items() if word in lowered]
    return min(found)[1] if found else None


def shrink(config) -> tuple[object, list[str]]:
    """A copy of ``config`` at the smoke sizes (never larger than it was), with what changed. The family's own
    fields (rope scaling, sliding windows, soft-capping, …) stay; per-layer lists are cut to the new depth."""
    values = config.to_dict()
    changed: list[str] = []
    _shrink_dict(values, changed, "")
    return type(config).from_dict(values), changed


def _shrink_dict(values: dict, changed: list[str], prefix: str) -> None:
    def put(key: str, value) -> None:
        if key in values and values[key] is not None and values[key] != value:
            changed.append(f"{prefix}{key} {values[key]} -> {value}")
            values[key] = value

    if "num_hidden_layers" in values and "hidden_size" in values:
        layers = min(values["num_hidden_layers"], TINY["num_hidden_layers"])
        heads = min(values.get("num_attention_heads") or TINY["num_attention_heads"], TINY["num_attention_heads"])
        kv = values.get("num_key_value_heads")
        if kv is not None:
            kv = heads if kv >= values.get("num_attention_heads", kv) else min(kv, TINY["num_key_value_heads"], heads)
            while heads % kv:
                kv -= 1
        hidden = min(values["hidden_size"], TINY["hidden_size"])
        put("num_hidden_layers", layers)
        put("hidden_size", hidden)
        put("num_attention_heads", heads)
        put("num_key_value_heads", kv)
        put("head_dim", hidden // heads)
        put("intermediate_size", min(values.get("intermediate_size") or 0, TINY["intermediate_size"]))
        for key, tiny in TINY_MOE.items():
            if isinstance(values.get(key), int):
                put(key, min(values[key], tiny))
        if isinstance(values.get("layer_types"), list):
            put("layer_types", values["layer_types"][:layers])
        if isinstance(values.get("max_window_layers"), int):
            put("max_window_layers", min(values["max_window_layers"], layers))
    for key in ("text_config",):  # a multimodal config's language model
        if isinstance(values.get(key), dict):
            _shrink_dict(values[key], changed, f"{prefix}{key}.")


def adapter_problems(adapter: AdapterSection | None, stand: StandIn, name: str) -> list[Problem]:
    """``adapter.target_modules`` and ``modules_to_save`` must name modules the model has (matched as PEFT does);
    a real run fails when PEFT finds none, or quietly trains fewer layers when it finds only some. When the stand-in's
    config is a shipped one (the real config of ``name`` unreadable here), a missing module may be the stand-in's
    fault rather than the recipe's: the message says so."""
    if adapter is None or adapter.path:
        return []
    problems = _missing_modules(adapter, stand.model, stand.model_type)
    if problems and stand.described["config"].startswith("shipped"):
        family = stand.described["family"]
        guess = (f" This stand-in is ft's shipped tiny {family} model ({FAMILIES[family]}), chosen from the name "
                 f"{name!r} because the real config cannot be read here: the real model may be another architecture "
                 "(a mixture of experts with shared_expert layers, a vision-language model), so these names may be "
                 f"right. Make its config readable here (`hf download {name} config.json` where the Hub is "
                 "reachable, then copy the HF cache; or a local model directory) and the stand-in is built from it.")
        problems = [Problem(p.path, p.message + guess) for p in problems]
    return problems


def _missing_modules(adapter: AdapterSection, model, model_type: str) -> list[Problem]:
    import torch

    names = [name for name, _ in model.named_modules() if name]
    linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                     if isinstance(module, torch.nn.Linear)})
    problems = []
    targets = adapter.target_modules
    if isinstance(targets, str) and targets != "all-linear":
        if not any(re.fullmatch(targets, name) for name in names):
            problems.append(Problem("adapter.target_modules", f"the regular expression {targets!r} matches no module "
                                    f"name of a {model_type} model (e.g. {names[len(names) // 2]}); its linear "
                                    f"layers are {', '.join(linear)}."))
    elif isinstance(targets, list):
        missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
        if missing:
            problems.append(Problem("adapter.target_modules", f"{', '.join(missing)}: no such module in a "
                                    f"{model_type} model, whose linear layers are {', '.join(linear)}. (A real run "
                                    "fails when PEFT finds none of the names, and trains fewer layers than meant "
                                    "when it finds only some.)"))
    missing = [t for t in adapter.modules_to_save or [] if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        top = sorted({n.rsplit(".", 1)[-1] for n in names if n.count(".") <= 1})
        problems.append(Problem("adapter.modules_to_save", f"{', '.join(missing)}: no such module in a {model_type} "
                                f"model (its top-level modules: {', '.join(top)})."))
    return problems


