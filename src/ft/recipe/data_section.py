"""The ``data:`` section: training and evaluation sources, how rows become tokens, the prepared-dataset cache, and
the exact match scored after training.

Relative source paths are resolved against the recipe file's directory; ``prepared_path`` is relative to where
``ft`` runs (an output, like ``train.output_dir``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import Field, PositiveInt, StrictBool, StrictStr, ValidationInfo, field_validator, model_validator

from .base import Section, resolve_input_path
from .names import FORMATS

Number = Union[int, float]
MIX_STOPS = ("first_exhausted", "all_exhausted", "all_exhausted_without_replacement")  # datasets' stopping strategies


class DataSource(Section):
    path: StrictStr = Field(description="A local file (.jsonl/.json/.parquet/.csv/.txt), a `save_to_disk` "
                            "directory, or a hub dataset id.")
    format: Literal[FORMATS] = Field("chat", description="How rows are read: " + ", ".join(FORMATS) + ".")
    split: StrictStr = Field("train", description="Split to read (hub datasets and dataset dicts).")
    name: Optional[StrictStr] = Field(None, description="Hub dataset configuration name.")
    revision: Optional[StrictStr] = Field(None, description="Hub dataset revision (a commit pins the data).")
    fraction: Number = Field(1.0, gt=0, le=1,
                             description="Share of this source's rows to use (sampled with data.seed).")
    fields: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, description="Canonical name -> this source's name, for columns and message keys, "
        "e.g. {messages: conversations, role: from, content: value} for ShareGPT.")
    roles: dict[StrictStr, StrictStr] = Field(
        default_factory=dict,
        description="This source's role names -> canonical roles, e.g. {human: user, gpt: assistant}.")
    weight: Optional[Number] = Field(
        None, ge=0, description="`data.train` only: this source's share of the mixture, relative to the other "
        "sources' weights (give every training source one, or none): rows are drawn from the sources in these "
        "proportions, seeded by data.seed, until data.mix_stop says the mixture ends.")

    resolve_path = field_validator("path")(resolve_input_path)


class SplitRatio(Section):
    split_ratio: Number = Field(gt=0, lt=1, description="Share of the training rows held out for evaluation.")


class ExactMatchSettings(Section):
    """Greedy answers to the first ``n`` held-out prompts, compared with their expected answers (stripped text) at
    the end of ``ft train``; printed and recorded under ``exact_match`` in summary.json."""

    n: PositiveInt = Field(200, description="Held-out prompts to answer (the first n rows).")
    max_new_tokens: Optional[PositiveInt] = Field(
        None, description="Tokens generated per answer. Unset: the longest expected answer's, its end of turn "
        "included, counted with the run's tokenizer before training; set below that, the run stops before training "
        "and names the length needed (an answer cut short is scored wrong).")
    batch_size: PositiveInt = Field(64, description="Prompts generated together.")
    source: Optional[DataSource] = Field(
        None, description="Held-out rows to score instead of `data.eval` (e.g. {path: prompts-eval.jsonl, "
        "format: prompt} for GRPO): chat (last assistant turn), preference (chosen), prompt (`field`), text.")
    field: StrictStr = Field("answer", description="`prompt` rows: the field holding the expected answer.")
    group_by: Optional[StrictStr] = Field(
        None, description="A field of the held-out rows (as written in the data file, any format): exact match is "
        "also given per value of it (summary.json `groups`, `ft report`), e.g. the input's form, to see where the "
        "misses are.")
    before: StrictBool = Field(
        True, description="Also score the model as loaded, before training (summary.json `exact_match_before`): the "
        "baseline the trained figure is read against. Skipped when the run resumes from a checkpoint.")


class ImageSettings(Section):
    """How the images of a vision-language model's rows are sized before its image processor sees them (at most one
    of the two; neither: as stored). Token counts are computed from these sizes when the data is prepared, and the
    images are loaded and resized the same way, a batch at a time, while training."""

    max_pixels: Optional[PositiveInt] = Field(
        None, description="An image with more pixels (width x height) is scaled down to at most this many, its "
        "aspect ratio kept: bounds the image tokens of processors whose count grows with the image (Qwen2-VL, "
        "LLaVA-NeXT), and the time spent resizing large photos.")
    size: Optional[list[PositiveInt]] = Field(
        None, min_length=2, max_length=2,
        description="[width, height]: every image resized to exactly this size (its aspect ratio not kept).")

    @model_validator(mode="after")
    def one_rule(self):
        if self.max_pixels is not None and self.size is not None:
            raise ValueError("set `max_pixels` (scale large images down) or `size` (resize every image), not both")
        return self


class DataSection(Section):
    train: list[DataSource] = Field(min_length=1, description="Training sources, mixed (concatenated, then shuffled "
                                    "by the trainer).")
    eval: Union[list[DataSource], SplitRatio] = Field(
        default_factory=list, description="Evaluation sources, or {split_ratio: 0.05} to hold out training rows.")
    seed: int = Field(42, description="Seed for fractions and split_ratio.")
    max_length: PositiveInt = Field(1024, description="Tokens per sequence.")
    truncation: Literal["truncate", "drop"] = Field(
        "truncate", description="Rows longer than max_length: cut to max_length, or dropped (both counted).")
    packing: StrictBool = Field(False, description="Pack several rows into each sequence (SFT only).")
    train_on: Literal["assistant", "all"] = Field(
        "assistant", description="Which tokens carry loss: assistant turns (chat) / completions (text) only, or all.")
    chat_template: Optional[StrictStr] = Field(
        None, description="Unset: the tokenizer's own; `chatml`, `chatml-tools` (ChatML with tool definitions and "
        "calls, as Hermes and Qwen2.5 write them: <tools> in the system prompt, <tool_call> JSON, <tool_response>; "
        "exact match reads its calls back) or `llama3`; or an inline Jinja template.")
    chat_template_kwargs: dict[StrictStr, Any] = Field(
        default_factory=dict, description="Variables the chat template reads, e.g. {enable_thinking: false} (Qwen3) "
        "or {date_string: 26 Jul 2024} (Llama 3.1): written into the template as their defaults, so that training, "
        "exact match, `ft generate` and the template final/ ships all render with them (a caller's own value still "
        "wins).")
    tools: Optional[Union[StrictStr, list[dict[StrictStr, Any]]]] = Field(
        None, description="Tool (function) definitions the chat template renders for every chat row without a "
        "`tools` field of its own: a JSON file holding a list of JSON schemas (relative to the recipe), or the list "
        "inline, e.g. [{type: function, function: {name: get_weather, description: ..., parameters: {...}}}].")
    train_on_reasoning: StrictBool = Field(
        True, description="Train on the assistant's reasoning (`reasoning_content`, written by the template, e.g. in "
        "<think>); false masks a turn from its start through its reasoning and the tag closing it (</think>), and "
        "the answer and calls after it still train.")
    train_on_tool_calls: StrictBool = Field(
        True, description="Train on the assistant's tool calls (the JSON and tags the template writes for them); "
        "false masks everything a turn writes after its text: the calls and, when the turn is only calls, the turn.")
    num_proc: Optional[PositiveInt] = Field(
        None, description="Processes that tokenize (TRL's `dataset_num_proc` for the methods TRL tokenizes). For SFT, "
        "unset or 1 tokenizes in this process, where the tokenizer uses its own threads.")
    prepared_path: Optional[StrictStr] = Field(
        None, description="Where `ft preprocess` writes the tokenized dataset and `ft train` reads it "
        "(relative to the working directory).")
    require_prepared: StrictBool = Field(
        False, description="Refuse to train when the prepared dataset is missing or stale instead of rebuilding it.")
    on_bad_row: Literal["error", "skip"] = Field(
        "error", description="A row that does not fit its format: stop and list it, or skip it (counted per reason).")
    on_missing_stop: Literal["warn", "error"] = Field(
        "warn", description="Trained turns whose last trained token is not the one that ends a turn (the model would "
        "not learn to stop): warn with the count and an example, or refuse the data (SFT).")
    on_template_mismatch: Literal["warn", "error"] = Field(
        "warn", description="Sampled chat rows whose chat template renders an assistant turn, or the prompt before "
        "it, otherwise when the model is asked for that turn (add_generation_prompt on the turns before it) than in "
        "the training text (earlier turns' reasoning dropped, a date injected, whitespace): warn with the first "
        "differing tokens and the row, or refuse the data (SFT).")
    eval_exact_match: Optional[ExactMatchSettings] = Field(None, description="Greedy exact match after training.")
    image: Optional[ImageSettings] = Field(
        None, description="Vision-language models: how images are sized before the model's image processor (unset: "
        "as stored). docs/vision.md.")
    streaming: StrictBool = Field(
        False, description="Read, tokenize (and pack) the training rows as training consumes them, never holding the "
        "corpus in memory or a cache; each source starts again when it runs out, so `train.max_steps` is needed. "
        "SFT; evaluation sources are still read whole.")
    mix_stop: Literal[MIX_STOPS] = Field(
        "first_exhausted", description="When a weighted mixture of `data.train` sources ends (an epoch): "
        "first_exhausted: when the first source runs out (no row repeats); all_exhausted: when every source has "
        "given all its rows (the others repeat); all_exhausted_without_replacement: when every row has been "
        "drawn once (proportions hold while every source lasts). `train.max_steps` may stop training sooner or "
        "run several epochs of the mixture.")

    @field_validator("tools")
    @classmethod
    def _tools_read(cls, value, info: ValidationInfo):
        """A path is made absolute against the recipe's folder and read now, so that a missing file or a list that is
        not function schemas fails at `ft validate`, not on the GPU machine."""
        if isinstance(value, str):
            path = Path(value)
            if not path.is_absolute():
                path = Path((info.context or {}).get("base_dir", ".")) / path
            tool_file(path)
            return str(path.resolve())
        function_schemas(value)
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, value: dict):
        for name in value:
            problem = template_variable_problem(name)
            if problem:
                raise ValueError(f"{name!r} {problem}")
        return value

    @property
    def tool_list(self) -> list[dict] | None:
        """``tools`` as function schemas (``function_schemas``), read from its file when it names one; None unset."""
        if self.tools is None:
            return None
        return tool_file(Path(self.tools)) if isinstance(self.tools, str) else function_schemas(self.tools)

    @property
    def eval_sources(self) -> list[DataSource]:
        return self.eval if isinstance(self.eval, list) else []

    @property
    def weights(self) -> list[float] | None:
        """The training sources' weights, summing to 1; None when the sources are concatenated (no weights)."""
        given = [source.weight for source in self.train]
        if all(weight is None for weight in given) or None in given or not sum(given):
            return None
        return [weight / sum(given) for weight in given]

    @property
    def has_eval(self) -> bool:
        return bool(self.eval_sources) or isinstance(self.eval, SplitRatio)


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# what apply_chat_template hands the template itself: a `chat_template_kwargs` key of these names would not reach it
RENDER_ARGUMENTS = frozenset({
    "messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template", "tokenize",
    "return_dict", "return_tensors", "return_assistant_tokens_mask", "bos_token", "eos_token", "unk_token",
    "pad_token", "sep_token", "cls_token", "mask_token", "additional_special_tokens"})


