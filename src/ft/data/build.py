"""The datasets of a run: read → canonical rows → (SFT) tokens, masks and length → cached.

For the methods ft tokenizes (``METHODS[m].ft_tokenizes``: SFT) the rows are tokenized here, once, with loss
masks and a length column, so the sampler needs no scan and ``ft preprocess`` can cache them; TRL then only packs
(when asked). The other methods' preference and prompt rows go to TRL as canonical rows: its DPO/KTO/ORPO/GRPO
trainers tokenize them their own way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..caching import switched_on
from ..recipe import Recipe, RecipeError
from ..recipe.data_section import DataSource, SplitRatio
from ..recipe.methods import METHODS
from ..recipe.rules import check_modality
from . import cache
from .consistency import FIRST, check_template, sample
from .formats import FORMATS, normalize
from .images import ImageTokens, stored_images_folder
from .labels import IGNORE_INDEX
from .rows import BAD, ROW, SHOWN, SOURCE, BadRows, DataError, locate, refused_rendered
from .show import first_rows
from .sources import mix, read_source, source_counts, split_off, weighted
from .templates import TemplateError, check_image_template, resolve_chat_template
from .tokenize import STATS, TokenizeSettings, stop_token_id, tokenize_arrays

FLAGS = ("ft_truncated", "ft_too_long", "ft_no_loss")
IMAGE_FLAGS = ("ft_image_mismatch", "ft_cut_image")  # a vision row's checks (ft.data.tokenize)
IMAGE_STATS = ("ft_image_tokens",)  # what a vision row's images take (ft.data.tokenize), counted then dropped
WARN_SHARE = 0.01  # above this share of rows or of trained tokens cut by max_length, ft warns


@dataclass
class PreparedData:
    train: object
    eval: object | None
    stats: dict = field(default_factory=dict)


def prepare_data(recipe: Recipe, processing_class, template: str | None, say: Callable[[str], None] = print, *,
                 rebuild_ok: bool = True, builder: bool = True, world_size: int = 1) -> PreparedData:
    """The run's datasets, from the prepared cache when its fingerprint matches.

    ``processing_class`` is the model's: a tokenizer, or a vision-language model's processor (one with an image
    processor), whose rows keep their images (``ft.data.images``) and whose recipe is checked against what ft does
    with images (``recipe.rules.check_modality``: a RecipeError naming the key). Rows are tokenized with the text
    tokenizer inside it.
    ``template`` is ``chat_template_for(recipe, processing_class)``: the chat template rows are rendered with.
    ``rebuild_ok=False`` is ``data.require_prepared``: a missing or stale cache is an error.
    ``builder=False`` (the other processes of a multi-process run): never write ``data.prepared_path``; wait,
    without a time limit, until the main process has written a cache that matches (no collective is involved,
    so no process group timeout can end the wait; if the main process fails, the launcher stops this one).
    Without ``data.prepared_path`` every process tokenizes its own copy in memory, nobody waits.
    ``data.streaming``: the training rows are an endless stream in ``world_size`` shards (``ft.data.stream``).
    """
    seeing = getattr(processing_class, "image_processor", None) is not None
    problems = check_modality(recipe, "vision" if seeing else "text")
    if problems:
        raise RecipeError(problems)
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    images = _image_tokens(recipe, processing_class, template) if seeing else None
    if recipe.data.streaming:
        return _streamed(recipe, tokenizer, template, say, world_size)
    if not METHODS[recipe.method].ft_tokenizes:
        return _canonical_rows(recipe, say, images=seeing)
    if recipe.data.prepared_path is None:
        return _kept_or_tokenized(recipe, tokenizer, template, say, images, builder)
    path = Path(recipe.data.prepared_path)
    components = cache.fingerprint(recipe, tokenizer, template, images.processor.image_processor if images else None)
    state = cache.check(path, components)
    if not builder and state.status != "fresh":
        state = _wait_for_cache(path, components, say)
    say("data: " + state.describe(str(path)))
    if state.status == "fresh":
        train, evaluation, stats = cache.load(path)
        return PreparedData(train, evaluation, {**stats, "prepared": f"reused {path}"})
    if not rebuild_ok:
        raise DataError(f"data.require_prepared: {state.describe(str(path))}; run `ft preprocess` on this recipe "
                        "first, or set `data.require_prepared: false` to rebuild it during `ft train`.")
    prepared = _tokenized(recipe, tokenizer, template, say, images)
    cache.save(path, prepared.train, prepared.eval, components, prepared.stats)
    prepared.stats["prepared"] = f"{'built' if state.status == 'missing' else 'rebuilt'} {path}"
    say(f"data: wrote the prepared dataset to {path}")
    return prepared


def _kept_or_tokenized(recipe: Recipe, tokenizer, template: str | None, say, images: ImageTokens | None,
                       builder: bool) -> PreparedData:
    """The run's datasets without ``data.prepared_path``: tokenized in memory; with ``FT_CACHE_DATA``, read from ft's
    cache when an earlier run with the same fingerprint kept them there (the lines building them said, said again),
    else tokenized and kept there by the main process (``builder``; the others never wait for it)."""
    entry = None
    if switched_on(cache.DATA_SWITCH):
        processor = images.processor.image_processor if images else None
        components = cache.fingerprint(recipe, tokenizer, template, processor)
        entry = cache.kept_entry(components)
    if entry is not None and cache.check(entry, components).status == "fresh":
        kept = cache.load_kept(entry, discard=builder)
        if kept is not None:
            train, evaluation, stats = kept
            for line in stats.pop(cache.SAID, []):
                say(line)
            return PreparedData(train, evaluation, {**stats, "prepared": f"reused {entry} ({cache.DATA_SWITCH})"})
        say(f"ft: the tokenized data kept in {entry} ({cache.DATA_SWITCH}) could not be read; tokenizing it again")
    said: list[str] = []

    def saying(line: str) -> None:
        said.append(line)
        say(line)

    prepared = _tokenized(recipe, tokenizer, template, saying, images)
    if entry is not None and builder and cache.keep(entry, prepared.train, prepared.eval, components,
                                                    {**prepared.stats, cache.SAID: said}):
        prepared.stats["prepared"] = f"built {entry} ({cache.DATA_SWITCH})"
    else:
        prepared.stats["prepared"] = "built in memory (set data.prepared_path to cache it)"
    return prepared


def _wait_for_cache(path: Path, components: dict[str, str], say: Callable[[str], None],
                    poll_seconds: float = 1.0) -> cache.CacheState:
    import time

    say(f"data: waiting for the main process to write {path} (no time limit; on several machines it must be on a "
        "filesystem they share, or run `ft preprocess` on each first)")
    while (state := cache.check(path, components)).status != "fresh":
        time.sleep(poll_seconds)
    return state


def _image_tokens(recipe: Recipe, processor, template: str | None) -> ImageTokens | None:
    """What a vision-language model's rows need to be tokenized: the tokens each image becomes, once the chat template
    is seen to write the processor's image token for an image part. None when no source is chat-shaped (text rows
    hold no images)."""
    tokens = ImageTokens(processor, recipe.data.image)
    if template is None:
        return None
    try:
        check_image_template(template, tokens.tokenizer, tokens.token)
    except TemplateError as exc:
        raise DataError(str(exc)) from None
    return tokens


def chat_template_for(recipe: Recipe, tokenizer) -> str | None:
    """The Jinja template chat rows are rendered with (None when no source is chat-shaped). ``tokenizer`` may be a
    processor: its own template is a vision-language model's."""
    chat = any(FORMATS[s.format].conversations for s in (*recipe.data.train, *recipe.data.eval_sources))
    if not chat:
        return None
    try:
        return resolve_chat_template(recipe.data.chat_template, tokenizer, recipe.data.chat_template_kwargs)
    except TemplateError as exc:
        raise DataError(str(exc)) from None


