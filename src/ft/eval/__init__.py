"""Benchmarks through lm-evaluation-harness (``lm-eval``): a model scored on standard tasks, named from lm-eval's
registry (``gsm8k``, ``arc_easy``: their data is on the Hub) or given as task YAML files (local data: ``dataset_path:
json`` with ``data_files``).

``tasks`` turns what a command or a recipe names into what lm-eval loads, and refuses what cannot run here before any
model loads; ``score`` runs lm-eval on a model already in memory (lm-eval's ``HFLM`` around it: no reload);
``command`` is ``ft eval``: each model found as ``ft generate`` finds it, scored, the results written into its run and
shown side by side.
"""
