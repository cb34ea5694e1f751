"""GRPO and RLOO rewards: ft's built-ins by ``name`` and the user's ``fn: module:function``, as TRL reward functions,
and reward models by ``model:`` (``ft.trainers.learned_reward``).

TRL calls every reward function once per generation round as
``fn(prompts=[...], completions=[...], completion_ids=[...], trainer_state=..., **columns)``, where each
list holds one entry per completion and ``columns`` are the dataset's other fields (``answer``, …), repeated
to match. A completion is a string, or a list of messages for conversational prompts. The function returns
one float (or None) per completion; TRL sums them with the weights and logs each one under its ``__name__``.

A built-in is a factory: it takes the reward's ``args:`` as keyword arguments and returns the reward function.
Factories are checked (unknown or missing arguments, bad values) before any model loads, like user code.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

from ..data import DataError
from ..recipe import Problem
from ..recipe.errors import did_you_mean, first_line
from ..recipe.methods import RewardSpec
from .learned_reward import LearnedReward, load_learned_reward, reward_name
from .plugins import PluginError, check_signature, resolve

RewardFn = Callable[..., list]
_NUMBER = re.compile(r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?")


class RewardArgError(ValueError):
    """A built-in reward's ``args:`` value is unusable (raised by a factory; ``arg`` names the key)."""

    def __init__(self, arg: str, message: str):
        super().__init__(message)
        self.arg = arg


def completion_text(completion) -> str:
    """The text of one completion: a string as it is, or the content of a conversational completion's assistant
    messages (tool results in between are not the model's answer)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    parts = []
    for message in completion:
        if message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content") or ""
        if isinstance(content, list):  # content blocks: [{"type": "text", "text": ...}, ...]
            content = "".join(block.get("text") or "" for block in content if isinstance(block, dict))
        parts.append(content)
    return "".join(parts)


def first_number(text) -> Decimal | None:
    """The first number in ``text`` (``-3``, ``1,024``, ``2.50``), or None."""
    match = _NUMBER.search(str(text))
    if match is None:
        return None
    try:
        return Decimal(match.group().replace(",", ""))
    except InvalidOperation:
        return None


def _column(kwargs: dict, field: str, reward: str) -> list:
    """The rows' ``field`` (one value per completion); a DataError (exit code 2) when the rows lack it."""
    if field not in kwargs:
        columns = sorted(k for k in kwargs if k not in ("completion_ids", "trainer_state", "log_extra", "log_metric",
                                                        "environments"))
        raise DataError(f"reward `{reward}` reads the rows' `{field}` field, which the training data does not have "
                       f"(fields: {', '.join(columns) or 'none besides the prompt'}).{did_you_mean(field, columns)} "
                       f"Set its `args: {{field: ...}}`.")
    return kwargs[field]


def exact_match(field: str = "answer") -> RewardFn:
    """1.0 when the stripped completion equals the row's ``field`` (stripped), else 0.0."""

    def reward(prompts, completions, **kwargs) -> list[float]:
        expected = _column(kwargs, field, "exact_match")
        return [float(completion_text(c).strip() == str(e).strip()) for c, e in zip(completions, expected, strict=True)]

    return reward


def numeric_match(field: str = "answer", tolerance: float = 0) -> RewardFn:
    """1.0 when the first number in the completion is within ``tolerance`` of the number in the row's ``field``
    (equal, by default), else 0.0. A tolerance gives partial progress a signal while exact answers are rare."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0:
        raise RewardArgError("tolerance", f"must be a number of at least 0, got {tolerance!r}.")
    allowed = Decimal(str(tolerance))

    def reward(prompts, completions, **kwargs) -> list[float]:
        expected = _column(kwargs, field, "numeric_match")
        out = []
        for completion, target in zip(completions, expected, strict=True):
            got, want = first_number(completion_text(completion)), first_number(target)
            out.append(float(got is not None and want is not None and abs(got - want) <= allowed))
        return out

    return reward


def format_match(pattern: str) -> RewardFn:
    """1.0 when the whole stripped completion matches the regular expression ``pattern``, else 0.0."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise RewardArgError("pattern", f"`{pattern}` is not a valid regular expression: {exc}") from None

    def reward(prompts, completions, **kwargs) -> list[float]:
        return [float(compiled.fullmatch(completion_text(c).strip()) is not None) for c in completions]

    return reward