def read_sources(recipe: Recipe, sources: list[DataSource], keys: list[str], report: BadRows, images: bool = False):
    """The canonical rows of ``sources`` (named by ``keys``, ``data.train.0``, … in errors), read, normalized and mixed
    as ``ft train`` reads them, with the recipe's seed and ``on_bad_row``; skipped rows are counted in ``report``.
    ``images``: read for a vision-language model (chats keep their images; those stored inside a dataset are written
    beside ``data.prepared_path`` when the rows are prepared there, ``stored_images_folder``). None without sources."""
    data = recipe.data
    stored = stored_images_folder(data.prepared_path if METHODS[recipe.method].ft_tokenizes else None)
    parts = []
    for key, source in zip(keys, sources, strict=True):
        raw = read_source(source, seed=data.seed, on_bad_row=data.on_bad_row, report=report, key=key)
        parts.append(normalize(raw, source, key=key, on_bad_row=data.on_bad_row, report=report, images=images,
                               stored=stored))
    optional = {column for source in sources for column in FORMATS[source.format].optional}
    return mix(parts, keys, optional) if parts else None


def read_splits(recipe: Recipe, say, images: bool = False) -> tuple[object, object | None, BadRows]:
    """(train rows, eval rows or None, the bad-row report) of ``recipe``, canonical and untokenized; ``split_ratio``
    holds its evaluation rows out of the training rows here. ``images``: as ``read_sources``."""
    data, report = recipe.data, BadRows()

    def split(sources: list[DataSource], name: str):
        return read_sources(recipe, sources, [f"data.{name}.{i}" for i in range(len(sources))], report, images)

    train, evaluation = split(data.train, "train"), split(data.eval_sources, "eval")
    if isinstance(data.eval, SplitRatio):
        train, evaluation = split_off(train, data.eval.split_ratio, data.seed)
    if report.total:
        say("data: " + report.describe())
    return train, evaluation, report


