"""`ft import axolotl` of Axolotl's vision-language configs: every example config with a `processor_type` (Axolotl
0.18.0's examples, in ../shared/axolotl-examples) imports to a recipe ft accepts, or, where its rows hold audio, is
refused naming the key and why; and each multimodal key's mapping, on configs written for these tests.

As in tests/test_import_axolotl.py, each recipe is written to a file and loaded with ``ft.recipe.load_recipe`` (what
``ft validate`` runs, offline: hub models and datasets are never looked up), and every key of a config is checked to
be in the ledger. A representative few of the imported recipes also pass ``ft train --smoke`` offline (marked slow;
benchmarks/import_coverage.py --smoke runs all of them).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_ft
from test_import_axolotl import BASE, imported, keys_of, status, why

from ft.importers.axolotl import import_axolotl
from ft.importers.ledger import CARRIED, IGNORED, NOT_CARRIED
from ft.recipe import load_recipe

CORPUS = ROOT.parent / "shared" / "axolotl-examples"
# the example configs that name a processor, and those whose rows hold audio (their datasets and processors say so)
MULTIMODAL = sorted(str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.y*ml") if "processor_type" in p.read_text()) \
    if CORPUS.is_dir() else []
AUDIO = {"voxtral/voxtral-mini-audio-qlora.yml", "gemma3n/gemma-3n-e2b-vision-audio-qlora.yml"}
VISION = [name for name in MULTIMODAL if name not in AUDIO]
needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"Axolotl's example configs are not at {CORPUS}")

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
LANGUAGE_ONLY = r"model.language_model.layers.[\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj"
VLM = {**BASE, "base_model": "Qwen/Qwen2-VL-7B-Instruct", "processor_type": "AutoProcessor",
       "datasets": [{"path": "org/vision-chats", "type": "chat_template"}]}
LORA = {"adapter": "lora", "lora_r": 16, "lora_alpha": 32, "lora_target_modules": LANGUAGE_ONLY}


def example(tmp_path: Path, name: str):
    """Import the example config ``name`` into tmp_path/recipe.yaml, as `ft import axolotl CONFIG --out` does."""
    source, out = CORPUS / name, tmp_path / "recipe.yaml"
    result = import_axolotl(source, out)
    out.write_text(result.text)
    for path in keys_of(yaml.safe_load(source.read_text())):  # nothing dropped silently
        assert any(path == e or path.startswith(e + ".") or e.startswith(path + ".") for e in result.ledger.entries)
    return out, result


# --- the example configs ----------------------------------------------------------------------------------------


@needs_corpus
def test_the_corpus_holds_the_multimodal_examples():
    """23 example configs name a processor: 21 train on images, 2 on audio."""
    assert (len(MULTIMODAL), len(VISION)) == (23, 21)
    assert AUDIO <= set(MULTIMODAL)


@needs_corpus
@pytest.mark.parametrize("name", VISION)
def test_each_vision_example_imports_to_a_recipe_ft_accepts(tmp_path, name):
    out, result = example(tmp_path, name)
    assert result.valid, result.verdict.message
    assert result.modality == "vision" and not result.out_of_scope
    recipe = load_recipe(out).recipe
    assert recipe.method == "sft" and recipe.model.modality == "vision"
    assert recipe.data.packing is False
    config = yaml.safe_load((CORPUS / name).read_text())
    targets = config.get("lora_target_modules")
    if isinstance(targets, str):  # one regular expression: carried as written
        assert recipe.adapter.target_modules == targets
    assert status(result, "skip_prepare_dataset") == CARRIED and status(result, "remove_unused_columns") == CARRIED


@needs_corpus
@pytest.mark.parametrize("name", sorted(AUDIO))
def test_each_audio_example_is_refused_naming_the_key(tmp_path, name):
    _, result = example(tmp_path, name)
    assert not result.valid and result.out_of_scope and result.modality == "audio"
    [problem] = result.verdict.errors
    assert "`processor_type: " in problem.message and "not audio" in problem.message
    assert "\n" not in problem.message  # one paragraph
    assert status(result, "processor_type") == NOT_CARRIED
    assert "modality" not in yaml.safe_load(result.verdict.text)["model"]  # not trained as a vision model


@needs_corpus
def test_ft_import_then_ft_validate_on_an_example(tmp_path):
    """The commands as a user runs them: exit 0 for a vision config, 1 with the reason for an audio one."""
    out = tmp_path / "qwen2-vl.yaml"
    done = run_ft("import", "axolotl", str(CORPUS / "qwen2-vl/lora-7b.yaml"), "--out", str(out), timeout=120)
    assert done.returncode == 0, done.stderr
    validated = run_ft("validate", str(out), timeout=120)
    assert validated.returncode == 0, validated.stderr
    assert "modality: vision" in validated.stdout
    refused = run_ft("import", "axolotl", str(CORPUS / "voxtral/voxtral-mini-audio-qlora.yml"), "--out",
                     str(tmp_path / "voxtral.yaml"), timeout=120)
    assert refused.returncode == 1
    assert "`processor_type: VoxtralProcessor`" in refused.stderr and "not audio" in refused.stderr


# --- smoke runs of the imported recipes ---------------------------------------------------------------------------


def smoke_offline(recipe: Path, output_dir: Path) -> dict:
    """summary.json of ``ft train RECIPE --smoke --set train.output_dir=OUTPUT_DIR`` run offline, which must have
    passed. In this process (``load_recipe`` and ``ft.smoke.rehearse.train``, as the command runs them, without
    importing torch again) where huggingface_hub and datasets were imported offline, as CI sets them
    (HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1; each library reads its variable once, when imported); else through the
    ``ft`` command with them set, so that no hub model or data set is ever looked up."""
    import datasets
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE and datasets.config.HF_DATASETS_OFFLINE:
        from ft.recipe import load_recipe
        from ft.smoke import rehearse

        said: list[str] = []
        result = rehearse.train(load_recipe(recipe, [f"train.output_dir={output_dir}"]), say=said.append)
        assert result.status == "completed", "\n".join(said)[-4000:]
    else:
        done = run_ft("train", str(recipe), "--smoke", "--set", f"train.output_dir={output_dir}", env=OFFLINE)
        assert done.returncode == 0, done.stderr[-4000:]
    smoke_dir = Path(f"{output_dir}-smoke")
    summary = json.loads((smoke_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert (smoke_dir / "final" / "adapter_config.json").is_file() and not output_dir.exists()
    return summary


def substituted(summary: dict) -> dict:
    """The smoke run's substitutions, by key."""
    return {entry["key"]: entry for entry in summary["smoke"]["substitutions"]}


