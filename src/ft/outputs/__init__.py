"""The run directory: checkpoints and where a run resumes from, ``summary.json`` and ``log_history.json``, the plots,
and reading runs back for ``ft report``. Import the modules themselves; this package imports nothing."""
