"""`ft train RECIPE --smoke`: every shipped recipe runs end to end on a tiny random model of its family, offline, on
the CPU, in its own directory, and says what it substituted; the real output directory is never touched. Recipe,
data and template errors a smoke run finds are one paragraph naming the key or the original file and line."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from conftest import DATA, ROOT, run_ft, tiny_sft

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model

RECIPES = sorted(path.name for path in (ROOT / "recipes").glob("*.yaml"))
FAMILY = {"qwen2-qlora.yaml": "qwen2", "mistral-dpo.yaml": "mistral", "gemma-sft.yaml": "gemma",
          "smolvlm-lora.yaml": "idefics3", "vlm-colours.yaml": "llava"}  # else llama
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _smoke(recipe: Path | str, output_dir: Path, *extra: str):
    return run_ft("train", str(recipe), "--smoke", "--set", f"train.output_dir={output_dir}", *extra, env=OFFLINE)


def test_the_shipped_recipes_include_every_family():
    assert set(FAMILY.values()) | {"llama"} == {"llama", "qwen2", "mistral", "gemma", "idefics3", "llava"}
    assert set(FAMILY) <= set(RECIPES)


@pytest.fixture(scope="module")
def smoked(tmp_path_factory):
    """smoked(name) -> (the smoke run of recipes/<name>, its smoke directory); each recipe is run once per module."""
    runs = {}

    def smoke(name: str):
        if name not in runs:
            folder = tmp_path_factory.mktemp(name.removesuffix(".yaml"))
            runs[name] = (_smoke(ROOT / "recipes" / name, folder / "run"), folder)
        return runs[name]

    return smoke


@pytest.mark.parametrize("name", RECIPES)
def test_every_shipped_recipe_passes_its_smoke_test_offline(name, smoked, request):
    if "gguf_file:" in (text := (ROOT / "recipes" / name).read_text()) or "smollm2" in text:
        request.getfixturevalue("smollm2")  # the real model's file, where the recipe (or its reward model) reads from
    result, folder = smoked(name)
    assert result.returncode == 0, result.stderr[-4000:]
    assert not (folder / "run").exists(), "a smoke run must not write into the recipe's real output directory"
    smoke_dir = folder / "run-smoke"
    summary = json.loads((smoke_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3
    history = json.loads((smoke_dir / "log_history.json").read_text())
    losses = [row[key] for row in history for key in ("loss", "eval_loss") if key in row]
    assert losses and all(math.isfinite(loss) for loss in losses), losses  # a NaN run is no rehearsal
    described = summary["smoke"]
    assert described["model"]["family"] == FAMILY.get(name, "llama")
    # tiny: 2 layers of hidden 64; a recipe that keeps its real tokenizer (SmolLM2's 49,152 ids, read from its GGUF
    # file) keeps its embedding rows too (3.1M of the 3.2M)
    assert described["model"]["parameters"] < (4_000_000 if name.startswith("smollm2") else 1_000_000)
    substituted = {entry["key"] for entry in described["substitutions"]}
    assert {"model.name", "train.max_steps", "train.output_dir"} <= substituted
    assert (smoke_dir / "final").is_dir()
    for key in substituted:
        assert key in result.stderr, f"the log must say what was substituted: {key}"
    if name.startswith("smollm2"):  # the config read from the GGUF file's metadata (smollm2-reward: through the SFT
        # run it starts from), shrunk; no file for the tiny one
        assert described["model"]["config"].startswith("the real one (") and "shrunk" in described["model"]["config"]
        assert ("model.gguf_file" in substituted) == ("gguf_file:" in text)


def test_a_gpu_recipe_gets_its_cpu_equivalents_and_keeps_its_quantization(smoked):
    result, folder = smoked("qwen2-qlora.yaml")
    assert result.returncode == 0, result.stderr[-4000:]
    smoke_dir = folder / "run-smoke"
    summary = json.loads((smoke_dir / "summary.json").read_text())
    changes = {entry["key"]: entry for entry in summary["smoke"]["substitutions"]}
    assert changes["train.bf16"]["now"] is False and changes["model.dtype"]["now"] == "float32"
    assert "model.quantization" not in changes  # bitsandbytes runs 4-bit on this CPU: QLoRA stays QLoRA
    assert "generated" in changes["data.train.0.path"]["now"]  # a hub dataset, unreachable offline
    saved = yaml.safe_load((smoke_dir / "recipe.yaml").read_text())
    assert saved["model"]["quantization"]["bits"] == 4
    adapter = json.loads((smoke_dir / "final" / "adapter_config.json").read_text())
    assert adapter["r"] == 16


def test_a_reward_model_another_recipe_writes_stands_in_with_its_real_tokenizer(smoked, smollm2):
    """quickstart-grpo-rm.yaml scores with the run smollm2-reward.yaml writes (not there yet): a tiny classifier stands
    in, followed through that recipe to SmolLM2's GGUF file for the tokenizer and chat template it will render with."""
    result, folder = smoked("quickstart-grpo-rm.yaml")
    assert result.returncode == 0, result.stderr[-4000:]
    smoke_dir = folder / "run-smoke"
    changes = {entry["key"]: entry for entry in json.loads((smoke_dir / "summary.json").read_text())["smoke"]
               ["substitutions"]}
    reward = changes["grpo.rewards.0.model"]
    # the recipe that writes the run, or (on a machine that trained it: runs/ is the repository's) the run's own record
    assert re.search(r"smollm2-reward(\.yaml writes|/recipe\.yaml records)", reward["why"]), reward["why"]
    assert "tokenizer: the real one" in reward["why"]
    from transformers import AutoTokenizer

    assert "SmolLM" in AutoTokenizer.from_pretrained(reward["now"]).chat_template
    logged = json.loads((smoke_dir / "log_history.json").read_text())
    assert any("rewards/smollm2-reward/mean" in entry for entry in logged)