def length_penalty(target: int, unit: str = "tokens") -> RewardFn:
    """0.0 up to ``target`` tokens (or characters), then ``-(length - target) / target``: -1.0 at twice the target.

    Tokens are the completion's generated token ids (end-of-sequence included); without them (a call by
    hand) or with ``unit: characters``, the length is that of the completion's text.
    """
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise RewardArgError("target", f"must be a whole number of {unit} of at least 1, got {target!r}.")
    if unit not in ("tokens", "characters"):
        raise RewardArgError("unit", f"must be `tokens` or `characters`, got {unit!r}.")

    def reward(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
        if unit == "tokens" and completion_ids is not None:
            lengths = [len(ids) for ids in completion_ids]
        else:
            lengths = [len(completion_text(c)) for c in completions]
        return [-max(0, n - target) / target for n in lengths]

    return reward


BUILTINS: dict[str, Callable[..., RewardFn]] = {
    "exact_match": exact_match,
    "numeric_match": numeric_match,
    "format": format_match,
    "length_penalty": length_penalty,
}


def reward_functions(specs: Sequence[RewardSpec], folders: Path | Sequence[Path], section: str,
                     trust_remote_code: bool = False) -> list[RewardFn | LearnedReward]:
    """The rewards of ``<section>.rewards`` (``specs``; ``section``: the method section, ``grpo``), in recipe order:
    functions, and reward models (each as the section declares it: ``RewardSpec.model_at``, its key and dtype) loaded
    as ``LearnedReward`` (``trust_remote_code``: the recipe's ``model.trust_remote_code``). Their weights stay in the
    recipe: TRL reads them from its config (``GRPOConfig.reward_weights``). A ``fn:`` module is looked up in
    ``folders`` (the recipe's, then its bases'; ``plugins.resolve``).

    Raises ``PluginError`` naming the recipe key (``grpo.rewards.<i>.fn``, ``grpo.rewards.<i>.args``, …).
    """
    functions, names = [], set()
    for i, spec in enumerate(specs):
        key = f"{section}.rewards.{i}"
        model = spec.model_at(key)
        if model is not None:  # TRL logs it under its name: unique, like a function's
            name = reward_name(model.name)
            name = f"{name}_{i}" if name in names else name
            names.add(name)
            functions.append(load_learned_reward(model.name, model.key, name, trust_remote_code, dtype=model.dtype))
            continue
        if spec.name is not None:
            fn = _builtin(spec.name, dict(spec.args), key)
            fn.__name__ = fn.__qualname__ = spec.name  # a fresh closure: it carries the built-in's name
        else:
            fn = _user_function(spec.fn, dict(spec.args), f"{key}.fn", folders)
        name = get_callable_name(fn)
        if name in names:  # TRL logs rewards/<name>/mean: two rewards of one name would share one line
            name = f"{name}_{i}"
            fn = _renamed(fn, name)
        names.add(name)
        functions.append(fn)
    return functions


def get_callable_name(fn) -> str:
    """The name TRL logs a reward under (it unwraps ``functools.partial`` the same way)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def _builtin(name: str, args: dict, key: str) -> RewardFn:
    factory = BUILTINS[name]
    params = inspect.signature(factory).parameters
    unknown = [arg for arg in args if arg not in params]
    if unknown:
        raise PluginError(Problem(f"{key}.args.{unknown[0]}", f"`{name}` takes no argument `{unknown[0]}`; it takes "
                                  f"{', '.join(params) or 'none'}.{did_you_mean(unknown[0], params)}"))
    missing = [p for p, param in params.items() if param.default is param.empty and p not in args]
    if missing:
        raise PluginError(Problem(f"{key}.args", f"`{name}` needs `args: {{{missing[0]}: ...}}` "
                                  f"({first_line(factory.__doc__).rstrip('.')})."))
    try:
        return factory(**args)
    except RewardArgError as exc:
        raise PluginError(Problem(f"{key}.args.{exc.arg}", f"`{name}`: {exc}")) from None


def _user_function(reference: str, args: dict, key: str, folders: Path | Sequence[Path]) -> RewardFn:
    fn = resolve(reference, key, folders, "a reward function")
    if not callable(fn):
        raise PluginError(Problem(key, f"`{reference}` is a {type(fn).__name__}, not a function."))
    check_signature(fn, key, ("prompts", "completions"))
    # TRL also passes completion_ids, trainer_state and every dataset column: without **kwargs the call fails
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None  # builtins and C functions: nothing to check
    if signature is not None and not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        raise PluginError(Problem(key, f"`{get_callable_name(fn)}{signature}` does not match the documented "
                                  "signature (prompts, completions, **kwargs): TRL also passes completion_ids, "
                                  "trainer_state and every field of the rows by keyword."))
    return functools.partial(fn, **args) if args else fn  # args: keyword arguments of every call


def _renamed(fn: RewardFn, name: str) -> RewardFn:
    """``fn`` under another name, as a new function (a user's function object is never modified)."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
        async def named(*args, **kwargs):
            return await fn(*args, **kwargs)
    else:
        def named(*args, **kwargs):
            return fn(*args, **kwargs)
    named.__name__ = named.__qualname__ = name
    return named
