"""bitsandbytes imported without its import-time compiler set-up, for runs that run none of its code.

transformers' Trainer imports PEFT whenever PEFT is installed, and PEFT imports bitsandbytes whenever that is
installed: at its own import before PEFT 0.22, from 0.22 as it wraps a model's layers (every LoRA run). bitsandbytes,
when imported, wraps four of its device-independent fallback kernels (blockwise and 4-bit dequantization, the 32-bit
optimizer update) in ``torch.compile`` (docs/architecture.md names the release).
Wrapping compiles nothing yet, but it imports ``torch._inductor``'s compiler, a cost of every ``ft train`` on a GPU or a
CPU, quantized or not (measured in benchmarks/README.md), which a hand-written training loop does not pay.

A run that uses no bitsandbytes code (no ``model.quantization``, no bitsandbytes optimizer) imports bitsandbytes here
first, before PEFT does, with torch's ``TORCHDYNAMO_DISABLE=1`` set for that import alone (the switch torch's own
test utilities use the same way). ``torch.compile`` then hands those four functions back as they are, uncompiled;
nothing of this run calls them. The variable is restored before ``import_bitsandbytes`` returns, so
``train.torch_compile`` and every later ``torch.compile`` compile as usual. A run that uses bitsandbytes leaves its
import alone. Within one process the first import decides: a later quantized run in the same process (a test
session, a program driving ``ft.run.train.train`` several times) runs those fallback kernels uncompiled, with the
same results.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from ..recipe import Recipe
from ..recipe.optimizers import traits

# optimizers whose code is bitsandbytes' though their package is another (GaLore's 8-bit variants)
_BITSANDBYTES_INSIDE = ("galore_adamw_8bit", "galore_adamw_8bit_layerwise")


def uses_bitsandbytes(recipe: Recipe) -> bool:
    """Whether the run calls bitsandbytes code: a 4/8-bit base, a bitsandbytes optimizer, or a class of its."""
    optimizer = recipe.optimizer
    classes = (optimizer.cls or "", recipe.scheduler.cls or "")
    return (recipe.model.quantization is not None
            or traits(optimizer.name).package == "bitsandbytes" or optimizer.name in _BITSANDBYTES_INSIDE
            or any(name.startswith("bitsandbytes.") for name in classes))


def import_bitsandbytes(*, uses_it: bool) -> bool:
    """Import bitsandbytes now, without its ``torch.compile`` wrapping unless ``uses_it``; True when this call
    imported it that way. Does nothing when bitsandbytes is imported already, not installed, or the run uses it."""
    if uses_it or "bitsandbytes" in sys.modules or importlib.util.find_spec("bitsandbytes") is None:
        return False
    before = os.environ.get("TORCHDYNAMO_DISABLE")
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:  # a broken install: PEFT's own import of it fails the same way and PEFT carries on without
        return False
    finally:
        if before is None:
            del os.environ["TORCHDYNAMO_DISABLE"]
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = before
    return True