def template_variable_problem(name: str) -> str | None:
    """Why ``name`` cannot be a ``data.chat_template_kwargs`` key (said after the name), or None."""
    if not _IDENTIFIER.fullmatch(name):
        return "is not a template variable name (letters, digits and _, not starting with a digit)"
    if name in RENDER_ARGUMENTS:
        return ("is what ft (or transformers) passes to the template itself; set it with its own key (data.tools for "
                "tools), or drop it")
    return None


def function_schemas(tools: object) -> list[dict]:
    """``tools`` (a list of tool definitions) in OpenAI's layout, ``{"type": "function", "function": {"name", …}}``,
    the one chat templates read (a bare ``{"name", "description", "parameters"}`` is wrapped so); a ValueError says
    what is wrong. Shared by ``data.tools``, a row's ``tools`` field and ``ft generate --tools``."""
    if not isinstance(tools, list):
        raise ValueError(f"expected a list of tool definitions, got {_kind(tools)}")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"[{i}]: expected a tool definition (an object), got {_kind(tool)}")
        function = tool.get("function", tool) if tool.get("type", "function") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ValueError(f"[{i}]: expected {{type: function, function: {{name, description, parameters}}}} "
                             f"(or the function alone, with its name), got {json.dumps(tool)[:120]}")
        out.append({**tool, "type": "function", "function": function} if "function" in tool
                   else {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def tool_file(path: Path) -> list[dict]:
    """The function schemas of a JSON file (``function_schemas``); a ValueError names the file and what is wrong."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {path} ({exc.strerror or exc}); give the path of a JSON file holding a list of "
                         "tool definitions, relative to the recipe") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
    try:
        return function_schemas(value)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "text"}.get(type(value), type(value).__name__)
