"""User code named in a recipe as ``module:attribute`` (rewards, losses, callbacks, optimizer and scheduler classes).

A recipe's names run code, as a Python script does: importing a module runs it. What is refused and what is
importable, so that a recipe cannot reach further than its author meant:

- A module next to the recipe (or next to a recipe it ``extends:``) is importable, so a recipe can ship its own
  ``my_rewards.py``. Its folders go on ``sys.path`` only while a name the recipe gives is imported
  (``recipe_folders_on_path``), and *after* the installed packages: a stray ``datasets.py`` beside a recipe never
  stands in for the ``datasets`` library, during that import or later in the run. What the module imports when it
  is imported (a sibling ``helpers.py``) is found then; a sibling it imports later, inside a function, is not.
- A file beside the recipe named like an installed or standard-library module (``datasets.py``, ``code.py``) is
  refused when the recipe names it: Python would import the other one.
- Python's standard library is no loss, callback or reward: a name in it (``os:system``, ``builtins:eval``,
  ``shutil:rmtree``), or an object defined there and re-exported by another module, is refused before it is called.
  A standard-library module the recipe names is refused before it is imported (importing some has effects).

Resolution happens at the start of ``ft train``, before any model loads, and every failure is a ``Problem`` naming
the recipe key (exit code 2).
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..errors import FtError
from ..recipe import Problem

TRUST = "A recipe's `module:function` names run as code: train only recipes you trust."


class PluginError(FtError):
    def __init__(self, problem: Problem):
        super().__init__(problem.render())
        self.problem = problem


def search_folders(folders: Path | Sequence[Path]) -> tuple[Path, ...]:
    """The folders a recipe's modules are looked up in, each once and absolute: the recipe's own first, then those of
    the recipes it extends (``LoadedRecipe.folders``). One folder may be given alone."""
    items = [folders] if isinstance(folders, (str, Path)) else list(folders)
    return tuple(dict.fromkeys(Path(folder).resolve() for folder in items))


@contextmanager
def recipe_folders_on_path(folders: Path | Sequence[Path]) -> Iterator[None]:
    """Within the block, ``folders`` are at the end of ``sys.path`` (after the standard library and the installed
    packages, so none of their modules is shadowed); afterwards ``sys.path`` is the list it was before, exactly."""
    saved = list(sys.path)
    sys.path.extend(str(folder) for folder in search_folders(folders))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved


def resolve(reference: str, key: str, folders: Path | Sequence[Path], what: str = "what this key names"):
    """Import ``module:attribute`` with the recipe's ``folders`` importable (``recipe_folders_on_path``); ``what``
    (``a loss function``) is what the key takes, for the messages. Raises PluginError naming ``key`` when the module
    or attribute cannot be found, when a file beside the recipe has the name of another module, or when the name is
    in Python's standard library."""
    folders = search_folders(folders)
    module_name, _, attribute = reference.partition(":")
    importlib.invalidate_caches()  # a module written beside the recipe since the last look there is seen
    _check_module_name(reference, module_name, key, folders, what)
    with recipe_folders_on_path(folders):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name.split(".")[0] and exc.name != module_name:
                raise PluginError(Problem(key, f"importing `{module_name}` failed: {exc}")) from None
            raise PluginError(Problem(key, f"no module `{module_name}`: put {module_name.replace('.', '/')}.py next "
                                           f"to the recipe ({folders[0]}) or install it.")) from None
        except Exception as exc:  # the user's module raised while importing
            raise PluginError(Problem(key, f"importing `{module_name}` raised {type(exc).__name__}: {exc}")) from None
    if not hasattr(module, attribute):
        public = [name for name in dir(module) if not name.startswith("_")]
        from ..recipe.errors import did_you_mean

        raise PluginError(Problem(key, f"`{module_name}` has no `{attribute}`.{did_you_mean(attribute, public)}"))
    found = getattr(module, attribute)
    defined_in = _defined_in(found)
    if _is_stdlib(defined_in):
        raise PluginError(Problem(key, f"`{reference}` is `{defined_in}.{getattr(found, '__name__', attribute)}` "
                                       f"from Python's standard library, not {what}: {_WRITTEN} {TRUST}"))
    return found


_WRITTEN = ("a loss, callback, reward, optimizer or scheduler must be a function or class you wrote (in a module next "
            "to the recipe) or an installed library's.")


def _check_module_name(reference: str, module_name: str, key: str, folders: tuple[Path, ...], what: str) -> None:
    """Refuse, before importing anything, a standard-library module and a file beside the recipe whose name another
    module already has (the recipe's folders come last on ``sys.path``: the other one would be imported)."""
    top = module_name.split(".")[0]
    if not top:
        raise PluginError(Problem(key, f"`{reference}` names no module: write `module:function`."))
    local = importlib.machinery.PathFinder.find_spec(top, [str(folder) for folder in folders])
    local_file = local.origin if local is not None and local.has_location and local.origin else None
    if top in sys.stdlib_module_names:
        if local_file:
            raise PluginError(Problem(key, f"`{local_file}` has the name of the standard-library module `{top}`, "
                                           "which Python imports instead: rename the file and the name in the recipe."))
        raise PluginError(Problem(key, f"`{reference}` is in Python's standard library (`{top}`), not {what}: "
                                       f"{_WRITTEN} {TRUST}"))
    if local_file is None:
        return
    elsewhere = _installed_origin(top)
    if elsewhere is not None and Path(elsewhere).resolve() != Path(local_file).resolve():
        raise PluginError(Problem(key, f"`{local_file}` has the name of the module `{top}` at {elsewhere}, which is "
                                       "imported instead (a recipe's folder comes after the installed packages, so "
                                       "that it shadows none): rename the file and the name in the recipe."))


def _installed_origin(top: str) -> str | None:
    """The file of top-level module ``top`` as Python finds it without the recipe's folders (imported already, or
    found on ``sys.path``); None when there is none, or it is a namespace package (a file beside the recipe wins)."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # a module in sys.modules without a spec (__main__ run as a script)
        module = sys.modules.get(top)
        return getattr(module, "__file__", None)
    return spec.origin if spec is not None and spec.has_location and spec.origin else None


def _defined_in(obj) -> str:
    """The module an object comes from: a function's or class's own, a bound built-in method's owner's, an instance's
    class's; through ``functools.partial`` to the function it wraps. An empty string when it cannot be told."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    module = getattr(obj, "__module__", None)
    owner = getattr(obj, "__self__", None)
    if module is None and owner is not None:  # a built-in function bound to its module, or to an object
        module = owner.__name__ if inspect.ismodule(owner) else type(owner).__module__  # random.random: random.Random
    return module if isinstance(module, str) else ""


def _is_stdlib(module: str) -> bool:
    """Whether ``module`` belongs to Python's standard library (``builtins``, ``posix`` and ``_operator`` included)."""
    return bool(module) and module.split(".")[0] in sys.stdlib_module_names


def resolve_class(reference: str, key: str, folders: Path | Sequence[Path], base: type, kwargs: dict,
                  provided: tuple[str, ...]):
    """``package.module.Class`` (importable) or ``module:Class`` (next to the recipe): a subclass of ``base`` whose
    signature takes ``kwargs`` once ft has provided the arguments named in ``provided``. Problems name ``key`` (the
    class) or ``<key's section>.kwargs``."""
    module, sep, name = reference.partition(":")
    if not sep:
        module, _, name = reference.rpartition(".")
    cls = resolve(f"{module}:{name}", key, folders, f"a {base.__module__}.{base.__qualname__} subclass")
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
        return  # a library's C function: nothing to check (the standard library's were refused by ``resolve``)
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
