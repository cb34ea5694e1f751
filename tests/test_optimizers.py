"""Every ``optim`` name the installed transformers accepts either trains the tiny model on this CPU or is refused
before the model loads, with the reason and the fix; and what ``ft.recipe.optimizers`` says of each name is exact
(CUDA-only ones really fail on a CPU-only torch, the optim_args keys are the ones transformers reads)."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from conftest import CPU, ROOT, built_trainer, tiny_sft
from transformers.training_args import OptimizerNames

from ft.machine import hardware
from ft.machine.hardware import Hardware
from ft.recipe import RecipeError, load_recipe
from ft.recipe.optimizers import PACKAGES, traits
from ft.run.train import train

NAMES = [name.value for name in OptimizerNames]  # this transformers' names: a new release's are covered too
TARGETS = [".*self_attn.*", ".*mlp.*"]
APOLLO_MINI = {"proj": "random", "rank": 1, "scale": 128, "scale_type": "tensor", "update_proj_gap": 200}
# RAdam's first 4 steps are silent (its variance estimate is not yet usable): it moves weights from step 5
STEPS = {"schedule_free_radam": 5}


def _optimizer(name: str) -> dict:
    """The ``optimizer:`` section a recipe needs for ``name``: targets and a small rank for the projecting ones."""
    section = {"name": name, "lr": 3e-3}
    if traits(name).needs_target_modules:
        section.update(target_modules=TARGETS, args=APOLLO_MINI if name.startswith("apollo") else {"rank": 4})
    return section


def _recipe(tmp_path, name: str, **train_args) -> dict:
    recipe = tiny_sft(tmp_path / "out", max_steps=STEPS.get(name, 3), eval_strategy="no", logging_steps=1,
                      **train_args)
    recipe["data"]["eval"] = []
    recipe["optimizer"] = _optimizer(name)
    if traits(name).schedule_free:
        recipe["scheduler"] = {"type": "constant"}
    return recipe


def _expected_refusal(name: str) -> list[str] | None:
    """What the refusal of ``name`` must say on this CPU machine, or None if it must train."""
    info = traits(name)
    if info.unbuildable:
        return ["transformers", "relative_step"]
    if info.cuda_only:
        return ["CUDA"]
    package = PACKAGES.get(info.package)
    if package and importlib.util.find_spec(package.module) is None:
        return [info.package, *(["ft[optim]"] if package.install == "ft[optim]" else [])]
    return None


class _Start:
    """A TrainerCallback keeping the weights as training starts (built lazily: transformers imports slowly)."""

    def __new__(cls):
        from transformers import TrainerCallback

        class Start(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
                from transformers import Trainer

                self.model, self.optimizer = model, optimizer
                self.weights = {n: p.detach().clone() for n, p in model.named_parameters()}
                self.built = type(getattr(optimizer, "optimizer", optimizer))  # inside accelerate's wrapper
                self.named = Trainer.get_optimizer_cls_and_kwargs(args, model)[0]  # transformers' class for the name

            def changed(self) -> list[str]:
                return [n for n, p in self.model.named_parameters() if not torch.equal(self.weights[n], p.detach())]

        return Start()


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_optimizer_trains_on_cpu_or_is_refused_before_the_model_loads(name, write_recipe, tmp_path,
                                                                             monkeypatch):
    """Trains: finite losses, a weight changed, and the optimizer built is the class transformers maps the name to
    (a silent fallback to AdamW fails). Refused: before ft's model loading is called at all."""
    import ft.run.train

    loads = []
    real_load = ft.run.train.loading.load_model
    monkeypatch.setattr(ft.run.train.loading, "load_model", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    path = write_recipe(_recipe(tmp_path, name))
    expected = _expected_refusal(name)
    start = _Start()
    try:
        result = train(load_recipe(path), resume="never", say=lambda _: None, callbacks=[start])
    except RecipeError as refused:  # from the rules (load_recipe) or hardware.check_hardware: exit 2
        assert expected is not None, f"`{name}` was refused but should train: {refused}"
        [problem] = refused.problems
        assert problem.path == "optimizer.name" and problem.where.startswith(f"{path}:"), problem
        assert f"`{name}`" in problem.message and all(word in problem.message for word in expected), problem.message
        assert loads == []  # refused before any model loaded
        return
    assert expected is None, f"`{name}` trained, but ft refuses it on CPU ({expected})"
    losses = result.summary["first_train_loss"], result.summary["last_train_loss"]
    assert all(math.isfinite(loss) for loss in losses), losses
    assert start.changed(), f"`{name}` changed no weight in {result.summary['steps']} steps"
    assert start.built is start.named, f"`{name}` built {start.built.__name__}, not {start.named.__name__}"


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what fails on a CPU-only torch")
@pytest.mark.parametrize("name", [name for name in NAMES if traits(name).cuda_only])
def test_cuda_only_optimizers_really_fail_on_a_cpu_only_torch(name, write_recipe, tmp_path):
    trainer, _ = built_trainer(write_recipe(_recipe(tmp_path, name, max_grad_norm=0)))  # no machine check here
    with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
        trainer.train()


@pytest.mark.parametrize("name", [name for name in NAMES if traits(name).unbuildable])
def test_unbuildable_optimizers_still_fail_in_transformers(name):
    """When a transformers release builds it, this fails: then drop its ``Traits.unbuildable``."""
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments("unused", optim=name, optim_target_modules=[".*"], use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="relative_step"):
        Trainer.get_optimizer_cls_and_kwargs(args, torch.nn.Sequential(torch.nn.Linear(4, 4)))


class _ReadKeys(dict):
    """optim_args that note every key a handler asks for (one key of its own, so ``if optim_args:`` holds)."""

    def __init__(self):
        super().__init__(_probe="1")
        self.read = set()

    def _note(self, key):
        self.read.add(key)
        return key

    def get(self, key, *default):
        return super().get(self._note(key), *default)

    def pop(self, key, *default):
        return super().pop(self._note(key), *default)

    def __contains__(self, key):
        return super().__contains__(self._note(key))

    def __getitem__(self, key):
        return super().__getitem__(self._note(key))


def test_args_tables_are_the_keys_transformers_reads():
    """``Traits.args`` is exact: the keys each installed handler reads from optim_args (names whose package is not
    installed cannot be asked, and are refused instead)."""
    from transformers import TrainingArguments
    from transformers.trainer_optimizer import _OPTIMIZER_HANDLERS, OptimizerContext

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    wrong = {}
    for name in NAMES:
        package = PACKAGES.get(traits(name).package)
        if package and importlib.util.find_spec(package.module) is None:
            continue
        args = TrainingArguments("unused", optim=name, optim_target_modules=[".*"], use_cpu=True, report_to="none")
        keys = _ReadKeys()
        context = OptimizerContext(args, model, {"lr": 1e-3}, {"betas": (0.9, 0.999), "eps": 1e-8}, keys)
        try:
            _OPTIMIZER_HANDLERS[name](context)
        except ValueError:  # an unbuildable one fails after reading its keys
            assert traits(name).unbuildable, name
        if keys.read - {"_probe"} != set(traits(name).args):
            wrong[name] = sorted(keys.read - {"_probe"})
    assert not wrong, f"transformers reads these optim_args keys; update Traits.args: {wrong}"


def test_apollo_mini_args_reach_the_optimizer(write_recipe, tmp_path):
    recipe = _recipe(tmp_path, "apollo_adamw")
    assert recipe["optimizer"]["args"] == APOLLO_MINI
    trainer, _ = built_trainer(write_recipe(recipe))
    projected = [group for group in trainer.create_optimizer().param_groups if "rank" in group]
    assert projected and all(group["params"] for group in projected)
    assert {key: projected[0][key] for key in APOLLO_MINI} == {**APOLLO_MINI, "scale": 128.0}


@pytest.mark.parametrize("optimizer, key, words", [
    ({"name": "apollo_adamw", "target_modules": TARGETS, "args": {"rnak": 1}}, "optimizer.args.rnak",
     ["silently ignored", "Did you mean 'rank'"]),
    ({"name": "adamw_torch", "args": {"momentum": 0.9}}, "optimizer.args.momentum", ["reads none"]),
    ({"name": "rmsprop_bnb", "args": {"alpha": 0.9}}, "optimizer.args.alpha", ["reads none"]),
    ({"name": "sgd", "args": {"momentum": None}}, "optimizer.args.momentum", ["number, true/false"]),
    ({"name": "galore_adamw", "target_modules": TARGETS, "args": {"proj_type": "left, right"}},
     "optimizer.args.proj_type", ["commas"]),
    ({"name": "adamw_torch_4bit", "args": {"block_size": 128}}, "optimizer.args.block_size", ["as text"]),
    ({"name": "stable_adamw", "args": {"decouple_lr": False}}, "optimizer.args.decouple_lr", ["turn it on"]),
    ({"name": "galore_adafactor_layerwise", "target_modules": TARGETS}, "optimizer.name", ["galore_adafactor"]),
    ({"name": "apollo_adamw_layerwise", "target_modules": TARGETS}, "train.gradient_accumulation_steps",
     ["set it to 1"]),
])
def test_optimizer_settings_that_would_not_reach_the_optimizer_are_refused(write_recipe, tmp_path, optimizer, key,
                                                                           words):
    recipe = tiny_sft(tmp_path / "out", gradient_accumulation_steps=2 if "layerwise" in optimizer["name"] else 1)
    recipe["optimizer"] = optimizer
    with pytest.raises(RecipeError) as refused:
        load_recipe(write_recipe(recipe))
    messages = {problem.path: problem.message for problem in refused.value.problems}
    assert all(word in messages.get(key, "") for word in words), messages


def test_args_that_reach_the_optimizer_are_accepted(write_recipe, tmp_path):
    for optimizer in ({"name": "sgd", "args": {"momentum": 0.9, "nesterov": True}},
                      {"name": "stable_adamw", "args": {"decouple_lr": True, "max_lr": 1e-3}},
                      {"name": "adamw_torch_8bit", "args": {"bf16_stochastic_round": False}},
                      _optimizer("apollo_adamw")):
        recipe = tiny_sft(tmp_path / "out")
        recipe["optimizer"] = optimizer
        assert load_recipe(write_recipe(recipe)).recipe.optimizer.args == optimizer["args"]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_a_missing_package_is_named_with_where_it_comes_from(package):
    message = hardware._missing_package("some_optimizer", package)
    assert f"`{package}`" in message and ("'ft[optim]'" in message) == (PACKAGES[package].install == "ft[optim]")
    assert ("pip install" in message) == bool(PACKAGES[package].install)


def test_optim_extra_is_the_packages_table():
    """``PACKAGES`` says which optimizer packages ``pip install 'ft[optim]'`` brings; pyproject.toml decides."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements):
        return {req.split(">")[0].split("=")[0].split("<")[0].strip() for req in requirements}

    assert names(project["optional-dependencies"]["optim"]) == {
        name for name, package in PACKAGES.items() if package.install == "ft[optim]"}
    assert {name for name, package in PACKAGES.items() if package.install == "ft"} <= names(project["dependencies"])


@pytest.mark.slow
def test_stable_adamw_takes_its_loop_path_without_cuda(write_recipe, tmp_path):
    """torch-optimi picks Triton whenever Triton imports (it decides from an empty parameter list), and Triton fails
    on CPU tensors; without CUDA ft passes ``triton=False`` (``hardware.optimizer_defaults``)."""
    loaded = load_recipe(write_recipe(_recipe(tmp_path, "stable_adamw")))
    assert hardware.optimizer_defaults(loaded.recipe, CPU) == {"triton": False}
    assert hardware.optimizer_defaults(loaded.recipe, Hardware(True, True, 1, "NVIDIA H100")) == {}
    start = _Start()
    train(loaded, resume="never", say=lambda _: None, callbacks=[start])
    assert start.optimizer.defaults["triton"] is False and start.changed()
