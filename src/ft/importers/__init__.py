"""Importers: another tool's training config → an ft recipe, with an account of every key.

An importer reads the other tool's config, builds the recipe as a plain dict and records in a ``Ledger`` what became
of each key of the config: carried to an ft key, ignored because it is empty or switched off (no effect), or not
carried, with the reason. The recipe is then checked with ft's own validation (``ft.recipe``), so an imported recipe
is one ``ft validate`` accepts. Importers depend on ``ft.recipe``, never the other way round, and import nothing
heavy (no torch, transformers or datasets): importing a config takes well under a second.

- ``axolotl``: Axolotl YAML configs (``ft import axolotl CONFIG.yml``, ``docs/import.md``).
"""
