"""The ordered run of ``ft train`` and ``ft preprocess`` (``train``, ``preprocess``), and what surrounds it: the
processes it launches (``launch``, ``ranks``), stop signals, the machine checks (``hardware``, ``hub``), drift on
resume and the library notices it hides. Import the modules themselves; this package imports nothing, so ``ft plan``
can read ``hardware`` without the trainers."""
