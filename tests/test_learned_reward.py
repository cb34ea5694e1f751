"""A learned reward model as a GRPO or RLOO reward (``rewards: [{model: DIR}]``): TRL scores every completion with the
reward model's own tokenizer and chat template, batched, in eval mode, and the figure logged for it is the mean of
those scores; a directory that is not a reward model, or a tokenizer that cannot render the prompts, is refused
before training with exit 2 and the recipe key.

The reward model here is a random-init sequence classifier with attention dropout and a chat template of its own, so
that scoring in train mode, or with the policy's template, or with the padding read wrong, gives other numbers than
scoring each completion alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import ASSETS, DATA, MEASURED_THREADS, run_ft

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model

OWN_TEMPLATE = ("{% for message in messages %}{{ message['role'][0] | upper }}: {{ message['content'] }}\n"
                "{% endfor %}")

RECORDER = '''import json


def record(prompts, completions, path, **kwargs):
    """Writes each round's prompts and completions (as the reward model receives them); rewards nothing."""
    with open(path, "a") as out:
        out.write(json.dumps({"prompts": prompts, "completions": completions}) + "\\n")
    return [0.0] * len(completions)
'''


def _save_classifier(folder: Path, num_labels: int = 1, template: str | None = OWN_TEMPLATE) -> Path:
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(ASSETS, num_labels=num_labels, attention_dropout=0.3)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    with torch.no_grad():
        model.score.weight.mul_(100)  # scores of a few units, so that a wrong score is not lost in rounding
    model.save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(ASSETS)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    if template is None:
        (folder / "chat_template.jinja").unlink(missing_ok=True)
    return folder


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory) -> Path:
    return _save_classifier(tmp_path_factory.mktemp("rm", numbered=False) / "final")


def _recipe(method: str, output_dir: Path, rewards: list[dict], **train) -> dict:
    return {
        "method": method,
        "model": {"name": str(ASSETS), "init": "random"},
        "data": {"train": [{"path": str(DATA / "prompts.jsonl"), "format": "prompt"}]},
        "optimizer": {"lr": 1.0e-3},
        method: {"num_generations": 4, "max_completion_length": 6, "steps_per_generation": 1, "beta": 0.0,
                 "rewards": rewards},
        "train": {"output_dir": str(output_dir), "max_steps": 2, "per_device_train_batch_size": 16,
                  "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0, **train},
    }


def _scores_alone(model_dir: Path, prompts: list, completions: list) -> list[float]:
    """Each prompt + completion scored on its own (no padding), in eval mode, with the reward model's template."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        text = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            scores.append(float(model(**ids).logits[0, 0]))
    return scores


@pytest.mark.parametrize("method", ["grpo", "rloo"])
def test_a_reward_model_scores_each_completion_with_its_own_template_in_eval_mode(write_recipe, tmp_path, method,
                                                                                 reward_model):
    (tmp_path / "recorder.py").write_text(RECORDER)
    rounds = tmp_path / "rounds.jsonl"
    rewards = [{"model": str(reward_model), "weight": 1.0},
               {"fn": "recorder:record", "weight": 0.0, "args": {"path": str(rounds)}}]
    result = run_ft("train", str(write_recipe(_recipe(method, tmp_path / "out", rewards))))
    assert result.returncode == 0, result.stderr[-3000:]
    logged = [entry for entry in json.loads((tmp_path / "out" / "log_history.json").read_text())
              if "rewards/rm/mean" in entry]  # named after the run the reward model's final/ belongs to
    seen = [json.loads(line) for line in rounds.read_text().splitlines()]
    assert len(logged) == len(seen) == 2
    for entry, batch in zip(logged, seen, strict=True):
        assert all(isinstance(prompt, list) for prompt in batch["prompts"])  # chats: the template is used
        alone = _scores_alone(reward_model, batch["prompts"], batch["completions"])
        assert max(alone) - min(alone) > 0.1  # the completions score differently: the mean is a real check
        assert entry["rewards/rm/mean"] == pytest.approx(sum(alone) / len(alone), abs=1e-4)
        assert entry["reward"] == pytest.approx(sum(alone) / len(alone), abs=1e-4)  # the recorder's weight is 0


def test_a_lora_reward_run_scores_as_its_merged_model(write_recipe, tmp_path):
    """A LoRA reward run named as it is (no ``ft merge`` first): its adapter and score head are folded into the base
    rebuilt from the run's recipe, and each logged score equals the merged model's (``ft merge``) on that completion."""
    rm = {"method": "reward", "model": {"name": str(ASSETS), "init": "random"},
          "adapter": {"kind": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
          "data": {"train": [{"path": str(DATA / "preference.jsonl"), "format": "preference"}], "max_length": 64},
          "optimizer": {"lr": 1.0e-2},
          "train": {"output_dir": str(tmp_path / "lora-rm"), "max_steps": 5, "per_device_train_batch_size": 8,
                    "save_strategy": "no", "report_to": "none", "seed": 0}}
    assert run_ft("train", str(write_recipe(rm, name="rm.yaml"))).returncode == 0
    merged = run_ft("merge", str(tmp_path / "lora-rm"), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr[-2000:]
    (tmp_path / "recorder.py").write_text(RECORDER)
    rounds = tmp_path / "rounds.jsonl"
    rewards = [{"model": str(tmp_path / "lora-rm"), "weight": 1.0},
               {"fn": "recorder:record", "weight": 0.0, "args": {"path": str(rounds)}}]
    result = run_ft("train", str(write_recipe(_recipe("grpo", tmp_path / "out", rewards))))
    assert result.returncode == 0, result.stderr[-3000:]
    logged = [entry["rewards/lora-rm/mean"] for entry in json.loads((tmp_path / "out" / "log_history.json").read_text())
              if "rewards/lora-rm/mean" in entry]
    seen = [json.loads(line) for line in rounds.read_text().splitlines()]
    assert len(logged) == len(seen) == 2
    for mean, batch in zip(logged, seen, strict=True):
        alone = _scores_alone(tmp_path / "merged", batch["prompts"], batch["completions"])
        assert max(alone) - min(alone) > 1e-3 and mean == pytest.approx(sum(alone) / len(alone), abs=1e-4)


def _round_scores(model, tokenizer, prompts: list, completions: list) -> torch.Tensor:
    """The scores of one round's prompt + completion pairs computed as TRL's GRPOTrainer computes them: rendered with
    the reward model's chat template, tokenized together, padded on the right, one forward in inference mode."""
    texts = [tokenizer.apply_chat_template(prompt + completion, tokenize=False)
             for prompt, completion in zip(prompts, completions, strict=True)]
    inputs = tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.inference_mode():
        return model(**inputs).logits[:, 0].float()


def test_a_reward_model_scores_in_the_dtype_its_entry_names(write_recipe, tmp_path, reward_model):
    """``dtype: bfloat16`` casts the saved float32 reward model before it scores: every score TRL records for a
    completion is the score of the model cast to bfloat16 (``model.to(torch.bfloat16)``, computed in bfloat16 all
    through), not the float32 model's score rounded to bfloat16 at the end."""
    import pandas as pd
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    recipe = _recipe("grpo", tmp_path / "out", [{"model": str(reward_model), "dtype": "bfloat16"}],
                     log_completions=True)
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    rounds = [pd.read_parquet(path) for path in sorted((tmp_path / "out" / "completions").glob("*.parquet"))]
    assert [len(table) for table in rounds] == [16, 16]
    tokenizer = AutoTokenizer.from_pretrained(reward_model)
    full = AutoModelForSequenceClassification.from_pretrained(reward_model).eval()
    half = AutoModelForSequenceClassification.from_pretrained(reward_model).eval().to(torch.bfloat16)
    rounded_at_end = 0
    for table in rounds:
        prompts = [[dict(turn) for turn in prompt] for prompt in table["prompt"]]
        completions = [[dict(turn) for turn in completion] for completion in table["completion"]]
        logged = torch.tensor(table["rm"].tolist(), dtype=torch.float32)
        assert torch.equal(logged, _round_scores(half, tokenizer, prompts, completions))
        rounded_at_end += int((logged == _round_scores(full, tokenizer, prompts, completions).bfloat16().float()).sum())
    # measured: 11 of the 32 scores (the rest differ in their last bits); a float32 model whose scores were rounded
    # to bfloat16 would give all 32
    assert rounded_at_end < 24, rounded_at_end


def _refused(write_recipe, tmp_path, reward_dir: str, *, method: str = "grpo") -> str:
    result = run_ft("train", str(write_recipe(_recipe(method, tmp_path / "out", [{"model": reward_dir}]))))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "final").exists() and not list(tmp_path.glob("out/checkpoint-*"))
    return result.stderr


def test_a_causal_lm_is_refused_as_a_reward_model_before_the_policy_loads(write_recipe, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path / "lm"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ASSETS)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(ASSETS).save_pretrained(folder)
    message = _refused(write_recipe, tmp_path, str(folder))
    assert "grpo.rewards.0.model" in message and "LlamaForCausalLM" in message and "method: reward" in message
    assert not (tmp_path / "out").exists()  # refused before the run's folder is made


def test_a_classifier_with_two_scores_is_refused(write_recipe, tmp_path):
    message = _refused(write_recipe, tmp_path, str(_save_classifier(tmp_path / "two", num_labels=2)), method="rloo")
    assert "rloo.rewards.0.model" in message and "2 scores" in message


def test_a_text_models_adapter_or_a_missing_folder_is_refused_with_the_way_out(write_recipe, lora_run, tmp_path):
    assert "adapter of a model that writes text" in _refused(write_recipe, tmp_path, str(lora_run))
    assert "does not exist" in _refused(write_recipe, tmp_path, str(tmp_path / "runs" / "rm" / "final"))


def test_a_tokenizer_that_cannot_render_the_chat_prompts_is_refused(write_recipe, tmp_path):
    folder = _save_classifier(tmp_path / "plain" / "final", template=None)
    message = _refused(write_recipe, tmp_path, str(folder))
    assert "grpo.rewards.0.model" in message and "no chat template" in message
    no_system = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system turns') }}" \
                "{% endif %}{{ m['content'] }}{% endfor %}"
    folder = _save_classifier(tmp_path / "picky" / "final", template=no_system)
    assert "no system turns" in _refused(write_recipe, tmp_path, str(folder))


@pytest.mark.parametrize(("reward", "says"), [
    ({"model": "runs/rm/final", "args": {"field": "answer"}}, "takes none"),
    ({"model": "runs/rm/final", "name": "exact_match"}, "exactly one of"),
    ({"name": "exact_match", "dtype": "bfloat16"}, "a reward function has none"),
])
def test_a_reward_model_entry_is_checked_with_the_recipe(write_recipe, tmp_path, reward, says):
    result = run_ft("validate", str(write_recipe(_recipe("grpo", tmp_path / "out", [reward]))))
    assert result.returncode == 2 and says in result.stderr and "grpo.rewards.0" in result.stderr, result.stderr


def _parity_pairs(folder: Path) -> Path:
    """Arithmetic prompts answered with an even number (chosen) or the odd one next to it (rejected): a preference a
    2-layer model learns in a few dozen steps, and one the half-trained SFT model's samples follow half the time."""
    rows = [json.loads(line) for line in (DATA / "prompts.jsonl").read_text().splitlines()]
    pairs = []
    for row in rows:
        answer = int(row["answer"])
        even, odd = (answer, answer + 1) if answer % 2 == 0 else (answer + 1, answer)
        pairs.append({"prompt": row["prompt"], "chosen": [{"role": "assistant", "content": str(even)}],
                      "rejected": [{"role": "assistant", "content": str(odd)}]})
    path = folder / "parity.jsonl"
    path.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    return path


def test_grpo_scored_by_a_trained_reward_model_moves_the_policy_towards_what_it_prefers(write_recipe, tmp_path,
                                                                                          sft_model):
    """SFT model → reward model preferring even answers (trained here) → GRPO scored by it alone. The share of even
    answers, logged by a zero-weight format reward that the policy is not trained on, rises with the learned reward:
    the policy follows what the reward model learned. Measured on 2 cores (seed 0): see the asserts."""
    rm = {"method": "reward", "model": {"name": str(sft_model), "init": "pretrained"},
          "data": {"train": [{"path": str(_parity_pairs(tmp_path)), "format": "preference"}], "max_length": 64},
          "optimizer": {"lr": 1.0e-3},
          "train": {"output_dir": str(tmp_path / "parity"), "max_steps": 60, "per_device_train_batch_size": 32,
                    "logging_steps": 10, "save_strategy": "no", "report_to": "none", "seed": 0}}
    result = run_ft("train", str(write_recipe(rm, name="rm.yaml")), env=MEASURED_THREADS)
    assert result.returncode == 0, result.stderr[-3000:]
    rewards = [{"model": str(tmp_path / "parity" / "final"), "weight": 1.0},
               {"name": "format", "weight": 0.0, "args": {"pattern": r"\d*[02468]"}}]
    recipe = _recipe("grpo", tmp_path / "out", rewards, max_steps=40, per_device_train_batch_size=32)
    recipe.update(model={"name": str(sft_model), "init": "pretrained"}, optimizer={"lr": 5.0e-4})
    recipe["grpo"].update(num_generations=8, max_completion_length=8)
    result = run_ft("train", str(write_recipe(recipe)), env=MEASURED_THREADS)
    assert result.returncode == 0, result.stderr[-3000:]
    log = [entry for entry in json.loads((tmp_path / "out" / "log_history.json").read_text())
           if "rewards/parity/mean" in entry]
    assert len(log) == 40
    even = [entry["rewards/format/mean"] for entry in log]
    learned = [entry["rewards/parity/mean"] for entry in log]
    # measured: even 0.53 in the first 5 steps, 0.83 in the last 10; the learned reward 0.06, then 1.52
    assert sum(even[:5]) / 5 < 0.65 and sum(even[-10:]) / 10 > 0.75, even
    assert sum(learned[-10:]) / 10 > sum(learned[:5]) / 5 + 0.8, learned


def test_the_smoke_run_stands_in_a_tiny_reward_model_with_the_real_tokenizer(write_recipe, tmp_path):
    """A reward model another recipe writes (not there yet) is looked up through that recipe, and a tiny random
    classifier of its family, with its tokenizer and chat template, scores the smoke run's completions."""
    rm_out = tmp_path / "runs" / "rm"
    rm = {"method": "reward", "model": {"name": str(ASSETS), "init": "random"},
          "data": {"train": [{"path": str(DATA / "preference.jsonl"), "format": "preference"}]},
          "train": {"output_dir": str(rm_out)}}
    write_recipe(rm, name="rm.yaml")
    recipe = _recipe("rloo", tmp_path / "out", [{"model": str(rm_out / "final")}])
    result = run_ft("train", str(write_recipe(recipe)), "--smoke", env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rloo.rewards.0.model" in result.stderr and "rm.yaml" in result.stderr
    summary = json.loads((tmp_path / "out-smoke" / "summary.json").read_text())
    (sub,) = [entry for entry in summary["smoke"]["substitutions"] if entry["key"] == "rloo.rewards.0.model"]
    stand_in = Path(sub["now"])
    config = json.loads((stand_in / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and len(config["id2label"]) == 1
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(stand_in).chat_template == AutoTokenizer.from_pretrained(ASSETS).chat_template
    assert not rm_out.exists()
    assert any("rewards/rm" in key for entry in json.loads((tmp_path / "out-smoke" / "log_history.json").read_text())
               for key in entry)
