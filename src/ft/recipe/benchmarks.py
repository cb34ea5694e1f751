"""The ``benchmarks:`` section: lm-eval tasks scored in process on the model being trained (docs/eval.md), before
training, at its end and at each checkpoint, with the settings ``ft eval`` takes as options."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, PositiveInt, StrictStr, ValidationInfo, field_validator

from .base import Section, resolve_input_path

WHEN = ("before", "end", "each_save")


def is_task_file(task: str) -> bool:
    """A ``tasks`` entry that names a task YAML file (read from disk), not a task of lm-eval's registry."""
    return task.endswith((".yaml", ".yml"))


class BenchmarksSection(Section):
    """lm-eval tasks the run scores the model on (``ft eval``'s options, as keys)."""

    tasks: list[StrictStr] = Field(min_length=1, description="lm-eval task names (`arc_easy`: their data is on the "
                                   "Hub) or task YAML files (relative to the recipe), as `ft eval --tasks` takes them.")
    when: list[Literal[WHEN]] = Field(["before", "end"], min_length=1, description="When the model is scored: "
                                      "`before` training (the model as loaded), at the `end` (the trained model), "
                                      "`each_save` (as each checkpoint is written, into its trainer state).")
    limit: Optional[Union[PositiveInt, float]] = Field(None, gt=0, description="Rows scored per task: a count, or a "
                                                       "fraction below 1 (default: every row).")
    num_fewshot: Optional[int] = Field(None, ge=0, description="Examples in each prompt (default: the task's own).")
    batch_size: PositiveInt = Field(8, description="Prompts scored at once.")
    chat_template: Optional[bool] = Field(None, description="Render prompts with the model's chat template "
                                          "(default: where the tokenizer has one).")
    system: Optional[StrictStr] = Field(None, description="A system message before every prompt (and a task's "
                                        "description).")

    @field_validator("tasks")
    @classmethod
    def _files_next_to_the_recipe(cls, value: list[str], info: ValidationInfo) -> list[str]:
        """A task file (``.yaml``/``.yml``) made absolute where it names one next to the recipe; names unchanged."""
        resolved = []
        for task in value:  # a loop, not a comprehension: the loader finds path keys by the calls in this code
            resolved.append(resolve_input_path(task, info) if is_task_file(task) else task)
        return resolved

    @field_validator("when")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("names a moment twice; list each of before, end, each_save once")
        return value
