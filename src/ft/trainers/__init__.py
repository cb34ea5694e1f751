"""Trainers: one module per method (named after it: ``ft.recipe.methods.METHODS`` lists them), built from the recipe by
``build.build_trainer``, with ``mixin.FtTrainerMixin`` for what ft adds to every one of them, and what plugs into a
trainer: the console line, callbacks, rewards, the recipe's own code (``hooks``, ``plugins``), metrics, the optimizer
and scheduler, the distributed settings and the stop every rank agrees on.

Import the modules themselves: this package imports nothing, and TRL is imported only by the chosen method's
module, when ``ft train`` builds its trainer.
"""
