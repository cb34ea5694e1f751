"""A method entry with a teacher model (TRL's GKD, ``trl.experimental.gkd``), registered from outside ft: run as a
script by ``tests/test_layout.py`` (``python tests/new_method_gkd.py WORK_DIR``), it prints ``ok`` when the Hub
check, ``ft plan``, the smoke rehearsal and the trainer build all follow what the section declares, with no file of
ft edited. The steps are those docs/architecture.md gives for adding a method: the entry without its section first,
its ``train:`` fields from ``scripts/gen_train_fields.py`` (here in memory), the section, then its trainer module
(here outside the package, named by ``Method.trainer``)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import ClassVar

import yaml
from pydantic import Field, StrictStr, field_validator

from ft.recipe import methods, train_section
from ft.recipe.base import resolve_input_path

ROOT = Path(__file__).resolve().parents[1]
ASSETS, DATA = ROOT / "assets" / "tiny-llama", ROOT / "data" / "arithmetic" / "train.jsonl"
WORK = Path(sys.argv[1])

sys.path.insert(0, str(ROOT / "scripts"))
from gen_train_fields import build_table  # noqa: E402

methods.METHODS["gkd"] = methods.Method(None, ("chat",), "trl.experimental.gkd:GKDConfig", ft_tokenizes=False)
train_section.field_table()["methods"]["gkd"] = build_table()["methods"]["gkd"]


class GkdSection(methods.MethodSection):
    """GKD: the student learns the teacher's next-token distribution, on the data's completions and (``lmbda`` of
    the batches) on its own."""

    CONFIG_FIELDS: ClassVar[dict[str, str]] = {"lmbda": "lmbda", "beta": "beta", "temperature": "temperature"}
    CONFIG_MOVED: ClassVar[dict[str, str]] = {"teacher_model_name_or_path": "gkd.teacher_model"}
    EXAMPLE: ClassVar[str] = "{teacher_model: org/teacher}"

    teacher_model: StrictStr = Field(description="The teacher (hub id or directory), of the student's vocabulary.")
    lmbda: float = Field(methods.trl_default("gkd", "lmbda"), ge=0, le=1, description="Share of on-policy batches.")
    beta: float = Field(methods.trl_default("gkd", "beta"), ge=0, le=1, description="The JSD's interpolation.")
    temperature: float = Field(methods.trl_default("gkd", "temperature"), gt=0, description="Sampling temperature.")

    resolve_teacher = field_validator("teacher_model")(resolve_input_path)

    def models(self, at: str) -> tuple[methods.ExtraModel, ...]:
        return (methods.ExtraModel(f"{at}.teacher_model", self.teacher_model, "teacher"),)


(WORK / "gkd_trainer.py").write_text('''
from trl.experimental.gkd import GKDConfig, GKDTrainer

from ft.recipe.methods import models_of
from ft.trainers.build import section_kwargs, trainer_kwargs, trl_config
from ft.trainers.mixin import FtTrainerMixin


class FtGKDTrainer(FtTrainerMixin, GKDTrainer):
    pass


def config(recipe, defaults):
    return trl_config(GKDConfig, recipe, defaults, max_length=recipe.data.max_length,
                      **section_kwargs(recipe.method_section))


def build(recipe, inputs):
    (teacher,) = [extra.name for extra in models_of(recipe) if extra.role == "teacher"]
    return FtGKDTrainer(teacher_model=teacher, **trainer_kwargs(recipe, inputs, config(recipe, inputs.defaults)))
''')
sys.path.insert(0, str(WORK))
methods.METHODS["gkd"] = methods.Method(GkdSection, ("chat",), "trl.experimental.gkd:GKDConfig", ft_tokenizes=False,
                                        trainer="gkd_trainer")
methods.METHOD_SECTIONS["gkd"] = GkdSection

from ft.machine.hardware import Hardware  # noqa: E402
from ft.plan.memory import estimate, setup_for  # noqa: E402
from ft.plan.shape import PlanError, read_shape  # noqa: E402
from ft.recipe import RecipeError, load_recipe  # noqa: E402
from ft.run.hub import HubRead, hub_reads  # noqa: E402
from ft.run.train import prepare_trainer  # noqa: E402
from ft.smoke import rehearse  # noqa: E402
from ft.trainers.hooks import resolve_hooks  # noqa: E402


def recipe(teacher: str, **train):
    path = WORK / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "method": "gkd", "model": {"name": str(ASSETS), "init": "random"},
        "data": {"train": [{"path": str(DATA), "format": "chat"}], "max_length": 64},
        "gkd": {"teacher_model": teacher, "lmbda": 0.25, "beta": 0.3, "temperature": 0.7},
        "train": {"output_dir": str(WORK / "run"), "max_steps": 2, "per_device_train_batch_size": 2,
                  "save_strategy": "no", "report_to": "none", **train}}))
    return load_recipe(path)


# the Hub check asks for the teacher, under its key
hub = recipe("org/teacher")
assert HubRead("gkd.teacher_model", "org/teacher", "model") in hub_reads(hub.recipe), hub_reads(hub.recipe)
# the TRL field the section replaces is refused under train:, pointing at the section
try:
    recipe("org/teacher", teacher_model_name_or_path="org/other")
    raise AssertionError("train.teacher_model_name_or_path was accepted")
except RecipeError as exc:
    assert "gkd.teacher_model" in str(exc), exc

# ft plan counts the teacher's weights at its own shape, read from its own config: a teacher of 6 layers (the
# student has 2) whose parameters' real bytes are the estimate's; one whose config cannot be read is named by its key
teacher_dir = WORK / "teacher"
teacher_dir.mkdir()
config = json.loads((ASSETS / "config.json").read_text())
(teacher_dir / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 6, "intermediate_size": 384}))
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(ASSETS / name, teacher_dir / name)
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

teacher = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(teacher_dir))
teacher.save_pretrained(teacher_dir)
real = sum(p.numel() * p.element_size() for p in teacher.parameters())
local = recipe(str(teacher_dir)).recipe
shape = read_shape(local)
parts = {part.name: part for part in estimate(shape, setup_for(local, shape, "cpu")).parts}
assert parts["teacher model gkd.teacher_model (frozen)"].at_peak == real, (parts, real)
assert "reference model (frozen copy)" not in parts
try:
    setup_for(hub.recipe, shape, "cpu")
    raise AssertionError("an unreadable teacher was planned")
except PlanError as exc:
    assert str(exc).startswith("gkd.teacher_model: "), exc

# the smoke rehearsal puts the tiny model in the teacher's place, and `ft train --smoke` trains with it
smoke = rehearse.prepare(hub, say=lambda _: None)
subs = {s.key: s for s in smoke.substitutions}
assert subs["gkd.teacher_model"].was == "org/teacher", subs
assert subs["gkd.teacher_model"].why == "the teacher model is the tiny model too", subs["gkd.teacher_model"]
result = rehearse.train(hub, say=lambda _: None)
assert result.status == "completed" and result.summary["steps"] == rehearse.STEPS, result.summary
assert "gkd.teacher_model" in {s["key"] for s in result.summary["smoke"]["substitutions"]}

# the trainer is TRL's GKDTrainer, built with the declared teacher (its 6 layers, not a copy of the student), every
# setting of the section in its config; two steps learn from the teacher's distribution (a loss above 0)
from trl.experimental.gkd import GKDTrainer  # noqa: E402

trainer, _ = prepare_trainer(local, resolve_hooks(local, WORK), Hardware(cuda=False, bf16=False, devices=0, name="cpu"),
                             say=lambda _: None)
assert isinstance(trainer, GKDTrainer)
assert (trainer.args.lmbda, trainer.args.beta, trainer.args.temperature) == (0.25, 0.3, 0.7)
assert trainer.teacher_model.config.num_hidden_layers == 6 and trainer.model.config.num_hidden_layers == 2
trainer.train()
assert trainer.state.global_step == 2 and trainer.state.log_history[-1]["train_loss"] > 0, trainer.state.log_history
print("ok")
