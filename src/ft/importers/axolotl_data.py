"""Axolotl's data keys → ft's ``data:``: the datasets (``datasets``, ``test_datasets``, ``pretraining_dataset``),
the held-out share, sequence length, packing, loss masking, the chat template and the prepared cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..recipe.data_section import template_variable_problem
from ..recipe.methods import DEFAULT_METHOD, METHODS, readers
from .axolotl_keys import ENTRY_EXPECTED, Ctx, handles, misfit, number
from .axolotl_types import Reading, nearest, reading
from .axolotl_vision import IMAGE_ROWS, NOT_PACKED, TEXT_TEMPLATES

LOADERS = ("json", "csv", "parquet", "text", "arrow")  # `path: json` + data_files: a datasets builder name
FT_ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}  # Axolotl's default role names beyond ft's own

# dataset-entry keys ft has no equivalent for, and why
ENTRY_REASONS = {
    "drop_system_message": "ft keeps system messages; drop them from the data, or use a chat template without them",
    "split_thinking": "ft does not split reasoning out of a message's content (a <think>…</think> there stays part "
                      "of the answer's text): it reads the reasoning from its own key (`reasoning_content`, or the "
                      "one field_thinking names); move the reasoning there once, in the data",
    "field_system": "ft's formats have no per-row system field",
    "message_field_training": "ft trains every assistant turn (data.train_on), not a per-message choice",
    "message_field_training_detail": "ft trains every assistant turn, not character spans",
    "shards": "ft reads the whole source (`fraction:` takes a seeded random share)",
    "shards_idx": "ft reads the whole source (`fraction:` takes a seeded random share)",
    "preprocess_shards": "ft tokenizes a source in one pass",
    "trust_remote_code": "ft loads datasets without running a dataset's own code",
    "input_transform": "ft reads rows as they are",
    "skip": "ft reads a source from its first row",
    "logprobs_field": "ft trains on the data's text, not on given log-probabilities (distillation)",
    "temperature": "ft trains on the data's text, not on given log-probabilities (distillation)",
    "conversation": "a FastChat conversation template; ft renders with data.chat_template",
}

# dataset-entry keys that name a column: {format: the ft name they rename}
FIELD_KEYS = {"field_messages": {"chat": "messages", "preference": "prompt"}, "field_chosen": {"preference": "chosen"},
              "field_rejected": {"preference": "rejected"}, "field": {"text": "text"}, "text_column": {"text": "text"}}
# what ft's chat format reads of a message (ft.data.formats: role, content and CHAT_KEYS; a test holds them equal)
MESSAGE_KEYS = ("role", "content", "tool_calls", "reasoning_content", "tool_call_id", "name")
# dataset-entry keys naming where a chat row keeps what ft reads beside its messages: {key: the ft name it maps in
# `fields:`}; Axolotl's default for each is that very name
CHAT_FIELDS = {"field_thinking": "reasoning_content", "field_tools": "tools"}
THINKING_KEY = "reasoning_content"  # the name under which ft hands an assistant's reasoning to the chat template
# dataset-entry keys ft follows only at Axolotl's default value: (that value, why another is not carried)
DEFAULT_ONLY = {
    "roles_to_train": (["assistant"], "ft trains the assistant turns; data.train_on: all trains every token, there is "
                       "no list of roles"),
    "train_on_eos": ("turn", "ft trains the end-of-turn token after each assistant turn; nothing else"),
    "train_on_eot": ("turn", "ft trains the end-of-turn token after each assistant turn; nothing else"),
}


@handles("datasets", "test_datasets", "pretraining_dataset")
def datasets(ctx: Ctx) -> None:
    train: list[dict] = []
    # a pretraining dataset is read as Axolotl reads it without `rl:`, by the method it then trains (SFT)
    for key, target, method in (("datasets", "data.train", ctx.method),
                                ("pretraining_dataset", "data.train", DEFAULT_METHOD),
                                ("test_datasets", "data.eval", ctx.method)):
        sources = train if target == "data.train" else []
        for prefix, entry in _entries(ctx, key):
            source = _source(ctx, prefix, entry, method, f"{target}.{len(sources)}", key == "pretraining_dataset")
            if source:
                sources.append(source)
        if sources:
            ctx.draft.set(target, sources)


def _entries(ctx: Ctx, key: str) -> list[tuple[str, Any]]:
    """(ledger prefix, entry) for each dataset under ``key``: a list, or one dataset written as a mapping."""
    value = ctx.get(key)
    if isinstance(value, dict):
        return [(key, value)]
    return [(f"{key}.{i}", entry) for i, entry in enumerate(value or [])]


def _source(ctx: Ctx, prefix: str, entry: Any, method: str, where: str, pretraining: bool) -> dict | None:
    """One Axolotl dataset entry as the ft source at ``where``, each of its keys recorded under ``prefix.<key>``."""
    if not isinstance(entry, dict) or not entry.get("path"):
        ctx.skip(prefix, "a dataset entry needs a `path`")
        return None
    source: dict = {"path": _path(ctx, prefix, entry, where)}
    kind = entry.get("type") or ("pretrain" if pretraining else None)
    if kind is not None and misfit(ENTRY_EXPECTED, "type", kind):
        found = Reading(nearest(method))
        ctx.skip(f"{prefix}.type", f"{misfit(ENTRY_EXPECTED, 'type', kind)}. The source is kept with the nearest ft "
                 f"format, `{found.format}`")
    elif isinstance(kind, dict):
        found = _user_defined(ctx, f"{prefix}.type", kind, method, where)
    elif isinstance(kind, str):
        found = reading(kind, method)
        if found.missing:
            ctx.skip(f"{prefix}.type", f"{found.missing}. The source is kept with the nearest ft format, "
                     f"`{found.format}`: check its fields")
        else:
            images = IMAGE_ROWS if ctx.modality == "vision" and found.format == "chat" else ""
            ctx.carry(f"{prefix}.type", (f"{where}.format",), "; ".join(filter(None, (found.note, images))))
    else:
        found = Reading(nearest(method))
        ctx.skip(f"{prefix}.type", "no `type:`: Axolotl reads such a dataset as already tokenized (input_ids, labels); "
                 f"ft tokenizes rows itself. The source is kept with the nearest ft format, `{found.format}`")
    source["format"] = found.format
    if found.fields:
        source["fields"] = dict(found.fields)
    for key, value in entry.items():
        if key not in ("path", "type", "data_files", "ds_type"):
            _entry_key(ctx, prefix, where, key, value, source, entry)
    if source["format"] == "chat" and not entry.get("roles") and source.get("fields", {}).get("role", "role") != "role":
        source["roles"] = dict(SHAREGPT_ROLES)  # Axolotl's default role names (ShareGPT's human/gpt)
    if pretraining:
        ctx.carry(f"{prefix}.path", (f"{where}.path",), "ft downloads and tokenizes the whole dataset before training "
                  "(Axolotl streams it); pick a split slice or `fraction:` for a large corpus")
    return source


def _path(ctx: Ctx, prefix: str, entry: dict, where: str) -> str:
    path, files = str(entry["path"]), entry.get("data_files")
    if files is not None:
        one = files if isinstance(files, str) else (files[0] if isinstance(files, list) and len(files) == 1 else None)
        if path in LOADERS and one is not None:
            ctx.carry(f"{prefix}.path", (f"{where}.path",))
            ctx.carry(f"{prefix}.data_files", (f"{where}.path",), f"the file itself is the ft source path (Axolotl: "
                      f"the `{path}` builder reading it)")
            return str(one)
        ctx.skip(f"{prefix}.data_files", "ft reads a whole hub dataset, or one local file (.jsonl, .json, .parquet, "
                 ".csv, .txt): download the files and point `path` at one")
    if "ds_type" in entry:
        ctx.off(f"{prefix}.ds_type", "ft picks the reader from the file's suffix")
    ctx.carry(f"{prefix}.path", (f"{where}.path",))
    return path


def _user_defined(ctx: Ctx, key: str, spec: dict, method: str, where: str) -> Reading:
    """A ``type:`` mapping (Axolotl's user-defined format): its field names carry, its format strings do not."""
    fmt = "instruction" if "instruction" in METHODS[method].formats else "preference"
    names = {"instruction": "field_instruction", "input": "field_input", "output": "field_output"} if fmt == \
        "instruction" else {"prompt": "field_prompt", "chosen": "field_chosen", "rejected": "field_rejected"}
    fields = {ft: spec[ax] for ft, ax in names.items() if isinstance(spec.get(ax), str) and spec[ax] != ft}
    formats = sorted(k for k in spec if k not in names.values() and spec[k] not in (None, ""))
    why = f"the field names carry; {', '.join(formats)} (prompt text of your own) do not: ft renders rows through " \
          "the chat template" if formats else ""
    ctx.carry(key, (f"{where}.format", f"{where}.fields"), why)
    return Reading(fmt, fields)


def _entry_key(ctx: Ctx, prefix: str, where: str, key: str, value: Any, source: dict, entry: dict) -> None:
    full = f"{prefix}.{key}"
    fmt, fields = source["format"], source.setdefault("fields", {})
    if value is None or value == "" or value == [] or value == {}:
        ctx.off(full, "empty")
    elif misfit(ENTRY_EXPECTED, key, value):
        ctx.skip(full, misfit(ENTRY_EXPECTED, key, value))
    elif key in ("split", "name", "revision"):
        source[key] = str(value)
        ctx.carry(full, (f"{where}.{key}",))
    elif key in FIELD_KEYS and fmt in FIELD_KEYS[key]:
        name = FIELD_KEYS[key][fmt]
        if str(value) != name:
            fields[name] = str(value)
        ctx.carry(full, (f"{where}.fields",))
    elif key in ("message_property_mappings", "message_field_role", "message_field_content") and fmt in (
            "chat", "preference"):
        _message_keys(ctx, full, key, value, fields, where)
    elif key == "roles" and fmt in ("chat", "preference"):
        _roles(ctx, full, value, source, where)
    elif key in ("chat_template", "chat_template_jinja"):
        if value in ("tokenizer_default", ctx.get("chat_template"), ctx.get("chat_template_jinja")):
            ctx.off(full, "the same as the config's own")
        else:
            ctx.skip(full, "ft renders every source with the one data.chat_template")
    elif key in CHAT_FIELDS or key == "template_thinking_key":
        _chat_field(ctx, full, key, str(value), fmt, fields, where)
    elif key in DEFAULT_ONLY:
        wanted, why = DEFAULT_ONLY[key]
        if value == wanted:
            ctx.same(full, why.split(";")[0])
        else:
            ctx.skip(full, why)
    elif key in ENTRY_REASONS:
        if value is False:
            ctx.off(full, "off")
        else:
            ctx.skip(full, ENTRY_REASONS[key])
    elif key.startswith(("field", "message_")):
        ctx.off(full, f"not read by `type: {entry.get('type')}`")
    else:
        ctx.skip(full, "no ft equivalent")
    if not fields:
        source.pop("fields")


def _message_keys(ctx: Ctx, full: str, key: str, value: Any, fields: dict, where: str) -> None:
    if key != "message_property_mappings":
        if str(value) != key.removeprefix("message_field_"):
            fields[key.removeprefix("message_field_")] = str(value)
        ctx.carry(full, (f"{where}.fields",))
        return
    if not isinstance(value, dict):
        ctx.skip(full, "expected a mapping such as {role: from, content: value}")
        return
    fields.update({name: str(column) for name, column in value.items() if name in MESSAGE_KEYS and column != name})
    extra = sorted(name for name in value if name not in MESSAGE_KEYS)
    ctx.carry(full, (f"{where}.fields",), f"ft's chat format reads {', '.join(MESSAGE_KEYS)} of a message; "
              f"{', '.join(extra)} not passed to the template" if extra else "")


def _chat_field(ctx: Ctx, full: str, key: str, value: str, fmt: str, fields: dict, where: str) -> None:
    """``field_thinking`` (the message key holding an assistant's reasoning) and ``field_tools`` (the row column
    holding its tool definitions) as the source's ``fields:`` names for ``reasoning_content`` and ``tools``;
    ``template_thinking_key`` (the key the chat template reads the reasoning under) only as ``reasoning_content``,
    the one ft hands it. ft reads reasoning and tools in the chat rows of text models only."""
    if fmt != "chat" or ctx.modality == "vision":
        rows = f"`{fmt}` rows" if fmt != "chat" else "a vision-language model's chats"
        ctx.skip(full, f"ft reads reasoning and tool definitions in text models' chat rows only, not in {rows}")
    elif key == "template_thinking_key" and value != THINKING_KEY:
        ctx.skip(full, f"ft hands the reasoning to the chat template as `{THINKING_KEY}` only; a template that reads "
                 f"it as `{value}` (as gpt-oss's does with `thinking`) writes none of it, and ft refuses such rows by "
                 f"name (the template drops their reasoning): use a template that reads `{THINKING_KEY}` "
                 "(data.chat_template)")
    elif key == "template_thinking_key":
        ctx.same(full, f"the template reads the reasoning as `{THINKING_KEY}`")
    elif value == CHAT_FIELDS[key]:
        ctx.same(full, f"ft reads `{value}`")
    else:
        fields[CHAT_FIELDS[key]] = value
        ctx.carry(full, (f"{where}.fields",))


def _roles(ctx: Ctx, full: str, value: Any, source: dict, where: str) -> None:
    """Axolotl writes {ft role: [source roles]}; ft writes {source role: ft role}."""
    if not isinstance(value, dict):
        ctx.skip(full, "expected a mapping {role: [names in the data]}")
        return
    unknown = sorted(str(target) for target in value if target not in FT_ROLES)
    if unknown:
        ctx.skip(full, f"ft's roles are {', '.join(FT_ROLES)}; {', '.join(unknown)} is not one of them")
        return
    names = {str(name): target for target, names in value.items() for name in (names or []) if name != target}
    if names:
        source["roles"] = names
    ctx.carry(full, (f"{where}.roles",))


@handles("val_set_size")
def val_set_size(ctx: Ctx) -> None:
    share = number(ctx.get("val_set_size"))
    if ctx.has("test_datasets"):
        ctx.off("val_set_size", "test_datasets gives the evaluation data")
    elif not isinstance(share, (int, float)) or isinstance(share, bool) or share < 0:
        ctx.skip("val_set_size", "expected a share of the training rows, e.g. 0.05")
    elif share == 0:
        ctx.same("val_set_size", "no evaluation data")
    elif share < 1:
        ctx.put("val_set_size", "data.eval", {"split_ratio": share})
    else:
        ctx.skip("val_set_size", "ft holds out a share of the training rows (data.eval.split_ratio, below 1), not a "
                 "number of rows; write the share")


def has_eval(ctx: Ctx) -> bool:
    """Whether the config evaluates on data: a held-out share, or test datasets."""
    share = number(ctx.get("val_set_size", 0))
    return bool(ctx.get("test_datasets")) or (isinstance(share, (int, float)) and 0 < share < 1)


@handles("sequence_len", "excess_length_strategy")
def sequence_len(ctx: Ctx) -> None:
    if ctx.has("sequence_len"):
        ctx.put("sequence_len", "data.max_length", number(ctx.get("sequence_len")))
    strategy = ctx.get("excess_length_strategy")
    if strategy in ("drop", "truncate"):
        ctx.put("excess_length_strategy", "data.truncation", strategy)
    elif strategy is not None:
        ctx.skip("excess_length_strategy", "ft cuts longer rows (truncate) or drops them (drop), counting both; it "
                 "has no `raise`")


@handles("sample_packing", "eval_sample_packing", "pad_to_sequence_len")
def packing(ctx: Ctx) -> None:
    packing_on = ctx.get("sample_packing") is True
    packable = "data.packing" in METHODS[ctx.method].reads and ctx.modality != "vision"
    if ctx.has("sample_packing"):
        if not packing_on:
            ctx.same("sample_packing", "data.packing: false" + (f"; {NOT_PACKED}" if ctx.modality == "vision" else ""))
        elif packable:
            ctx.put("sample_packing", "data.packing", True, "TRL's packing (bin-fitting whole rows, each attending "
                    "to itself), not Axolotl's multipack sampler")
        elif ctx.modality == "vision":
            ctx.skip("sample_packing", NOT_PACKED)
        else:
            packs = " and ".join(name.upper() for name in readers("data.packing"))
            ctx.skip("sample_packing", f"ft packs {packs} rows only; method `{ctx.method}` trains unpacked")
    if ctx.has("eval_sample_packing"):
        value = ctx.get("eval_sample_packing") is True
        if packing_on and packable:
            ctx.train("eval_sample_packing", "eval_packing", value)
        else:
            ctx.off("eval_sample_packing", "no packing in this recipe")
    if ctx.has("pad_to_sequence_len"):
        (ctx.skip if ctx.get("pad_to_sequence_len") is True else ctx.off)(
            "pad_to_sequence_len", "ft pads each batch to its longest row (packed rows fill max_length)"
            if ctx.get("pad_to_sequence_len") is True else "off")


@handles("train_on_inputs")
def train_on_inputs(ctx: Ctx) -> None:
    if ctx.get("train_on_inputs") is not True:
        ctx.same("train_on_inputs", "data.train_on: assistant")
    elif METHODS[ctx.method].ft_tokenizes:  # data.train_on shapes the masks of rows ft tokenizes
        ctx.put("train_on_inputs", "data.train_on", "all")
    else:
        ctx.skip("train_on_inputs", f"TRL's `{ctx.method}` trainer puts the loss on completions only")


@handles("dataset_prepared_path", "dataset_processes", "dataset_num_proc", "shuffle_merged_datasets")
def preparation(ctx: Ctx) -> None:
    if ctx.has("dataset_prepared_path"):
        ctx.put("dataset_prepared_path", "data.prepared_path", str(ctx.get("dataset_prepared_path")),
                "ft's own tokenized cache (`ft preprocess` writes it, `ft train` reuses it), not Axolotl's")
    for key in ("dataset_num_proc", "dataset_processes"):
        if ctx.has(key):
            if key == "dataset_processes" and ctx.has("dataset_num_proc"):
                ctx.off(key, "dataset_num_proc decides")
            else:
                ctx.put(key, "data.num_proc", number(ctx.get(key)))
    if ctx.has("shuffle_merged_datasets"):
        if ctx.get("shuffle_merged_datasets") is False:
            ctx.skip("shuffle_merged_datasets", "ft's trainer shuffles the training rows; to keep their order set "
                     "`train.train_sampling_strategy: sequential`")
        else:
            ctx.same("shuffle_merged_datasets", "the trainer shuffles the rows")


@handles("chat_template_kwargs")
def chat_template_kwargs(ctx: Ctx) -> None:
    """Each variable carried on its own: one ft cannot take (a name the template is handed by ft itself) is named as
    not carried, and the others still come."""
    kwargs = ctx.get("chat_template_kwargs")
    if not isinstance(kwargs, dict):
        ctx.skip("chat_template_kwargs", "expected a mapping of template variable names to values")
        return
    for name, value in kwargs.items():
        problem = template_variable_problem(str(name))
        if problem:
            ctx.skip(f"chat_template_kwargs.{name}", f"`{name}` {problem}")
        else:
            ctx.put(f"chat_template_kwargs.{name}", f"data.chat_template_kwargs.{name}", value,
                    "written into the chat template as the default of its variable, so the template the run ships "
                    "(and `ft generate`) renders with it too, not only training as in Axolotl")


@handles("chat_template", "chat_template_jinja")
def chat_template(ctx: Ctx) -> None:
    name, jinja = ctx.get("chat_template"), ctx.get("chat_template_jinja")
    if jinja is not None:
        text = _jinja(str(jinja))
        if text is None:
            ctx.skip("chat_template_jinja", "not a Jinja template, nor a file holding one")
        else:
            ctx.put("chat_template_jinja", "data.chat_template", text)
        if name is not None:
            ctx.off("chat_template", "chat_template_jinja decides")
        return
    if name is None:
        return
    name = str(name)
    if name in ("chatml", "llama3") and ctx.modality == "vision":
        ctx.skip("chat_template", TEXT_TEMPLATES)
    elif name in ("chatml", "llama3"):
        ctx.put("chat_template", "data.chat_template", name)
    elif name == "tokenizer_default" or name.startswith("tokenizer_default_fallback_"):
        ctx.same("chat_template", "the tokenizer's own template" + ("" if name == "tokenizer_default" else
                 "; without one, set data.chat_template (Axolotl falls back to " + name.rsplit("_", 1)[-1] + ")"))
    else:
        own = "the processor's" if ctx.modality == "vision" else "the tokenizer's"
        ctx.skip("chat_template", f"ft has no built-in `{name}` (of Axolotl's names it builds in chatml and llama3); "
                 f"the recipe uses {own} own "
                 f"template (ft's default: for this model family's instruct models usually `{name}` itself), or "
                 "paste the Jinja text into data.chat_template")


def _jinja(value: str) -> str | None:
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    try:
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
    except OSError:
        return None
    return text if "{{" in text or "{%" in text else None
