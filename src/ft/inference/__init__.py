"""Using what a run leaves: ``ft merge``, ``ft generate``, and the exact match scored at the end of ``ft train``. Import
the modules themselves; this package imports nothing."""
