"""GRPO: the built-in rewards, user rewards by ``module:function`` (and their exit-2 errors), how TRL batches
prompts per generation round, and that a short run from the SFT model raises its reward. Real TRL on CPU."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import ASSETS, DATA, built_trainer, logged_rewards, run_ft

from ft.data import DataError
from ft.recipe import load_recipe
from ft.recipe.methods import BUILTIN_REWARDS
from ft.trainers.plugins import PluginError
from ft.trainers.rewards import BUILTINS, reward_functions

PROMPTS = str(DATA / "prompts.jsonl")


def tiny_grpo(output_dir: Path, rewards: list[dict], model: Path = ASSETS, init: str = "random", grpo=None,
              **train) -> dict:
    """A minimal GRPO recipe on the arithmetic prompts (absolute paths: it may live anywhere)."""
    return {
        "method": "grpo",
        "model": {"name": str(model), "init": init},
        "data": {"train": [{"path": PROMPTS, "format": "prompt"}]},
        "optimizer": {"lr": 1.0e-3},
        "grpo": {"num_generations": 8, "max_completion_length": 8, "rewards": rewards, **(grpo or {})},
        "train": {"output_dir": str(output_dir), "max_steps": 4, "per_device_train_batch_size": 16,
                  "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0, **train},
    }


def _module(tmp_path: Path, name: str, code: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))


def _rewards(write_recipe, tmp_path, rewards):
    path = write_recipe(tiny_grpo(tmp_path / "out", rewards))
    return reward_functions(load_recipe(path).recipe.grpo.rewards, tmp_path, "grpo")


# --- built-in rewards on hand-written completions -------------------------------------------------------------


def _call(fn, completions, **columns):
    return fn(prompts=["What is 12 + 7?"] * len(completions), completions=completions, **columns)


def test_every_builtin_named_by_the_recipe_schema_exists():
    assert set(BUILTINS) == set(BUILTIN_REWARDS)


def test_exact_match():
    fn = BUILTINS["exact_match"]()
    completions = ["19", "  19\n", "19.", "The answer is 19", "", [{"role": "assistant", "content": " 19 "}],
                   [{"role": "assistant", "content": "1"}, {"role": "tool", "content": "x"},
                    {"role": "assistant", "content": "9"}]]
    assert _call(fn, completions, answer=["19"] * 7) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    solution = BUILTINS["exact_match"](field="solution")
    assert _call(solution, ["7", "8"], solution=["7", " 7 "], answer=["8", "8"]) == [1.0, 0.0]


def test_numeric_match():
    fn = BUILTINS["numeric_match"]()
    completions = ["19", "The answer is 19.", "19.0", "191", "18, not 19", "nineteen", "-19",
                   [{"role": "assistant", "content": "It is 19"}]]
    assert _call(fn, completions, answer=["19"] * 8) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert _call(fn, ["-3", "1,024 apples", "x"], answer=["-3", 1024, "no number here"]) == [1.0, 1.0, 0.0]
    near = BUILTINS["numeric_match"](tolerance=2)
    assert _call(near, ["17", "21", "16", "22.5", "x"], answer=["19"] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_format():
    fn = BUILTINS["format"](pattern=r"\d+")
    completions = ["19", " 19 \n", "19!", "a 19", "", [{"role": "assistant", "content": "42"}]]
    assert _call(fn, completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    tagged = BUILTINS["format"](pattern=r"<answer>\d+</answer>")
    assert _call(tagged, ["<answer>19</answer>", "<answer>19</answer> extra"]) == [1.0, 0.0]


def test_length_penalty():
    by_tokens = BUILTINS["length_penalty"](target=4)
    rewards = by_tokens(prompts=["p"] * 4, completions=["a", "b", "c", "d"],
                        completion_ids=[[1, 2], [1, 2, 3, 4], [1] * 6, [1] * 12])
    assert rewards == [0.0, 0.0, -0.5, -2.0]  # nothing up to the target, then growing with the excess
    by_chars = BUILTINS["length_penalty"](target=2, unit="characters")
    assert _call(by_chars, ["19", "190", "19 is it", [{"role": "assistant", "content": "1900"}]],
                 completion_ids=[[1]] * 4) == [0.0, -0.5, -3.0, -1.0]


def test_builtin_reading_a_field_the_rows_lack():
    with pytest.raises(DataError, match=r"`answer` field.*\(fields: solution\)"):
        _call(BUILTINS["numeric_match"](), ["19"], solution=["19"])


def test_reward_functions_in_recipe_order_with_names(write_recipe, tmp_path):
    _module(tmp_path, "grpo_named", """
        def brevity(prompts, completions, **kwargs):
            return [-len(c) for c in completions]
    """)
    functions = _rewards(write_recipe, tmp_path, [
        {"name": "numeric_match"}, {"fn": "grpo_named:brevity", "weight": 0.5},
        {"name": "format", "weight": 0.1, "args": {"pattern": r"\d+"}},
        {"name": "format", "weight": 0.2, "args": {"pattern": r"\d\d"}}])
    assert [f.__name__ for f in functions] == ["numeric_match", "brevity", "format", "format_3"]  # TRL logs these
    assert _call(functions[3], ["19", "7"]) == [1.0, 0.0]


@pytest.mark.parametrize("reward, key, words", [
    ({"name": "format"}, "grpo.rewards.0.args", "needs `args: {pattern: ...}`"),
    ({"name": "format", "args": {"pattern": "(unclosed"}}, "grpo.rewards.0.args.pattern", "not a valid regular"),
    ({"name": "exact_match", "args": {"feild": "x"}}, "grpo.rewards.0.args.feild", "Did you mean 'field'"),
    ({"name": "length_penalty", "args": {"target": 0}}, "grpo.rewards.0.args.target", "at least 1"),
    ({"name": "numeric_match", "args": {"tolerance": -1}}, "grpo.rewards.0.args.tolerance", "at least 0"),
])
def test_builtin_argument_errors_name_the_key(write_recipe, tmp_path, reward, key, words):
    with pytest.raises(PluginError) as info:
        _rewards(write_recipe, tmp_path, [reward])
    assert info.value.problem.path == key and words in info.value.problem.message


# --- user rewards by module:function --------------------------------------------------------------------------


@pytest.mark.parametrize("reference, code, words", [
    ("no_such_rewards:score", None, "no module `no_such_rewards`"),
    ("my_rewards_a:recrod", "def record(prompts, completions, **kwargs):\n    return [0.0] * len(prompts)\n",
     "Did you mean 'record'"),
    ("my_rewards_b:record", "def record(prompt, completion):\n    return [0.0]\n", "documented signature"),
])
def test_unusable_reward_exits_2_before_any_model_loads(write_recipe, tmp_path, reference, code, words):
    if code:
        (tmp_path / f"{reference.split(':')[0]}.py").write_text(code)
    # a model directory that does not exist: had anything tried to load it, the error would be another one
    recipe = tiny_grpo(tmp_path / "out", [{"fn": reference}], model=tmp_path / "no-model", init="pretrained")
    path = write_recipe(recipe)
    result = run_ft("train", str(path))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip() == f"- fn: {reference}")
    assert result.returncode == 2, result.stderr
    assert f"{path}:{line}: grpo.rewards.0.fn:" in result.stderr and words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was loaded or written


def test_a_reward_without_kwargs_is_refused(write_recipe, tmp_path):
    """TRL passes completion_ids, trainer_state and every field of the rows by keyword: **kwargs is required."""
    _module(tmp_path, "grpo_no_kwargs", """
        def score(prompts, completions):
            return [0.0] * len(prompts)
    """)
    with pytest.raises(PluginError) as info:
        _rewards(write_recipe, tmp_path, [{"name": "exact_match"}, {"fn": "grpo_no_kwargs:score"}])
    assert info.value.problem.path == "grpo.rewards.1.fn" and "**kwargs" in info.value.problem.message


RECORDING_REWARD = """
    import json
    from pathlib import Path

    LOG = Path(__file__).with_name("reward_calls.jsonl")

    def record(prompts, completions, completion_ids, answer, trainer_state, **kwargs):
        with LOG.open("a") as log:
            log.write(json.dumps({"prompts": len(prompts), "completions": len(completions),
                                  "completion_ids": len(completion_ids), "answers": len(answer),
                                  "distinct_prompts": len({json.dumps(p) for p in prompts}),
                                  "step": trainer_state.global_step}) + "\\n")
        return [float(len(c[-1]["content"].strip()) == 2) for c in completions]
