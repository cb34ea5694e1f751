"""Recipe drift on resume: what changed between the recipe a run was started with (its ``recipe.yaml``) and the
one that resumes it.

A checkpoint holds weights, optimizer and scheduler state and the place in the data for one recipe; resuming it
under another model, data, batch size, optimizer, schedule, seed or method section would train a mixture that no
recipe describes. So every change is refused except those listed in ``HARMLESS``: how long to train, how often to
log, evaluate and save, where to report and push, and the evaluation data, which do not alter the updates the
model receives.

Processes: the number of them (``launch.num_processes`` × ``launch.nnodes``, and the run's real WORLD_SIZE against
the checkpoint's, which holds one ``rng_state_<rank>.pth`` per process) sets the global batch, so a change is
refused; where the machines meet (addresses, ports, ``node_rank``) is harmless. ``distributed.kind``,
``distributed.fsdp.state_dict``, ``distributed.deepspeed.stage`` and ``config`` decide how a checkpoint is written
(DDP: one model file; FSDP: sharded or full state dicts; DeepSpeed: its own ZeRO files), so a change is refused;
the settings that change only speed or memory (``find_unused_parameters``, FSDP sharding, offloading, activation
checkpointing, wrapping) are harmless. A recipe written before these sections existed reads as their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from ..outputs.checkpoints import ResumeError
from ..recipe import Recipe
from ..recipe.distributed import DeepSpeedSettings, DistributedSection, FsdpSettings, LaunchSection
from ..recipe.resolved import resolved_recipe_yaml
from ..recipe.train_section import method_fields

# dotted-key prefixes of changes that leave the training trajectory alone ("train.eval_" covers eval_strategy,
# eval_steps, …; "data.eval" the evaluation sources, but not data.eval.split_ratio, which moves rows out of training)
HARMLESS = ("train.max_steps", "train.num_train_epochs", "train.output_dir", "train.logging_", "train.eval_",
            "train.per_device_eval_batch_size", "train.save_", "train.report_to", "train.run_name",
            "train.push_to_hub", "train.hub_", "train.disable_tqdm", "train.enable_jit_checkpoint",
            "train.load_best_model_at_end", "train.metric_for_best_model", "train.greater_is_better",
            "data.prepared_path", "data.require_prepared", "data.num_proc", "data.eval", "metrics",
            "launch.node_rank", "launch.master_addr", "launch.master_port", "launch.rdzv_endpoint",
            "distributed.find_unused_parameters", "distributed.fsdp.sharding", "distributed.fsdp.cpu_offload",
            "distributed.fsdp.activation_checkpointing", "distributed.fsdp.wrap", "distributed.deepspeed.offload_",
            "distributed.deepspeed.nvme_path")
NOT_HARMLESS = ("data.eval.split_ratio",)
# sections a saved recipe may lack or leave null (written before they existed, or not written): read as defaults
_SECTION_DEFAULTS = {"launch": LaunchSection, "distributed": DistributedSection}
_SUBSECTION_DEFAULTS = {"fsdp": FsdpSettings, "deepspeed": DeepSpeedSettings}


@dataclass(frozen=True)
class Change:
    key: str
    saved: object
    now: object

    def render(self) -> str:
        return f"{self.key}: {_show(self.saved)} → {_show(self.now)}"


class DriftError(ResumeError):
    """The resuming recipe changes what the checkpoint was trained with (exit code 2)."""


def check_drift(recipe: Recipe, output_dir: Path, checkpoint: str, command: str, world_size: int = 1) -> list[Change]:
    """Raise ``DriftError`` when ``recipe`` changes anything but ``HARMLESS`` keys against ``output_dir/recipe.yaml``,
    or resumes ``checkpoint`` with another number of processes than the ``world_size`` it runs with; return the
    harmless changes (for a note). A run without a saved recipe has nothing to compare."""
    saved_file = output_dir / "recipe.yaml"
    if not saved_file.is_file():
        return []
    saved = yaml.safe_load(saved_file.read_text()) or {}
    now = yaml.safe_load(resolved_recipe_yaml(recipe))  # as it would be saved: redacted, in YAML's types
    changes = differences(_with_section_defaults(saved), _with_section_defaults(now), recipe.method)
    changes += _process_change(Path(checkpoint), world_size)
    blocking = [change for change in changes if not is_harmless(change.key)]
    if blocking:
        listed = "\n".join(f"  - {change.render()}" for change in blocking)
        raise DriftError(f"{output_dir} holds a run of a different recipe, so it cannot resume from {checkpoint}; "
                         f"changed since {saved_file} was written:\n{listed}\nUndo these changes to resume it, or "
                         f"train the new recipe from the start in another directory (--set train.output_dir=… "
                         f"--resume never), or in this one, deleting the old run ({command} --resume never "
                         "--overwrite).")
    return changes


def differences(saved: dict, now: dict, method: str) -> list[Change]:
    """Every leaf that differs, by dotted key. ``train:`` holds only the keys a recipe set, so a key missing on one
    side counts as TRL's default there (setting a key to its default is no change); elsewhere a key missing on one
    side and null on the other (a key newer than the saved recipe, left unset) is no change."""
    old, new = _flat(saved), _flat(now)
    defaults = {f"train.{name}": spec.get("default") for name, spec in method_fields(method).items()}
    missing = object()
    changes = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key, defaults.get(key, missing)), new.get(key, defaults.get(key, missing))
        if before in (missing, None) and after in (missing, None):  # a key newer than the saved recipe, unset
            continue
        if before != after:
            changes.append(Change(key, None if before is missing else before, None if after is missing else after))
    return changes


def _with_section_defaults(recipe: dict) -> dict:
    """``recipe`` (a resolved recipe as YAML data) with ``launch:`` and ``distributed:`` (and its kind's settings)
    filled with their defaults where missing or null, so that writing a section's defaults is no change."""
    recipe = dict(recipe)
    for name, section in _SECTION_DEFAULTS.items():
        recipe[name] = {**section().model_dump(mode="json"), **(recipe.get(name) or {})}
    distributed = recipe["distributed"]
    for name, section in _SUBSECTION_DEFAULTS.items():
        if distributed.get("kind") == name:
            distributed[name] = {**section().model_dump(mode="json"), **(distributed.get(name) or {})}
        else:
            distributed[name] = None  # another kind's settings are read by no one (and refused by a rule)
    deepspeed = distributed.get("deepspeed")
    if deepspeed and deepspeed.get("stage") is None and deepspeed.get("config") is None:
        deepspeed["stage"] = 2  # unset: 2
    return recipe


def _process_change(checkpoint: Path, world_size: int) -> list[Change]:
    """The processes the checkpoint was written by against this run's: transformers saves one ``rng_state_<rank>.pth``
    per process (``rng_state.pth`` for one). Nothing when the checkpoint holds no RNG state."""
    ranks = len(list(checkpoint.glob("rng_state_*.pth")))
    saved = ranks or (1 if (checkpoint / "rng_state.pth").is_file() else None)
    if saved is None or saved == world_size:
        return []
    return [Change("processes (WORLD_SIZE; the global batch is processes × per-device batch × accumulation)",
                   saved, world_size)]


def is_harmless(key: str) -> bool:
    return key.startswith(HARMLESS) and not key.startswith(NOT_HARMLESS)


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict) and value:
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}.").items()}
    if isinstance(value, list) and value:
        return {k: v for i, item in enumerate(value) for k, v in _flat(item, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): value}


def _show(value) -> str:
    return "(unset)" if value is None else repr(value)