def mixed(recipe: Recipe, train, length_column: str | None = None, say=print):
    """(the training rows in the recipe's mixture, the rows and tokens each source gives them): drawn by the sources'
    weights until ``data.mix_stop`` (concatenated when they have none), with ``__ft_source`` dropped."""
    data = recipe.data
    if data.weights is not None:
        train = weighted(train, data.weights, data.seed, data.mix_stop)
    counts = source_counts(train, [f"data.train.{i}" for i in range(len(data.train))], length_column)
    if data.weights is not None:
        say("data: mixture (" + data.mix_stop.replace("_", " ") + "): " + ", ".join(
            f"{key} {share:.0%} of {len(train)} rows" for key, share in
            ((key, count["rows"] / len(train)) for key, count in counts.items())))
    return train.remove_columns(SOURCE), counts


def _without_ft_columns(dataset):
    return dataset.remove_columns([c for c in dataset.column_names if c.startswith("__ft")])


def _canonical_rows(recipe: Recipe, say, images: bool = False) -> PreparedData:
    train, evaluation, report = read_splits(recipe, say, images=images)
    train, sources = mixed(recipe, train, say=say)
    train = _without_ft_columns(train)
    evaluation = _without_ft_columns(evaluation) if evaluation is not None else None
    stats = {"train_rows": len(train), "eval_rows": len(evaluation) if evaluation is not None else 0,
             "train_sources": sources, "skipped_rows": report.as_dict()}
    return PreparedData(train, evaluation, stats)


def _tokenized(recipe: Recipe, tokenizer, template: str | None, say, images: ImageTokens | None = None) -> PreparedData:
    data = recipe.data
    settings = TokenizeSettings.of(data, template, parts=images is not None)
    length_column = recipe.train_args.get("length_column_name", "length")
    train, evaluation, report = read_splits(recipe, say, images=images is not None)
    stats: dict = {"skipped_rows": report.as_dict()}
    if template is not None and "messages" in train.column_names:
        stats["template_mismatch"] = _check_template(recipe, train, tokenizer, template, say)
    out = {}
    for name, dataset in (("train", train), ("eval", evaluation)):
        if dataset is None:
            continue
        seeing = _Seeing(images, recipe, report, say) if images is not None else None
        sources = data.train if name == "train" else data.eval_sources

        def refuse(tokenized, rows, split, sources=sources):
            return refused_rendered(tokenized, rows, sources, split, data.on_bad_row, report, say)

        out[name], counts, checks = _tokenize(dataset, tokenizer, settings, data.num_proc, name, length_column,
                                              seeing, refuse)
        stats[f"{name}_rows"] = len(out[name])
        stats[f"{name}_tokens"] = _count(_column(out[name], length_column))
        stats.update({f"{name}_{key}": value for key, value in counts.items()})
        if any(counts.values()):
            say(f"data: {name}: " + ", ".join(f"{value} {key.replace('_', ' ')}" for key, value in counts.items()))
        stats.update({f"{name}_{key}": value for key, value in checks.items() if key != "example"})
        if seeing is not None:
            pictured = checks["images"]
            say(f"preflight: images: {name}: {pictured['images']} images in {pictured['rows_with_images']} of "
                f"{len(out[name])} rows, {pictured['image_tokens']} image tokens ({pictured['image_token_share']:.1%} "
                "of the tokens)")
        warned = _say_cut(checks, settings, name, say)
        warned = _check_stops(checks, recipe, dataset, tokenizer, settings, name, say) or warned
        if name == "train" and not warned and checks["turns_trained"]:  # the preflight's data line, when all is well
            token = tokenizer.convert_ids_to_tokens(stop_token_id(settings, tokenizer))
            say(f"preflight: data: all {checks['turns_trained']} trained turns end with {token!r}; data.max_length "
                f"{settings.max_length} cuts {checks['rows_cut_share']:.1%} of the rows and "
                f"{checks['trained_tokens_cut_share']:.1%} of the trained tokens")
    if images is not None:
        stats["skipped_rows"] = report.as_dict()  # with the rows whose images and placeholders disagree
    if not len(out["train"]):
        raise DataError("data.train: no training rows are left after filtering (see the counts above); check "
                        "`data.max_length`, `data.truncation` and the bad-row report.")
    out["train"], stats["train_sources"] = mixed(recipe, out["train"], length_column, say)
    if recipe.data.weights is not None:  # what the mixture trains on, repeats included
        stats["train_rows"], stats["train_tokens"] = len(out["train"]), _count(_column(out["train"], length_column))
    if "eval" in out:
        out["eval"] = out["eval"].remove_columns(SOURCE)
    return PreparedData(out["train"], out.get("eval"), stats)


