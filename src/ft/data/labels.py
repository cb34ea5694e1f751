"""The label that marks a token without loss: written by ft's tokenizer (``ft.data``), read by the trainers'
losses and metrics (``ft.trainers``). It is PyTorch's ``cross_entropy`` default ``ignore_index``, which
transformers' models and TRL's collators use too."""

IGNORE_INDEX = -100
