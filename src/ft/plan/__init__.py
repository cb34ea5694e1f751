"""``ft plan``: a recipe's peak training memory per device, from the model's config alone. ``shape`` reads the model's
dimensions from its config, ``vision`` a vision-language model's tower and projector (from its config) and the
images a row puts through them (from the data and the processor), ``memory`` is the memory model (every part of a
step's peak, and the constants it counts with), ``suggest`` the single changes that lower the peak (and the figures
``ft train``'s checks read), ``report`` the command's report. Import the modules themselves; this package imports
nothing."""