def _check_template(recipe: Recipe, train, tokenizer, template: str, say) -> dict:
    """The template consistency check (``ft.data.consistency``) on a sample of the training chats, before they are
    tokenized: summary.json's ``data.template_mismatch``."""
    data = recipe.data
    rows = train.select(sample(len(train), data.seed))
    return check_template(list(rows), lambda i: _place(data.train, rows, i), tokenizer, template,
                          on_mismatch=data.on_template_mismatch, say=say, tools=data.tool_list)


def _streamed(recipe: Recipe, tokenizer, template: str | None, say, world_size: int) -> PreparedData:
    """The training stream, and the evaluation rows (read whole and tokenized as without streaming)."""
    from .stream import streamed_train

    stats: dict = {}
    if template is not None and FORMATS[recipe.data.train[0].format].conversations:  # a stream's first rows alone
        rows = [(where, row) for where, row in first_rows(recipe, FIRST) if isinstance(row, dict)]
        stats["template_mismatch"] = check_template(
            [row for _, row in rows], lambda i: rows[i][0], tokenizer, template,
            on_mismatch=recipe.data.on_template_mismatch, say=say, tools=recipe.data.tool_list)
    train = streamed_train(recipe, tokenizer, template, world_size, say, stats)
    evaluation, sources = None, recipe.data.eval_sources
    if sources:
        report = BadRows()
        rows = read_sources(recipe, sources, [f"data.eval.{i}" for i in range(len(sources))], report)
        settings = TokenizeSettings.of(recipe.data, template)
        length_column = recipe.train_args.get("length_column_name", "length")
        evaluation, counts, _ = _tokenize(rows, tokenizer, settings, recipe.data.num_proc, "eval", length_column)
        evaluation = evaluation.remove_columns(SOURCE)
        stats.update(eval_rows=len(evaluation), eval_skipped_rows=report.as_dict(),
                     **{f"eval_{key}": value for key, value in counts.items()})
    say("data: streaming the training rows (read, tokenized" + (" and packed" if recipe.data.packing else "") +
        f" as training consumes them{f', in {world_size} shards, one per process' if world_size > 1 else ''})")
    return PreparedData(train, evaluation, stats)