def test_a_cuda_only_optimizer_is_replaced_by_its_cpu_form(tmp_path):
    result = _smoke(ROOT / "recipes" / "quickstart.yaml", tmp_path / "run", "--set", "optimizer.name=adalomo")
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((tmp_path / "run-smoke" / "summary.json").read_text())
    changes = {entry["key"]: entry for entry in summary["smoke"]["substitutions"]}
    assert changes["optimizer.name"]["was"] == "adalomo" and "CUDA" in changes["optimizer.name"]["why"]


def test_adapter_modules_the_family_lacks_are_an_error_naming_the_key(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "run")
    recipe["adapter"] = {"kind": "lora", "target_modules": ["q_proj", "c_attn"]}
    result = _smoke(write_recipe(recipe), tmp_path / "run")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "adapter.target_modules" in result.stderr and "c_attn" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_stand_in_chosen_by_name_says_the_real_architecture_may_differ(write_recipe, tmp_path):
    """A Llama 4 (mixture of experts) config cannot be read offline, so the Llama 3 asset stands in by the name: its
    shared_expert modules are missing from the stand-in, not necessarily from the model, and the message says so."""
    recipe = tiny_sft(tmp_path / "run")
    recipe["model"] = {"name": "meta-llama/Llama-4-Scout-17B-16E"}
    recipe["adapter"] = {"kind": "lora", "target_modules": ["q_proj", "shared_expert.gate_proj"]}
    result = _smoke(write_recipe(recipe), tmp_path / "run")
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if "adapter.target_modules" in line]
    assert "shared_expert.gate_proj: no such module" in line and "shipped tiny llama model" in line
    assert "the real model may be another architecture" in line
    assert "hf download meta-llama/Llama-4-Scout-17B-16E config.json" in line


def test_a_pad_token_the_shipped_tokenizer_lacks_is_given_to_it_and_a_real_run_checks_it(write_recipe, tmp_path):
    """Llama 3.1's reserved `<|finetune_right_pad_id|>` (an Axolotl config's special_tokens.pad_token) is in the real
    tokenizer, not in ft's tiny one: the smoke run adds it to the stand-in and says so (TRL refused it before); a real
    run whose tokenizer lacks the token it names stops before the data, naming the key and its line."""
    recipe = tiny_sft(tmp_path / "run", pad_token="<|finetune_right_pad_id|>")
    recipe["model"] = {"name": "meta-llama/Llama-3.1-8B"}
    result = _smoke(write_recipe(recipe), tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run-smoke" / "summary.json").read_text())
    assert any("train.pad_token '<|finetune_right_pad_id|>'" in note for note in summary["smoke"]["model"]["notes"])
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run-smoke" / "final")
    assert "<|finetune_right_pad_id|>" in tokenizer.get_vocab()

    real = write_recipe(tiny_sft(tmp_path / "real", pad_token="<|finetune_right_pad_id|>"), name="real.yaml")
    refused = run_ft("train", str(real))
    assert refused.returncode == 2, refused.stderr[-3000:]
    [line] = [line for line in refused.stderr.splitlines() if "train.pad_token" in line]
    assert f"{real}:" in line and "is not a token of the tokenizer of model.name" in line
    assert not (tmp_path / "real").exists()


def test_a_bad_row_is_reported_at_its_line_in_the_original_file(write_recipe, tmp_path):
    lines = (DATA / "train.jsonl").read_text().splitlines()[:100]
    lines[4] = '{"messages": [{"role": "user", "content": "hi"}'  # line 5: not JSON
    data = tmp_path / "mine.jsonl"
    data.write_text("\n".join(lines) + "\n")
    recipe = tiny_sft(tmp_path / "run")
    recipe["data"]["train"][0]["path"] = str(data)
    result = _smoke(write_recipe(recipe), tmp_path / "run")
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"{data}:5" in result.stderr, result.stderr[-2000:]
    error = next(line for line in result.stderr.splitlines() if f"{data}:5" in line)
    assert "inputs/data" not in error  # the smoke copy's path never leaks into the message


def test_the_smoke_directory_is_its_own_and_never_clobbers_another(write_recipe, tmp_path):
    other = tmp_path / "run-smoke"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    path = write_recipe(tiny_sft(tmp_path / "run"))
    refused = _smoke(path, tmp_path / "run")
    assert refused.returncode == 2 and "train.output_dir" in refused.stderr
    assert (other / "notes.txt").read_text() == "mine"
    (other / "notes.txt").unlink()
    assert _smoke(path, tmp_path / "run").returncode == 0
    again = _smoke(path, tmp_path / "run")  # a previous smoke run's directory is cleared and reused
    assert again.returncode == 0, again.stderr[-3000:]
    assert _smoke(path, tmp_path / "run", "--resume", "never").returncode == 2  # smoke runs always start afresh
