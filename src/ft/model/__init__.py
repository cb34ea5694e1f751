"""The model a recipe trains: tokenizer and model loading (a hub id or a local directory; pretrained weights or built
from the config), adapters, and the bitsandbytes import. Import the modules themselves; this package imports
nothing."""