def _tokenize(dataset, tokenizer, settings: TokenizeSettings, num_proc, name: str, length_column: str,
              seeing: _Seeing | None = None, refuse: Callable | None = None):
    # num_proc 1 tokenizes in this process, as None does: datasets would start one worker for it and turn the
    # tokenizer's own threads off there, the slowest way to use one process (benchmarks/data_scale.py)
    kwargs = {"tokenizer": tokenizer, "settings": settings, **({"images": seeing.tokens} if seeing else {})}
    tokenized = dataset.map(_tokenize_to_arrow, batched=True, fn_kwargs=kwargs,
                            num_proc=num_proc if num_proc and num_proc > 1 else None,
                            remove_columns=dataset.column_names, features=_features(seeing is not None),
                            desc=f"tokenizing {name}")
    at = None  # where rows were dropped before the counts: the position in ``dataset`` of each row kept
    if seeing is not None:
        tokenized, at = seeing.checked(tokenized, dataset, name)
    elif refuse is not None:  # chat rows the template cannot render whole: named, or skipped and counted
        tokenized, at = refuse(tokenized, dataset, name)
    # counted in Arrow: iterating a column row by row costs more than the tokenization itself
    truncated, too_long, no_loss = (_column(tokenized, flag) for flag in FLAGS)
    dropped_no_loss = _count(pc.and_(no_loss, pc.invert(too_long)))
    counts = {"rows_truncated": _count(truncated), "rows_dropped_as_too_long": _count(too_long),
              "rows_dropped_with_no_trained_tokens": dropped_no_loss}
    checks = _cut(tokenized, counts)
    kept = pc.invert(pc.or_(too_long, no_loss))
    turns, stopped = (pc.filter(_column(tokenized, column), kept) for column in ("ft_turns", "ft_turns_stopped"))
    total, ended = _count(turns), _count(stopped)
    checks.update(turns_trained=total, turns_stopped=ended, stop_share=round(ended / total, 4) if total else None)
    unstopped = pc.and_(kept, pc.less(_column(tokenized, "ft_turns_stopped"), _column(tokenized, "ft_turns")))
    first = pc.index(unstopped, True).as_py()
    checks["example"] = None if first < 0 else (first if at is None else int(at[first]), tokenized[first]["input_ids"],
                                                 tokenized[first]["labels"])
    if counts["rows_dropped_as_too_long"] or dropped_no_loss:
        tokenized = tokenized.filter(lambda t, n: [not (a or b) for a, b in zip(t, n, strict=True)],
                                     input_columns=["ft_too_long", "ft_no_loss"], batched=True,
                                     desc=f"dropping {name} rows")
    full = checks.pop("trained_tokens_full")
    checks["trained_tokens_cut"] = full - _count(_column(tokenized, "ft_trained"))
    checks["trained_tokens_cut_share"] = round(checks["trained_tokens_cut"] / full, 4) if full else 0.0
    columns = [*FLAGS, *STATS, *BAD]
    if seeing is not None:
        checks["images"] = seeing.counted(tokenized)
        columns += [*IMAGE_FLAGS, *IMAGE_STATS]
    tokenized = tokenized.remove_columns(columns)
    if length_column != "length":
        tokenized = tokenized.rename_column("length", length_column)
    return tokenized, counts, checks


def _cut(tokenized, counts: dict) -> dict:
    """What max_length costs, from the lengths before the cut: the share of rows cut or dropped, the trained tokens
    before it (the caller subtracts what is left), and the length 99% of the rows fit in."""
    rows = len(tokenized)
    lengths = _column(tokenized, "ft_full_length")
    cut_rows = counts["rows_truncated"] + counts["rows_dropped_as_too_long"]
    return {"rows_cut_share": round(cut_rows / rows, 4) if rows else 0.0,
            "trained_tokens_full": _count(_column(tokenized, "ft_trained_full")),
            "length_p99": int(pc.quantile(lengths, 0.99, interpolation="higher")[0].as_py()) if rows else 0}


def _say_cut(checks: dict, settings: TokenizeSettings, name: str, say) -> bool:
    """Above WARN_SHARE of the rows or of the trained tokens lost to max_length: say so, and the change that keeps
    them (True when it did)."""
    rows, tokens = checks["rows_cut_share"], checks["trained_tokens_cut_share"]
    if max(rows, tokens) <= WARN_SHARE:
        return False
    how = "cut to" if settings.truncation == "truncate" else "dropped for being longer than"
    say(f"data: {name}: warning: {rows:.1%} of the rows are {how} data.max_length {settings.max_length}, losing "
        f"{tokens:.1%} of the trained tokens ({checks['trained_tokens_cut']}); 99% of the rows fit in "
        f"{checks['length_p99']} tokens: set data.max_length to at least that (ft plan shows what it costs), or "
        f"shorten those rows.")
    return True


