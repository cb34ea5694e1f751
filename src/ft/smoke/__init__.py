"""``ft train RECIPE --smoke``: the recipe rehearsed on the CPU (``rehearse``), with a tiny model of its family
(``tiny_model``, the shipped family assets under ``assets/``) and the first rows of its data (``first_rows``).
Import the modules themselves; this package imports nothing."""
