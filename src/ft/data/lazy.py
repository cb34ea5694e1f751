"""A module imported where it is first used rather than where it is named: ``datasets`` (with pandas: about a second
on its own, 0.3 s once transformers and torch are in) is needed to build and write a dataset, not to read the few rows
``ft preprocess --show N`` prints, which ``ft.data.formats`` and ``ft.data.sources`` convert with the same code."""

from __future__ import annotations

import importlib


class LazyModule:
    """Stands for the module ``name``: reading an attribute imports the module (once: Python keeps it in
    ``sys.modules``) and returns the module's attribute, so ``datasets.Dataset`` reads as where it is imported."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        if attribute == "_name" or attribute.startswith("__"):  # copy's and pickle's probes: not the module's
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
