"""The ordered run of ``ft train`` and ``ft preprocess`` (``train``, ``preprocess``), and what surrounds it: the
processes it launches (``launch``, ``ranks``), stop signals, the Hub checks (``hub``), drift on resume and the library
notices it hides. Import the modules themselves; this package imports nothing."""
