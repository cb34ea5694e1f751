"""What ft adds to the Trainer's optimizer and scheduler: a class of the user's, per-module parameter groups, and a
scheduler class whose total steps ft fills in. ``FtTrainerMixin`` applies it in ``create_optimizer`` and
``create_scheduler``, the extension points the Trainer docs name for this.

- ``optimizer.class`` becomes the Trainer's ``optimizer_cls_and_kwargs``; its learning rate (when the class takes
  ``lr`` and the recipe's kwargs do not set it) is the config's ``learning_rate``, so ``optimizer.lr`` and the
  method's default apply as for a named optimizer.
- ``optimizer.groups`` are handed to the Trainer's own ``create_optimizer`` as ready parameter groups (its
  documented ``params`` override), so everything else it does (bitsandbytes' 32-bit embeddings, …) still happens.
- Arguments this machine needs that transformers' handler for the named optimizer cannot be told through
  ``optim_args`` (``ft.machine.hardware.optimizer_defaults``) reach the constructor the same way.
- ``scheduler.class`` is built with the optimizer and, where its signature asks for them and the recipe left them
  out, the number of training steps (``SCHEDULER_PROVIDES``).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

from ..recipe import Problem, Recipe
from ..recipe.optimization import ParamGroup
from .plugins import PluginError

OPTIMIZER_PROVIDES = ("params", "lr")  # what ft passes an optimizer class itself
TOTAL_STEPS = ("total_steps", "T_max", "total_iters", "num_training_steps")  # names of "all the steps" ft fills in
SCHEDULER_PROVIDES = ("optimizer", *TOTAL_STEPS)


@dataclass(frozen=True)
class Optimization:
    optimizer: tuple[type, dict] | None = None  # optimizer_cls_and_kwargs
    scheduler: tuple[type, dict] | None = None  # scheduler class and its kwargs
    groups: tuple[ParamGroup, ...] = ()
    machine_kwargs: dict = field(default_factory=dict)  # added to a named optimizer's constructor on this machine

    @property
    def changes_optimizer(self) -> bool:
        """Whether ft must step into the Trainer's optimizer creation (groups, or arguments for this machine)."""
        return bool(self.groups or self.machine_kwargs)


def optimization_for(recipe: Recipe, hooks, learning_rate: float, machine_kwargs: dict) -> Optimization:
    """The recipe's optimizer and scheduler choices beyond transformers' names (``hooks`` holds the classes), and
    ``machine_kwargs`` (``ft.machine.hardware.optimizer_defaults``: e.g. StableAdamW's ``triton=False`` without
    CUDA)."""
    optimizer = scheduler = None
    if hooks.optimizer_class is not None:
        kwargs = dict(recipe.optimizer.kwargs)
        if "lr" in inspect.signature(hooks.optimizer_class).parameters:
            kwargs.setdefault("lr", learning_rate)
        optimizer = (hooks.optimizer_class, kwargs)
    if hooks.scheduler_class is not None:
        scheduler = (hooks.scheduler_class, dict(recipe.scheduler.kwargs))
    return Optimization(optimizer, scheduler, tuple(recipe.optimizer.groups), dict(machine_kwargs))


def check_groups_match(named_parameters, groups) -> None:
    """Every group must take at least one trainable parameter: a regex that matches none is a typo, not a no-op."""
    names = [name for name, param in named_parameters if param.requires_grad]
    for i, group in enumerate(groups):
        if not any(re.search(group.match, name) for name in names):
            shown = ", ".join(names[:4])
            raise PluginError(Problem(f"optimizer.groups.{i}.match", f"`{group.match}` matches no trainable "
                                      f"parameter; their names look like {shown} ({len(names)} in all)."))


def param_groups(named_parameters, decay_names: set[str], groups, lr: float, weight_decay: float) -> list[dict]:
    """The optimizer's parameter groups: the first ``groups`` entry that matches a parameter's name sets its learning
    rate (``lr × lr_scale``) and, if given, its weight decay; inside each, the usual split (no decay for biases and
    norm weights) holds otherwise. Parameters no entry matches form the usual two groups."""
    buckets: dict[tuple, list] = {}
    for name, param in named_parameters:
        if not param.requires_grad:
            continue
        index = next((i for i, group in enumerate(groups) if re.search(group.match, name)), None)
        buckets.setdefault((index, name in decay_names), []).append(param)
    out = []
    for (index, decays), params in buckets.items():
        decay = weight_decay if decays else 0.0
        if index is None:
            out.append({"params": params, "weight_decay": decay})
            continue
        group = groups[index]
        own_decay = decay if group.weight_decay is None else float(group.weight_decay)
        out.append({"params": params, "weight_decay": own_decay, "lr": lr * group.lr_scale})
    return out


def build_scheduler(cls: type, kwargs: dict, optimizer, num_training_steps: int):
    """``cls(optimizer, **kwargs)``, with the total number of steps wherever the class asks for it by one of the
    names in ``TOTAL_STEPS`` and the recipe did not give it."""
    params = inspect.signature(cls).parameters
    filled = {name: num_training_steps for name in TOTAL_STEPS if name in params and name not in kwargs}
    return cls(optimizer, **filled, **kwargs)
