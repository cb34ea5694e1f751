"""What this machine can do and what follows from it, read before any model or data loads: the accelerator and the
trainer defaults it implies (``hardware``), and the experiment trackers installed here (``trackers``). Below both
``ft plan`` and ``ft train``; imports nothing heavy. Import the modules themselves; this package imports nothing."""