def _check_stops(checks: dict, recipe: Recipe, dataset, tokenizer, settings: TokenizeSettings, name: str,
                 say) -> bool:
    """Trained turns that do not end with the token generation stops on teach a model that never stops (an
    end-of-turn token masked out of the labels): warned with one example, or refused under data.on_missing_stop."""
    total, stopped = checks["turns_trained"], checks["turns_stopped"]
    example = checks.pop("example")
    if example is None or total == 0:
        return False
    stop = stop_token_id(settings, tokenizer)
    missing = total - stopped
    share = missing / total
    index, ids, labels = example
    token = repr(tokenizer.convert_ids_to_tokens(stop)) if stop is not None else "(the tokenizer has no EOS)"
    sources = recipe.data.train if name == "train" else recipe.data.eval_sources
    place = (locate(sources[0], [dataset[index][ROW]])[dataset[index][ROW]] if len(sources) == 1
             else f"data.{name}, row {index}")
    message = (f"data.{name}: {missing} of {total} trained turns ({share:.1%}) do not end with the stop token "
               f"{token}, so a model trained on them may not learn to stop; e.g. {place} "
               f"{_turn_end(ids, labels, stop, tokenizer)}. "
               "The token that ends an assistant turn must be inside its loss mask: set data.chat_template to a "
               "template that writes it right after each answer (`chatml`, `llama3`, or your own); "
               f"data.on_missing_stop: {'warn lets' if recipe.data.on_missing_stop == 'error' else 'error refuses'} "
               "such data.")
    if recipe.data.on_missing_stop == "error":
        raise DataError(message)
    say("data: warning: " + message)
    return True


def _turn_end(ids: list[int], labels: list[int], stop: int | None, tokenizer) -> str:
    """Where the first trained turn that does not end with ``stop`` ends: its last trained tokens, and the untrained
    ones after them."""
    end = None
    for i, label in enumerate(labels):
        last = label != IGNORE_INDEX and (i + 1 == len(labels) or labels[i + 1] == IGNORE_INDEX)
        if last:
            j = i
            while j > 0 and labels[j - 1] != IGNORE_INDEX and not tokenizer.decode([ids[j]]).strip():
                j -= 1
            if ids[j] != stop:
                end = i
                break
    if end is None:
        return "has one"
    start = end
    while start > 0 and labels[start - 1] != IGNORE_INDEX and end - start < 12:
        start -= 1
    trained, after = tokenizer.decode(ids[start:end + 1]), tokenizer.decode(ids[end + 1:end + 6])
    return f"has a turn whose trained tokens end {trained!r}" + (
        f", and {after!r} after it carries no loss" if after else " at the end of the row")


def _tokenize_to_arrow(batch: dict, tokenizer, settings: TokenizeSettings, images=None) -> pa.Table:
    """``tokenize_batch`` as an Arrow table, built from its rows' numpy arrays without a Python object per token; a
    batch whose labels are its input_ids (every token trained on) shares one column for both. ``images``: the
    model's ``ImageTokens``, for a vision-language model's rows (which keep an ``images`` column)."""
    out = tokenize_arrays(batch, tokenizer, settings, images)
    ids = _list_array(out["input_ids"])
    shared = all(labels is row for labels, row in zip(out["labels"], out["input_ids"], strict=True))
    out["labels"] = ids if shared else _list_array(out["labels"])
    out["input_ids"] = ids
    out[SOURCE] = batch[SOURCE]  # which source each row came from, for the mixture
    for column in BAD:  # chat rows say why the template cannot render one whole; other rows cannot be bad so
        out.setdefault(column, [""] * len(out["input_ids"]))
    return pa.table(out, schema=_features(images is not None).arrow_schema)


