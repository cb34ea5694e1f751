"""User code named in a recipe as ``module:attribute`` (rewards, losses, callbacks).

A module next to the recipe file is importable (the recipe's folder goes first on ``sys.path``), so a
recipe can ship its own ``my_rewards.py``. Resolution happens at the start of ``ft train``, before any
model loads, and every failure is a ``Problem`` naming the recipe key (exit code 2).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import FtError
from ..recipe import Problem


class PluginError(FtError):
    def __init__(self, problem: Problem):
        super().__init__(problem.render())
        self.problem = problem


def resolve(reference: str, key: str, base_dir: Path):
    """Import ``module:attribute``; raise PluginError naming ``key`` when it cannot be found."""
    module_name, _, attribute = reference.partition(":")
    if str(base_dir) not in sys.path:
        sys.path.insert(0, str(base_dir))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0] and exc.name != module_name:
            raise PluginError(Problem(key, f"importing `{module_name}` failed: {exc}")) from None
        raise PluginError(Problem(key, f"no module `{module_name}`: put {module_name.replace('.', '/')}.py next to "
                                       f"the recipe ({base_dir}) or install it.")) from None
    except Exception as exc:  # the user's module raised while importing
        raise PluginError(Problem(key, f"importing `{module_name}` raised {type(exc).__name__}: {exc}")) from None
    if not hasattr(module, attribute):
        public = [name for name in dir(module) if not name.startswith("_")]
        from ..recipe.errors import did_you_mean

        raise PluginError(Problem(key, f"`{module_name}` has no `{attribute}`.{did_you_mean(attribute, public)}"))
    return getattr(module, attribute)


def resolve_class(reference: str, key: str, base_dir: Path, base: type, kwargs: dict, provided: tuple[str, ...]):
    """``package.module.Class`` (importable) or ``module:Class`` (next to the recipe): a subclass of ``base`` whose
    signature takes ``kwargs`` once ft has provided the arguments named in ``provided``. Problems name ``key`` (the
    class) or ``<key's section>.kwargs``."""
    module, sep, name = reference.partition(":")
    if not sep:
        module, _, name = reference.rpartition(".")
    cls = resolve(f"{module}:{name}", key, base_dir)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PluginError(Problem(key, f"`{reference}` is not a {base.__module__}.{base.__qualname__} subclass."))
    section = key.rpartition(".")[0]
    params = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        for arg in kwargs:
            if arg not in params:
                from ..recipe.errors import did_you_mean

                raise PluginError(Problem(f"{section}.kwargs.{arg}", f"`{name}` takes no argument `{arg}`; it takes "
                                          f"{', '.join(params)}.{did_you_mean(arg, params)}"))
    missing = [arg for arg, param in params.items() if param.default is param.empty and arg not in kwargs
               and arg not in provided and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)]
    if missing:
        raise PluginError(Problem(f"{section}.kwargs", f"`{name}` needs `{missing[0]}`; add it to "
                                  f"`{section}.kwargs`."))
    return cls


def check_signature(fn: Callable, key: str, required: tuple[str, ...], *, positional: bool = False) -> None:
    """``fn`` must accept the named parameters (or ``**kwargs``; with ``positional``, that many positional ones)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return  # builtins and C functions: nothing to check
    kinds = {p.kind for p in params}
    if positional:
        slots = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(slots) >= len(required) or inspect.Parameter.VAR_POSITIONAL in kinds:
            return
    elif inspect.Parameter.VAR_KEYWORD in kinds or all(n in {p.name for p in params} for n in required):
        return
    shown = ", ".join(required) + ("" if positional else ", **kwargs")
    name = f"{getattr(fn, '__name__', fn)}{inspect.signature(fn)}"
    raise PluginError(Problem(key, f"`{name}` does not match the documented signature ({shown})."))