@pytest.mark.slow
@needs_corpus
@pytest.mark.parametrize(("name", "family", "fallback"), [
    ("qwen2-vl/lora-7b.yaml", "llava", True),  # ft ships no tiny Qwen2-VL: the generic LLaVA stands in
    ("smolvlm2/smolvlm2-2B-lora.yaml", "idefics3", False),  # the shipped tiny SmolVLM (Idefics3)
    ("gemma3/gemma-3-4b-vision-qlora.yml", "gemma3", False),  # the shipped tiny Gemma 3, its QLoRA 4-bit on the CPU
])
def test_an_imported_vision_example_passes_its_smoke_test_offline(tmp_path, name, family, fallback):
    """The recipe as imported trains 3 steps on its family's tiny stand-in, on generated pictures (its hub data set
    cannot be read offline); its LoRA regular expression matches the stand-in's module names as it would the real
    model's (the language model's layers), and a QLoRA recipe keeps its 4-bit loading: bitsandbytes quantizes the
    tiny model on the CPU."""
    recipe, result = example(tmp_path, name)
    assert result.valid, result.verdict.message
    summary = smoke_offline(recipe, tmp_path / "run")
    model = summary["smoke"]["model"]
    assert (model["family"], model["modality"], model["fallback"]) == (family, "vision", fallback)
    changes = substituted(summary)
    assert "adapter.target_modules" not in changes and "model.quantization" not in changes
    smoke_dir = tmp_path / "run-smoke"
    targets = load_recipe(recipe).recipe.adapter.target_modules
    assert json.loads((smoke_dir / "final" / "adapter_config.json").read_text())["target_modules"] == targets
    bits = [(yaml.safe_load(path.read_text())["model"].get("quantization") or {}).get("bits")
            for path in (recipe, smoke_dir / "recipe.yaml")]
    assert bits == ([4, 4] if "qlora" in name else [None, None])


