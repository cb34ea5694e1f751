"""A vision-language run after and around its training, offline, on a tiny random LLaVA (and Idefics3 for the part
names): ``model.freeze`` of the vision tower and projector, LoRA on the language model only (the vision tower opt-in
through ``adapter.target_modules``), ``ft generate --image``, ``ft merge`` keeping the processor, and ``ft export``
refusing the model. Real transformers, TRL and PEFT objects throughout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from conftest import ASSETS, built_trainer, run_ft
from test_vision import CHATML_IMAGES, _square, _squares, build_tiny_llava

from ft.model.adapters import fit_lora_targets, freeze, part_parameters, vision_parts
from ft.model.loading import ModelLoadError
from ft.recipe import RecipeError, load_recipe
from ft.recipe.rules import check_modality


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> Path:
    """A tiny random LLaVA's folder, as test_vision builds it."""
    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


def _recipe(folder: Path, model: Path, steps: int = 2, adapter: dict | None = None, **model_keys) -> Path:
    """A recipe file in ``folder``: SFT of ``model`` from random init on 8 pictures of coloured squares."""
    rows = _squares(folder / "data", 8)
    (folder / "data" / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = {"method": "sft", "model": {"name": str(model), "init": "random", **model_keys},
              "data": {"train": [{"path": str(folder / "data" / "train.jsonl"), "format": "chat"}], "max_length": 64},
              "optimizer": {"lr": 1e-2},
              "train": {"output_dir": str(folder / "out"), "max_steps": steps, "per_device_train_batch_size": 4,
                        "save_strategy": "no", "report_to": "none"}}
    if adapter is not None:
        recipe["adapter"] = adapter
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _tiny_idefics3():
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 16, "patch_size": 8}
    text = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 2, "vocab_size": 100}
    config = transformers.Idefics3Config(vision_config=vision, text_config=text, scale_factor=2)
    return transformers.AutoModelForImageTextToText.from_config(config)


# --- 1. freezing and LoRA targets ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_freeze_keeps_the_vision_tower_and_projector_while_the_language_model_trains(tmp_path, llava):
    """The trainer ft train builds: no vision or projector parameter requires grad or is in the optimizer, and after
    2 steps they are bit for bit as loaded while the language model's weights moved."""
    trainer, _ = built_trainer(_recipe(tmp_path, llava, freeze=["vision", "projector"]))
    model = trainer.model
    assert vision_parts(model) == {"vision": ["model.vision_tower"], "projector": ["model.multi_modal_projector"]}
    frozen = {**part_parameters(model, "vision"), **part_parameters(model, "projector")}
    assert frozen and not any(p.requires_grad for p in frozen.values())
    language = {n: p for n, p in model.named_parameters() if n.startswith("model.language_model.")}
    assert language and all(p.requires_grad for p in language.values())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    after = dict(model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in frozen)
    assert any(not torch.equal(before[n], after[n]) for n in language)


def test_freeze_finds_idefics3s_parts_and_names_what_a_model_lacks():
    """Idefics3 names its parts vision_model and connector; a model without one (a text model) is refused naming
    model.freeze and the modules it has."""
    model = _tiny_idefics3()
    assert vision_parts(model) == {"vision": ["model.vision_model"], "projector": ["model.connector"]}
    said = []
    freeze(model, ["projector"], said.append)
    assert not any(p.requires_grad for p in part_parameters(model, "projector").values())
    assert all(p.requires_grad for p in part_parameters(model, "vision").values())
    assert said and said[0].startswith("model: froze the projector (model.connector: ")
    text = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(ASSETS))
    with pytest.raises(ModelLoadError) as caught:
        freeze(text, ["vision"], said.append)
    message = str(caught.value)
    assert message.startswith("model.freeze: `vision` matches no module of this LlamaForCausalLM")
    assert "its top modules are model, model.embed_tokens, model.layers, model.norm, model.rotary_emb, lm_head." \
        in message


def test_model_freeze_is_validated_and_refused_for_a_text_model(tmp_path, llava):
    path = _recipe(tmp_path, llava, freeze=["vision"])
    recipe = load_recipe(path).recipe
    assert recipe.model.freeze == ["vision"] and check_modality(recipe, "vision") == []
    problems = check_modality(recipe, "text")
    assert [p.path for p in problems] == ["model.freeze"] and "is a text model" in problems[0].message
    path.write_text(path.read_text().replace("- vision", "- language_model"))
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert [p.path for p in caught.value.problems] == ["model.freeze.0"]


def _adapted(model) -> list[str]:
    """The modules PEFT put a LoRA adapter on, without PEFT's wrapper prefix."""
    return sorted(name.removeprefix("base_model.model.") for name, module in model.named_modules()
                  if hasattr(module, "lora_A") and len(module.lora_A))


