"""The model card (README.md) a run writes beside its checkpoints and final/, and pushes to the Hub.

TRL's trainers write a card from a template that names the base by the model config's ``_name_or_path`` when it is a
hub id, and leaves it ``None`` otherwise: a model read from a GGUF file, from a local folder, from a run, or built
with random weights got "a fine-tuned version of [None](https://huggingface.co/None)". The trainer's
``create_model_card`` (``FtTrainerMixin``) writes this one instead, from the recipe: the base as the recipe names it
(a hub repository linked, and in the card's ``base_model`` metadata, which the Hub accepts only for a repository
id; a GGUF file, a folder or a run named in the text), the method and its TRL trainer, the adapter, the data, and
how to use the model. It is written with huggingface_hub's ``ModelCard``, so its metadata is the Hub's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..model.loading import names_a_path
from ..recipe import Recipe


@dataclass(frozen=True)
class CardFacts:
    """What the card says of a run, read from its recipe (``card_facts``)."""

    base: str  # a Markdown phrase naming the base model as the recipe names it
    base_model: str | None  # the base's hub repository id, for the card's metadata; None for a local base
    method: str
    adapter: str | None  # "LoRA (r=8)", "QLoRA (4-bit, r=16)", or None for full fine-tuning
    data: tuple[str, ...]  # the training sources: a hub dataset's id, a local file's name (not where it was)
    datasets: tuple[str, ...]  # those that are hub datasets (the card's ``datasets`` metadata)


def card_facts(recipe: Recipe) -> CardFacts:
    """The card's facts for ``recipe``: the base as it names it, its method, adapter and training data."""
    model = recipe.model
    hub = _on_hub(model.name)
    where = f"[{model.name}](https://huggingface.co/{model.name})" if hub else f"`{model.name}`"
    revision = f" (revision `{model.revision}`)" if model.revision else ""
    if model.gguf_file:
        base = f"the GGUF file `{model.gguf_file}` in {where}{revision}, de-quantized"
    elif model.init == "random":
        base = f"a model of {where}'s config with random weights"
    elif hub:
        base = f"{where}{revision}"
    else:
        base = f"the local model {where}"
    adapter = None
    if recipe.adapter is not None:
        kind = "QLoRA" if model.quantization is not None else "LoRA"
        rank = getattr(recipe.adapter, "r", None)
        adapter = f"{kind}{f' (r={rank})' if rank else ''}"
    paths = [source.path for source in recipe.data.train]
    datasets = tuple(path for path in paths if _on_hub(path))
    return CardFacts(base=base, base_model=model.name if hub and model.init != "random" else None,
                     method=recipe.method, adapter=adapter, datasets=datasets,
                     data=tuple(path if path in datasets else Path(path).name for path in paths))


def write_card(facts: CardFacts, output_dir: Path, model_name: str, trainer_name: str, tags=()) -> Path:
    """README.md in ``output_dir``: the card of the model trained there (``model_name``: its folder's or hub
    repository's name), written with huggingface_hub's ``ModelCard``."""
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(base_model=facts.base_model, datasets=list(facts.datasets) or None,
                         library_name="peft" if facts.adapter else "transformers", model_name=model_name,
                         tags=sorted({"ft", facts.method, *(["lora"] if facts.adapter else []), *tags}))
    how = f"{facts.adapter} adapter" if facts.adapter else "full fine-tuning"
    sources = ", ".join(f"`{path}`" for path in facts.data)
    text = "\n".join([
        "---", data.to_yaml(), "---", "",
        f"# {model_name}", "",
        f"Fine-tuned from {facts.base} by `ft train` (ft {__version__}): method "
        f"`{facts.method}` ({trainer_name}, from TRL), {how}, on {sources}.", "",
        "The run's `recipe.yaml` beside this card is the whole recipe, resolved; `summary.json` holds its losses, "
        "scores and times.", "",
        "## Use", "",
        "```bash",
        "ft generate RUN_DIR --prompt 'Hello'    # RUN_DIR: this folder (its final/)",
        "```", "",
    ])
    path = Path(output_dir) / "README.md"
    ModelCard(text).save(path)
    return path


def _on_hub(name: str) -> bool:
    """``name`` is a hub repository id (``org/name``), not a local path."""
    return not names_a_path(name) and not Path(name).expanduser().exists()