@pytest.mark.slow
@needs_corpus
def test_llama_4_scout_qlora_passes_its_smoke_test_with_its_targets_fitted_and_its_optimizer_replaced(tmp_path):
    """Llama 4 Scout (QLoRA, FSDP, flex attention, torchao's 4-bit AdamW) offline: the generic tiny LLaVA stands in,
    which has Llama 4's attention projections but not its shared experts' or vision adapter's, so those names leave
    the smoke recipe (the real run's PEFT checks them against Llama 4); torchao is not installed here, so the
    optimizer is AdamW, said with what the real run needs. The rest runs as written, 4-bit loading included."""
    recipe, result = example(tmp_path, "llama-4/scout-vision-qlora-fsdp2-flex.yaml")
    assert result.valid, result.verdict.message
    written = yaml.safe_load(recipe.read_text())
    targets = written["adapter"]["target_modules"]
    assert {"shared_expert.gate_proj", "vision_adapter.mlp.fc1"} <= set(targets)
    summary = smoke_offline(recipe, tmp_path / "run")
    assert summary["smoke"]["model"]["fallback"] is True
    changes = substituted(summary)
    fitted = changes["adapter.target_modules"]
    assert fitted["was"] == targets
    assert fitted["now"] == ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    assert "generic tiny llava stand-in lacks some of these names" in fitted["why"]
    assert written["model"]["name"] in fitted["why"]  # the real run checks them against the real model
    assert "adapter.modules_to_save" not in changes  # lm_head and embed_tokens: the stand-in has both
    optimizer = changes.get("optimizer.name")
    if importlib.util.find_spec("torchao") is None:
        assert (optimizer["was"], optimizer["now"]) == ("adamw_torch_4bit", "adamw_torch")
        assert "not installed here" in optimizer["why"] and "pip install torchao" in optimizer["why"]
    else:  # torchao installed by hand: its optimizer runs as written
        assert optimizer is None
    assert "model.quantization" not in changes and "distributed" in changes
    smoke_dir = tmp_path / "run-smoke"
    adapter = json.loads((smoke_dir / "final" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == sorted(fitted["now"])


# --- the keys, one by one ---------------------------------------------------------------------------------------


def test_a_processor_makes_a_vision_recipe(tmp_path):
    """`model.modality: vision`: ft loads the model as an image-text-to-text one even where the hub cannot be read,
    and where transformers would also load it as a text model (Llama 4); the processor class stays in the ledger."""
    recipe, result = imported(tmp_path, {**VLM, "base_model": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
                                         "processor_type": "Llama4Processor",
                                         "model_type": "Llama4ForConditionalGeneration"})
    assert recipe.model.modality == "vision"
    assert status(result, "processor_type") == CARRIED and "`Llama4Processor`" in why(result, "processor_type")
    assert status(result, "model_type") == CARRIED and "AutoModelForImageTextToText" in why(result, "model_type")
    assert result.text.index("name: meta-llama") < result.text.index("modality: vision")  # the model's name first


def test_a_square_image_size_bounds_the_pixels_and_a_pair_is_the_size(tmp_path):
    """`image_size: N` (Axolotl: fit into an N x N square, padded) -> at most N*N pixels, aspect ratio kept;
    `image_size: [W, H]` -> every image resized to exactly that, as Axolotl does."""
    recipe, result = imported(tmp_path, {**VLM, "image_size": 512, "image_resize_algorithm": "bicubic"})
    assert recipe.data.image.max_pixels == 512 * 512 and recipe.data.image.size is None
    assert "pads it black" in why(result, "image_size")
    assert status(result, "image_resize_algorithm") == CARRIED and result.ledger.entries["image_resize_algorithm"].same
    (tmp_path / "pair").mkdir()
    recipe, result = imported(tmp_path / "pair", {**VLM, "image_size": [448, 336], "image_resize_algorithm": "lanczos"})
    assert recipe.data.image.size == [448, 336] and recipe.data.image.max_pixels is None
    assert status(result, "image_resize_algorithm") == NOT_CARRIED
    assert "bicubic" in why(result, "image_resize_algorithm")


def test_image_settings_without_an_image_model_or_a_size_have_no_effect(tmp_path):
    recipe, result = imported(tmp_path, {**VLM, "image_resize_algorithm": "bilinear"})
    assert recipe.data.image is None and status(result, "image_resize_algorithm") == IGNORED
    (tmp_path / "text").mkdir()
    recipe, result = imported(tmp_path / "text", {**BASE, "image_size": 512})
    assert recipe.data.image is None and status(result, "image_size") == IGNORED


def test_an_image_size_ft_refuses_is_not_carried_with_its_message(tmp_path):
    recipe, result = imported(tmp_path, {**VLM, "image_size": [0, 336]})
    assert recipe.data.image is None
    assert status(result, "image_size") == NOT_CARRIED and "data.image.size" in why(result, "image_size")


def test_freezing_the_multimodal_modules_in_a_full_fine_tune(tmp_path):
    recipe, result = imported(tmp_path, {**VLM, "freeze_mm_modules": True})
    assert recipe.model.freeze == ["vision", "projector"] and recipe.adapter is None
    assert status(result, "freeze_mm_modules") == CARRIED


def test_freezing_the_multimodal_modules_with_an_adapter_changes_nothing(tmp_path):
    """With LoRA the base is frozen already and the adapter goes on the language model: nothing written (ft would
    warn that model.freeze changes nothing), the ledger says why."""
    recipe, result = imported(tmp_path, {**VLM, **LORA, "freeze_mm_modules": True})
    assert recipe.model.freeze is None and not result.verdict.warnings
    entry = result.ledger.entries["freeze_mm_modules"]
    assert entry.status == CARRIED and entry.same and "whole base is frozen" in entry.why


def test_freezing_the_multimodal_modules_of_a_text_config(tmp_path):
    """Without a processor ft trains the model as text, and model.freeze names a vision model's parts."""
    recipe, result = imported(tmp_path, {**BASE, "freeze_mm_modules": True})
    assert recipe.model.freeze is None and status(result, "freeze_mm_modules") == NOT_CARRIED
    (tmp_path / "off").mkdir()
    _, result = imported(tmp_path / "off", {**VLM, "freeze_mm_modules": False})
    assert status(result, "freeze_mm_modules") == IGNORED


def test_lora_targets_a_regex_verbatim_and_names_on_the_language_model(tmp_path):
    """A regular expression is PEFT's in Axolotl and in ft: carried as written. Names (and all-linear) are matched
    against the language model only in ft, where Axolotl adapts the vision tower's modules of those names too: said."""
    recipe, result = imported(tmp_path, {**VLM, **LORA})
    assert recipe.adapter.target_modules == LANGUAGE_ONLY
    assert status(result, "lora_target_modules") == CARRIED and why(result, "lora_target_modules") == ""
    (tmp_path / "names").mkdir()
    recipe, result = imported(tmp_path / "names", {**VLM, **LORA, "lora_target_modules": ["q_proj", "v_proj"]})
    assert recipe.adapter.target_modules == ["q_proj", "v_proj"]
    assert "language model only" in why(result, "lora_target_modules")
    (tmp_path / "linear").mkdir()
    recipe, result = imported(tmp_path / "linear", {**VLM, **LORA, "lora_target_modules": None,
                                                    "lora_target_linear": True})
    assert recipe.adapter.target_modules == "all-linear" and "language model only" in why(result, "lora_target_linear")


def test_the_keys_axolotl_needs_for_image_rows_are_what_ft_does(tmp_path):
    recipe, result = imported(tmp_path, {**VLM, "skip_prepare_dataset": True, "remove_unused_columns": False,
                                         "sample_packing": False})
    for key in ("skip_prepare_dataset", "remove_unused_columns", "sample_packing"):
        assert status(result, key) == CARRIED and result.ledger.entries[key].same, key
    assert "image's tokens" in why(result, "skip_prepare_dataset")
    assert "Image values" in why(result, "datasets.0.type")  # images stored in a dataset: TRL's layout, read
    (tmp_path / "text").mkdir()
    _, text = imported(tmp_path / "text", {**BASE, "skip_prepare_dataset": True})
    assert status(text, "skip_prepare_dataset") == NOT_CARRIED  # a text config: unchanged


def test_vision_rows_are_not_packed(tmp_path):
    recipe, result = imported(tmp_path, {**VLM, "sample_packing": True, "eval_sample_packing": True})
    assert recipe.data.packing is False
    assert status(result, "sample_packing") == NOT_CARRIED and "never packed" in why(result, "sample_packing")
    assert status(result, "eval_sample_packing") == IGNORED


@pytest.mark.parametrize(("template", "said"), [("qwen2_vl", "processor's own"), ("chatml", "take text only")])
def test_a_named_chat_template_leaves_the_models_own(tmp_path, template, said):
    """Axolotl's named templates are not built into ft (the processor's own is used, as for text); ft's built-in
    chatml and llama3 write no image token, so a vision recipe does not take them."""
    recipe, result = imported(tmp_path, {**VLM, "chat_template": template})
    assert recipe.data.chat_template is None
    assert status(result, "chat_template") == NOT_CARRIED and said in why(result, "chat_template")


def test_a_method_ft_does_not_train_vision_models_with_is_refused(tmp_path):
    """The recipe declares what its model reads, so the rules ft train applies before reading rows are applied
    here too: a vision ORPO config (TRL's ORPO trainer reads no images) is written, and refused at model.name."""
    _, result = imported(tmp_path, {**VLM, "rl": "orpo",
                                    "datasets": [{"path": "org/pairs", "type": "chat_template.argilla"}]}, valid=False)
    [problem] = result.verdict.errors
    assert problem.path == "model.name" and "is a vision model" in problem.message
    assert problem.where.endswith(":5")  # the line of model.name in the written file


def test_a_config_with_audio_rows_is_refused_naming_the_key(tmp_path):
    _, result = imported(tmp_path, {**VLM, "base_model": "google/gemma-3n-E2B-it",
                                    "datasets": [{"path": "org/text-audio-chats", "type": "chat_template"}]},
                         valid=False)
    [problem] = result.verdict.errors
    assert problem.path == "model.name"
    assert problem.message.startswith("the Axolotl config's `processor_type: AutoProcessor`: "
                                      "`datasets.0.path: org/text-audio-chats` holds audio")
    assert "ft trains language models on text and images, not audio" in problem.message
    assert result.out_of_scope and status(result, "processor_type") == NOT_CARRIED


def test_reasoning_and_tools_keys_are_not_carried_for_a_vision_language_model(tmp_path):
    """ft reads reasoning and tool definitions in text models' chats only (a vision model's chat holding them is a
    bad row), so the keys naming them are not carried, and no `fields:` entry is written for them."""
    entry = {**VLM["datasets"][0], "field_thinking": "thinking", "field_tools": "functions"}
    recipe, result = imported(tmp_path, {**VLM, **LORA, "datasets": [entry]})
    assert recipe.data.train[0].fields == {}
    for key in ("field_thinking", "field_tools"):
        assert status(result, f"datasets.0.{key}") == NOT_CARRIED, key
        assert "text models' chat rows only" in why(result, f"datasets.0.{key}")