def test_lora_targets_the_language_model_only_unless_the_recipe_names_the_vision_tower(tmp_path, llava):
    """all-linear (the default) and a name list like [q_proj, v_proj], which CLIP's attention has too, adapt the
    language model alone; a regular expression or a name inside the projector's path adapts what it names."""
    trainer, _ = built_trainer(_recipe(tmp_path, llava, adapter={"r": 4}))
    adapted = _adapted(trainer.model)
    assert adapted and all(name.startswith("model.language_model.") for name in adapted), adapted
    assert "model.language_model.layers.0.mlp.down_proj" in adapted
    assert trainer.model.peft_config["default"].exclude_modules is not None

    base = transformers.AutoModelForImageTextToText.from_config(transformers.AutoConfig.from_pretrained(llava))
    from peft import LoraConfig, get_peft_model

    def adapted_with(targets):
        fresh = type(base)(base.config)
        return _adapted(get_peft_model(fresh, fit_lora_targets(LoraConfig(r=4, target_modules=targets), fresh)))

    assert adapted_with(["q_proj", "v_proj"]) == ["model.language_model.layers.0.self_attn.q_proj",
                                                  "model.language_model.layers.0.self_attn.v_proj"]
    with_projector = adapted_with(["q_proj", "multi_modal_projector.linear_1"])
    assert "model.multi_modal_projector.linear_1" in with_projector
    assert not any("vision_tower" in name for name in with_projector)
    said: list[str] = []  # ft train says what the adapter leaves out, and how to opt it in
    fit_lora_targets(LoraConfig(r=4, target_modules="all-linear"), type(base)(base.config), said.append)
    assert len(said) == 1 and "language model only" in said[0] and "vision_tower" in said[0], said
    everywhere = adapted_with(r".*\.(q_proj|v_proj)")
    assert any(name.startswith("model.vision_tower.") for name in everywhere)

    idefics = _tiny_idefics3()
    adapted = _adapted(get_peft_model(idefics, fit_lora_targets(LoraConfig(r=4, target_modules="all-linear"),
                                                                idefics)))
    assert adapted and all(name.startswith("model.text_model.") for name in adapted), adapted


# --- 2. generate, merge, export of trained runs ---------------------------------------------------------------------


def _trained(folder: Path, model: Path, adapter: dict | None = None) -> Path:
    result = run_ft("train", str(_recipe(folder, model, steps=3, adapter=adapter)))
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "out"


@pytest.fixture(scope="module")
def vision_runs(tmp_path_factory, llava) -> dict[str, Path]:
    """A full and a LoRA fine-tune of the tiny LLaVA, 3 steps each, and a picture to ask about."""
    root = tmp_path_factory.mktemp("vision-runs")
    return {"full": _trained(root / "full", llava), "lora": _trained(root / "lora", llava, {"r": 4}),
            "image": _square(root / "question.png", "red")}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["full", "lora"])
def test_generate_answers_about_an_image(vision_runs, kind):
    """The run's model loads as an image-text-to-text model with its processor; the image goes through the
    processor into pixel_values (a missing one is exit 2 before the model loads)."""
    result = run_ft("generate", str(vision_runs[kind]), "--image", str(vision_runs["image"]), "--prompt",
                    "What colour is the square?", "--max-new-tokens", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() or result.stdout == "\n"  # a completion line (3 random tokens may decode to blanks)
    missing = run_ft("generate", str(vision_runs[kind]), "--image", str(vision_runs["image"].with_name("gone.png")),
                     "--prompt", "What colour?")
    assert missing.returncode == 2 and "--image: " in missing.stderr and "gone.png does not exist" in missing.stderr


def test_generate_through_the_image_path_in_process(tmp_path, llava):
    """In process, on a saved tiny LLaVA: the prompt is rendered with the image's token in the user turn, and
    generation with the image's pixels runs and returns a string."""
    from ft.inference.generate import Sampling, generate, prompt_text

    model = transformers.AutoModelForImageTextToText.from_config(transformers.AutoConfig.from_pretrained(llava))
    model.save_pretrained(tmp_path / "m")
    transformers.AutoProcessor.from_pretrained(llava).save_pretrained(tmp_path / "m")
    image = _square(tmp_path / "red.png", "red")
    out = list(generate(tmp_path / "m", [("--prompt 1", {"prompt": "Colour?"})], Sampling(max_new_tokens=3),
                        say=lambda _: None, image=image))
    assert len(out) == 1 and isinstance(out[0], str)
    processor = transformers.AutoProcessor.from_pretrained(tmp_path / "m")
    text, templated = prompt_text(processor, {"prompt": "Colour?"}, Sampling(), "--prompt 1", image=True)
    assert templated and text == "<|im_start|>user\n<image>Colour?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.slow
def test_generate_with_an_image_refuses_a_text_model(tmp_path):
    folder = tmp_path / "text"
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(ASSETS)).save_pretrained(
        folder)
    transformers.AutoTokenizer.from_pretrained(ASSETS).save_pretrained(folder)
    _square(tmp_path / "red.png", "red")
    result = run_ft("generate", str(folder), "--image", str(tmp_path / "red.png"), "--prompt", "Colour?")
    assert result.returncode == 2 and "--image: " in result.stderr and "is a text model" in result.stderr


@pytest.mark.slow
def test_merge_keeps_the_processor_and_export_refuses_the_model(vision_runs, tmp_path):
    merged = tmp_path / "merged"
    result = run_ft("merge", str(vision_runs["lora"]), "--out", str(merged))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "merge check on 4 rows" in result.stderr and (merged / "processor_config.json").is_file()
    processor = transformers.AutoProcessor.from_pretrained(merged)
    assert isinstance(processor, transformers.LlavaProcessor) and processor.chat_template == CHATML_IMAGES
    model = transformers.AutoModelForImageTextToText.from_pretrained(merged)
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    for source in (vision_runs["full"], vision_runs["lora"], merged):
        out = tmp_path / f"{source.name}.gguf"
        refused = run_ft("export", str(source), "--gguf", str(out))
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert "vision-language model (llava)" in refused.stderr and "mmproj" in refused.stderr
        assert not out.exists() and not list(tmp_path.glob(f".{out.name}*"))
