"""Using what a run leaves: finding a run's model and the base of its adapter (``locate``), ``ft merge``,
``ft generate``, and the exact match scored at the end of ``ft train``. Import the modules themselves; this package
imports nothing."""