def _list_array(rows: list[np.ndarray]) -> pa.ListArray:
    """int32 arrays as one Arrow list<int32> column: their concatenation and where each starts."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(row) for row in rows], out=offsets[1:])
    values = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()))


def _features(images: bool = False):
    """Declared types spare datasets a type inference per batch (and int32 halves what is written). ``images``: a
    vision-language model's rows, with their images' paths and checks."""
    from datasets import Features, Sequence, Value

    seeing = {"images": Sequence(Value("string")), **{flag: Value("bool") for flag in IMAGE_FLAGS},
              **{column: Value("int32") for column in IMAGE_STATS}} if images else {}
    return Features({"input_ids": Sequence(Value("int32")), "labels": Sequence(Value("int32")),
                     "length": Value("int32"), **{flag: Value("bool") for flag in FLAGS},
                     **{column: Value("string") for column in BAD},
                     **{column: Value("int32") for column in STATS}, SOURCE: Value("int32"), **seeing})


@dataclass
class _Seeing:
    """A vision-language model's tokenization: the tokens its images become, and what the checks of its rows need
    (the recipe's settings and sources, the bad-row report, the console)."""

    tokens: ImageTokens
    recipe: Recipe
    report: BadRows
    say: Callable[[str], None]

    def checked(self, tokenized, dataset, name: str):
        """(the tokenized rows that may train, the position in ``dataset`` of each, or None when all are kept).

        A row ``max_length`` would cut inside an image's tokens (``truncation: truncate``; ``drop`` drops every row
        too long) is refused, counted and named: cut there, the model would get an image's pixels without all of its
        tokens. A row whose template wrote another number of image placeholders than it has images (a literal image
        token in its text, a template that drops an image part) is a bad row: listed under ``on_bad_row: error``,
        dropped and counted (``image_count``) under ``skip``."""
        data = self.recipe.data
        sources = data.train if name == "train" else data.eval_sources
        cut = np.asarray(_column(tokenized, "ft_cut_image").to_numpy(zero_copy_only=False))
        if cut.any():
            rows = np.flatnonzero(cut)
            raise DataError(
                f"data.max_length: {len(rows)} {name} row{'s' if len(rows) > 1 else ''} would be cut inside an image's "
                f"tokens (data.truncation: truncate), e.g. {_place(sources, dataset, int(rows[0]))} "
                f"({tokenized[int(rows[0])]['ft_full_length']} tokens, data.max_length {data.max_length}); a cut "
                "there leaves the model an image without all of its tokens. Raise data.max_length to fit those rows, "
                "make their images smaller (data.image.max_pixels), or set `data.truncation: drop` to drop every row "
                "longer than data.max_length (counted).")
        bad = np.asarray(_column(tokenized, "ft_image_mismatch").to_numpy(zero_copy_only=False))
        if not bad.any():
            return tokenized, None
        rows = np.flatnonzero(bad)
        if data.on_bad_row == "error":
            listed = "\n".join(f"  {_place(sources, dataset, i)}: {self._disagree(tokenized[i])}"
                               for i in rows[:SHOWN].tolist())
            first = f"; the first {SHOWN}" if len(rows) > SHOWN else ""
            raise DataError(
                f"data.{name}: {len(rows)} row{'s' if len(rows) > 1 else ''} whose image placeholders and images "
                f"disagree once rendered with the chat template{first}:\n{listed}\nEach image needs one "
                f"{self.tokens.token!r} where it goes, and the text no other: fix these rows, or set "
                "`data.on_bad_row: skip` to drop them (counted).")
        for source, count in zip(*np.unique(_column(dataset, SOURCE).to_numpy()[rows],
                                            return_counts=True), strict=True):
            self.report.add(f"data.{name}.{int(source)}", "image_count", int(count))
        self.say(f"data: {name}: skipped {len(rows)} rows whose image placeholders and images disagree (image_count)")
        at = np.flatnonzero(~bad)
        return tokenized.select(at), at

    def counted(self, tokenized) -> dict:
        """What the images of a split's kept rows amount to (summary.json's ``data.<split>_images``): how many, in how
        many rows, and the tokens they take (each image's whole expansion), with their share of all the tokens."""
        per_row = pc.list_value_length(_column(tokenized, "images"))
        image_tokens, total = _count(_column(tokenized, "ft_image_tokens")), _count(_column(tokenized, "length"))
        return {"images": _count(per_row), "rows_with_images": _count(pc.greater(per_row, 0)),
                "image_tokens": image_tokens, "image_token_share": round(image_tokens / total, 4) if total else 0.0}

    def _disagree(self, row: dict) -> str:
        held = sum(token == self.tokens.id for token in row["input_ids"])
        return (f"the rendered chat holds {held} image placeholder{'s' if held != 1 else ''} "
                f"({self.tokens.token!r}) for {len(row['images'])} image{'s' if len(row['images']) != 1 else ''} "
                "(image_count)")


def _place(sources: list[DataSource], dataset, index: int) -> str:
    """Where row ``index`` of a split's canonical rows is in its source: ``file:line`` and the like."""
    row = dataset[index]
    return locate(sources[row[SOURCE]], [row[ROW]])[row[ROW]]


def _column(dataset, name: str):
    """One column as Arrow, honouring the dataset's row selection (filter/select)."""
    return dataset.with_format("arrow")[name]


def _count(column) -> int:
    """Sum of an Arrow column of bools or ints."""
    return int(pc.sum(column).as_py() or 0)
