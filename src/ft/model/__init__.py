"""The model a recipe trains and the models a command names: loading (a hub id or a local directory; pretrained
weights or built from the config; 4/8-bit), finding a run's model, the base of its adapter and a recipe's start
model (``locate``), adapters, and the bitsandbytes import. Import the modules themselves; this package imports
nothing."""