"""


@pytest.mark.slow
def test_generation_round_batches_and_user_reward_end_to_end(write_recipe, tmp_path):
    """per_device_train_batch_size 4 × steps_per_generation 8: one round generates 32 completions (4 prompts ×
    8 generations) and serves 8 optimizer steps, so 16 steps call the reward twice, with 32 completions each."""
    _module(tmp_path, "my_rewards", RECORDING_REWARD)
    recipe = tiny_grpo(tmp_path / "out", [{"fn": "my_rewards:record"}], grpo={"steps_per_generation": 8},
                       max_steps=16, per_device_train_batch_size=4)
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    calls = [json.loads(line) for line in (tmp_path / "reward_calls.jsonl").read_text().splitlines()]
    assert [c["step"] for c in calls] == [0, 8]
    for call in calls:
        assert call == {**call, "prompts": 32, "completions": 32, "completion_ids": 32, "answers": 32}
        assert call["distinct_prompts"] <= 4  # 4 prompts, each sampled 8 times
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 16 and summary["tokens"] > 0
    # TRL logs the mean reward at every step (logging_steps 1): the run draws it next to its loss
    assert "plots/reward.png" in summary["plots"]
    png = (tmp_path / "out" / "plots" / "reward.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000  # axes and a line, not an empty canvas


def test_train_dataloader_yields_one_generation_round_and_reference_model(write_recipe, tmp_path):
    """Built in-process, no training: the dataloader's batch is a whole generation round (32 rows: 4 prompts,
    each repeated num_generations times), weights reach TRL, and with beta > 0 a model built from its config
    (no weights on disk) still gets a reference model, an exact copy of the start model."""
    import torch

    _module(tmp_path, "grpo_build", RECORDING_REWARD)
    recipe = tiny_grpo(tmp_path / "out", [{"fn": "grpo_build:record"}, {"name": "numeric_match", "weight": 2.0}],
                       grpo={"steps_per_generation": 8, "beta": 0.1}, per_device_train_batch_size=4)
    trainer, _ = built_trainer(write_recipe(recipe))
    model = trainer.model

    batch = next(iter(trainer.get_train_dataloader()))
    assert isinstance(batch, list) and len(batch) == 32 and {"prompt", "answer"} <= set(batch[0])
    prompts = [json.dumps(row["prompt"]) for row in batch]
    assert len(set(prompts)) == 4 and all(prompts.count(p) == 8 for p in set(prompts))
    assert trainer.args.generation_batch_size == 32

    assert trainer.reward_func_names == ["record", "numeric_match"]
    assert trainer.reward_weights.tolist() == [1.0, 2.0]
    assert trainer.ref_model is not None
    reference = trainer.accelerator.unwrap_model(trainer.ref_model).state_dict()
    assert all(torch.equal(reference[k], v) for k, v in model.state_dict().items())
    assert model.config._name_or_path == str(ASSETS)  # the temporary snapshot's name did not stay behind


# --- learning -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_grpo_raises_the_reward_of_the_sft_model(write_recipe, tmp_path, sft_model):
    """The SFT model's sampled answers are even numbers about half the time (as the sums are: the reward's rate
    does not hang on how well the model adds); rewarded for even answers alone, a short run earns the reward almost
    always: GRPO moves the policy towards a user's reward, against what SFT taught it. Measured on 2 cores (seeds
    0, 1): the first five steps 0.51 and 0.57, the last ten 0.94 and 0.95."""
    recipe = tiny_grpo(tmp_path / "out", [{"name": "format", "args": {"pattern": r"\d*[02468]"}}], model=sft_model,
                       init="pretrained", grpo={"steps_per_generation": 1, "temperature": 1.0}, max_steps=30,
                       per_device_train_batch_size=32, save_strategy="steps", save_steps=30)
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    rewards = logged_rewards(tmp_path / "out" / "checkpoint-30")
    assert len(rewards) == 30
    assert sum(rewards[:5]) / 5 < 0.7 and sum(rewards[-10:]) / 10 > 0.85, rewards
    state = json.loads((tmp_path / "out" / "checkpoint-30" / "trainer_state.json").read_text())
    assert "rewards/format/mean" in state["log_history"][0]  # TRL logs each reward under its name
