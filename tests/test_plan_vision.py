"""`ft plan` for vision-language models: the vision tower's and projector's parameters counted from the config equal a
model built from it (every family the tables hold), frozen parts and LoRA train what the loaded model trains, a row's
image tokens are the processor's own, the tower's activation formula equals what torch saves for backward, and the
report shows the vision side. Real transformers configs, processors and models, built here; no weights needed."""

from __future__ import annotations

import json
import shutil
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from conftest import run_ft
from PIL import Image
from test_vision import SMOLVLM, build_tiny_llava

from ft.model.adapters import fit_lora_targets, freeze, lora_config, part_parameters, vision_parts
from ft.plan.memory import estimate, parameters, setup_for, vision_layer_bytes
from ft.plan.report import plan
from ft.plan.shape import PlanError, read_shape
from ft.plan.suggest import set_args
from ft.plan.vision import image_load
from ft.recipe import load_recipe
from ft.units import MiB

TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300}
VIT = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
MROPE = {"rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}


def _llama(**changes):
    return transformers.LlamaConfig(**{**TEXT, **changes})


# each family the tables hold, as a tiny config: the model's model_type, the vision tower's, the projector's layout
FAMILIES = {
    "llava-clip": lambda: transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**VIT, image_size=16, patch_size=8), text_config=_llama()),
    "llava-siglip-with-head": lambda: transformers.LlavaConfig(
        vision_config=transformers.SiglipVisionConfig(**VIT, image_size=16, patch_size=8), text_config=_llama(),
        vision_feature_layer=[-2, -1], multimodal_projector_bias=False),
    "llava_next": lambda: transformers.LlavaNextConfig(
        vision_config=transformers.CLIPVisionConfig(**VIT, image_size=16, patch_size=8), text_config=_llama()),
    "llava_onevision": lambda: transformers.LlavaOnevisionConfig(
        vision_config=transformers.SiglipVisionConfig(**VIT, image_size=16, patch_size=8, vision_use_head=False),
        text_config=transformers.Qwen2Config(**TEXT)),
    "idefics3": lambda: transformers.Idefics3Config(
        vision_config={**VIT, "image_size": 16, "patch_size": 4}, text_config=_llama().to_dict(), scale_factor=2),
    "smolvlm": lambda: transformers.SmolVLMConfig(
        vision_config={**VIT, "image_size": 16, "patch_size": 4}, text_config=_llama().to_dict(), scale_factor=2),
    "qwen2_vl": lambda: transformers.Qwen2VLConfig(
        vision_config={"depth": 2, "embed_dim": 16, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2,
                       "patch_size": 4, "spatial_merge_size": 2}, text_config={**TEXT, **MROPE}),
    "qwen2_5_vl": lambda: transformers.Qwen2_5_VLConfig(
        vision_config={"depth": 2, "hidden_size": 16, "out_hidden_size": 32, "intermediate_size": 24,
                       "num_heads": 2, "patch_size": 4, "spatial_merge_size": 2, "fullatt_block_indexes": [1]},
        text_config={**TEXT, **MROPE}),
    "gemma3": lambda: transformers.Gemma3Config(
        vision_config={**VIT, "image_size": 32, "patch_size": 4}, text_config=dict(TEXT), mm_tokens_per_image=4),
    "mistral3": lambda: transformers.Mistral3Config(
        vision_config={**VIT, "image_size": 32, "patch_size": 4, "head_dim": 8},
        text_config={**TEXT, "model_type": "mistral"}),
    "paligemma": lambda: transformers.PaliGemmaConfig(
        vision_config={**VIT, "image_size": 16, "patch_size": 4, "projection_dim": 32},
        text_config={**TEXT, "model_type": "gemma"}),
}


def _recipe(tmp_path: Path, folder: Path, rows: list[dict] | None = None, **sections) -> Path:
    """An SFT recipe on the model in ``folder`` over chat ``rows`` (image paths relative to their file)."""
    count = len(list(tmp_path.glob("recipe-*.yaml")))
    data = tmp_path / "data" / f"train-{count}.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(row) + "\n" for row in rows or [_asked(0)]))
    recipe = {"method": "sft", "model": {"name": str(folder), "init": "random"},
              "data": {"train": [{"path": str(data), "format": "chat"}], "max_length": 64},
              "optimizer": {"name": "adamw_torch", "lr": 1e-4},
              "train": {"output_dir": str(tmp_path / "run"), "per_device_train_batch_size": 4}}
    for section, keys in sections.items():
        recipe[section] = {**recipe.get(section, {}), **keys}
    path = tmp_path / f"recipe-{count}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _picture(path: Path, size: tuple[int, int]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (200, 40, 40)).save(path)
    return path.name


def _asked(*images) -> dict:
    """A chat whose user turn shows ``images`` (names in data/images/) and asks about them."""
    parts = [{"type": "image", "image": f"images/{name}"} for name in images]
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "What colour is it?"}]},
                         {"role": "assistant", "content": "Red"}]}


def _setup(path: Path, device: str = "cpu", overrides=()):
    recipe = load_recipe(path, overrides).recipe
    shape = read_shape(recipe)
    images = image_load(recipe, shape.vision) if shape.vision is not None else None
    return recipe, shape, setup_for(recipe, shape, device=device, images=images)


def _part(est, prefix: str) -> float:
    return next((p.size for p in est.parts if p.name.startswith(prefix)), 0.0)


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture(scope="module")
def tiny_idefics3(tmp_path_factory) -> Path:
    """A whole tiny Idefics3 (SmolVLM) folder: test_vision's tiled processor (images up to 32 pixels a side, in tiles
    of 16, 4 tokens a tile) and a config whose tower makes 16 patches a tile, 4 tokens after the 2×2 pixel shuffle."""
    folder = tmp_path_factory.mktemp("tiny-idefics3")
    tokenizer = transformers.AutoTokenizer.from_pretrained(Path(__file__).parents[1] / "assets" / "tiny-llama")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<fake_token_around_image>", "<image>",
                                                                "<global-img>", "<end_of_utterance>"]})
    image_processor = transformers.Idefics3ImageProcessor(size={"longest_edge": 32},
                                                          max_image_size={"longest_edge": 16}, do_image_splitting=True)
    transformers.Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4,
                                   chat_template=SMOLVLM).save_pretrained(folder)
    transformers.Idefics3Config(vision_config={**VIT, "image_size": 16, "patch_size": 4},
                                text_config=_llama(vocab_size=len(tokenizer)).to_dict(), scale_factor=2,
                                image_token_id=tokenizer.convert_tokens_to_ids("<image>")).save_pretrained(folder)
    return folder


# --- parameters -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_each_familys_tower_and_projector_are_counted_as_the_model_built_from_its_config(tmp_path, family):
    """Per part (the tower; the projector), the count from the config equals the sum of numel of the parameters ft's
    own part finder gives for a model built from it; every linear has its module's name and shape (what LoRA and
    GaLore targets match); the whole model's count too where the language model is Llama-style (Gemma 3's text
    decoder has norms the text path does not count)."""
    config = FAMILIES[family]()
    config.save_pretrained(tmp_path / "model")
    modality = {"modality": "vision"} if family == "gemma3" else {}  # Gemma 3 has a text class too: trains as text
    recipe = load_recipe(_recipe(tmp_path, tmp_path / "model", model=modality)).recipe
    shape = read_shape(recipe)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    parts = vision_parts(model)
    assert {part: shape.vision.count(part) for part in parts} == {
        part: sum(p.numel() for p in part_parameters(model, part, parts).values()) for part in parts}
    inside = [path for paths in parts.values() for path in paths]
    assert {lin.name: (lin.fan_out, lin.fan_in) for lin in shape.vision.linears()} == {
        name: (module.out_features, module.in_features) for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and any(name.startswith(path + ".") for path in inside)}
    assert shape.decoder + ".layers.0.self_attn.q_proj" in dict(model.named_modules())
    counted = estimate(shape, setup_for(recipe, shape, device="cpu")).params
    if family != "gemma3":
        assert counted == model.num_parameters()
    if family == "gemma3":  # without model.modality it is planned as the text model it trains as
        assert read_shape(load_recipe(_recipe(tmp_path, tmp_path / "model")).recipe).vision is None


def test_a_family_the_tables_do_not_hold_is_one_paragraph_naming_model_name(tmp_path):
    transformers.Idefics2Config(text_config=_llama().to_dict()).save_pretrained(tmp_path / "model")
    with pytest.raises(PlanError) as caught:
        read_shape(load_recipe(_recipe(tmp_path, tmp_path / "model")).recipe)
    message = str(caught.value)
    assert message.startswith("model.name: ") and "(idefics2, vision tower idefics2_vision)" in message
    assert "\n" not in message and "Idefics3/SmolVLM" in message


TRAINING = {  # recipe sections -> what trains
    "full": {},
    "freeze-vision": {"model": {"freeze": ["vision"]}},
    "freeze-both": {"model": {"freeze": ["vision", "projector"]}},
    "lora": {"adapter": {"kind": "lora", "r": 4}},
    "lora-and-projector": {"adapter": {"kind": "lora", "r": 4, "target_modules": [
        "q_proj", "v_proj", "multi_modal_projector.linear_1"]}},
    "lora-regex": {"adapter": {"kind": "lora", "r": 4, "target_modules": r".*\.q_proj"}},
}


@pytest.mark.parametrize("case", TRAINING)
def test_frozen_parts_and_lora_train_what_the_loaded_model_trains(tmp_path, tiny_llava, case):
    """The plan's trained parameters are those the model ft loads trains (``model.freeze`` applied by ft's own
    ``freeze``; a LoRA config fitted by ft's ``fit_lora_targets`` and wrapped by PEFT), and gradients and AdamW's
    state follow them: 4 and 8 bytes a trained float32 parameter; a frozen part only weighs."""
    recipe, shape, setup = _setup(_recipe(tmp_path, tiny_llava, **TRAINING[case]))
    est = estimate(shape, setup)
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(transformers.AutoConfig.from_pretrained(tiny_llava))
    if recipe.model.freeze:
        freeze(model, recipe.model.freeze, lambda _: None)
    if recipe.adapter is not None:
        from peft import get_peft_model

        model = get_peft_model(model, fit_lora_targets(lora_config(recipe.adapter), model))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert est.trainable == trained
    assert _part(est, "gradients") == 4 * trained and _part(est, "optimizer state") == 8 * trained
    full = estimate(*_setup(_recipe(tmp_path, tiny_llava))[1:])
    assert _part(est, "weights") == _part(full, "weights") or recipe.adapter is not None
    frozen = {part: shape.vision.count(part) for part in recipe.model.freeze or ()}
    if recipe.adapter is None:
        assert _part(full, "gradients") - _part(est, "gradients") == 4 * sum(frozen.values())
        assert _part(full, "optimizer state") - _part(est, "optimizer state") == 8 * sum(frozen.values())
    adapted = {p.part for p in parameters(shape, setup) if p.kind == "adapter"}
    assert adapted == {"lora": {"language"}, "lora-and-projector": {"language", "projector"},
                       "lora-regex": {"language", "vision"}}.get(case, set())


# --- images ---------------------------------------------------------------------------------------------------------


def _processor_tokens(processor, images: list[Image.Image]) -> int:
    """The tokens the processor itself writes for ``images``: its output for one placeholder per image, less the same
    text's tokens with each placeholder as one token."""
    text = processor.image_token * len(images) + "What colour is it?"
    written = processor(text=text, images=images, add_special_tokens=False)["input_ids"][0]
    return len(written) - len(processor.tokenizer(text, add_special_tokens=False)["input_ids"]) + len(images)


def test_image_tokens_per_row_are_what_the_processor_writes_for_the_rows_images(tmp_path, tiny_idefics3):
    """Idefics3 tiles an image by its aspect ratio: a row of a wide 64×48 image (four tiles and a global view), one of a
    tall 16×48 one (two tiles) and the wide one, and one of the tall one. The plan's tokens per image, image tokens per
    row (the worst row's) and images per row are the processor's own counts for the real images; the tower's tokens
    are its tiles' patches."""
    folder = tmp_path / "data" / "images"
    sizes = {"wide.png": (64, 48), "tall.png": (16, 48)}
    for name, size in sizes.items():
        _picture(folder / name, size)
    rows = [_asked("wide.png"), _asked("tall.png", "wide.png"), _asked("tall.png")]
    recipe = load_recipe(_recipe(tmp_path, tiny_idefics3, rows)).recipe
    load = image_load(recipe, read_shape(recipe).vision)
    processor = transformers.AutoProcessor.from_pretrained(tiny_idefics3)
    opened = {name: Image.open(folder / name).convert("RGB") for name in sizes}
    per_image = {name: _processor_tokens(processor, [image]) for name, image in opened.items()}
    per_row = [_processor_tokens(processor, [opened[part["image"][7:]] for part in row["messages"][0]["content"]
                                             if part["type"] == "image"]) for row in rows]
    tiles = {name: processor.image_processor(images=[image], return_tensors="np")["pixel_values"].shape[1]
             for name, image in opened.items()}
    assert per_image["wide.png"] > per_image["tall.png"] and tiles == {"wide.png": 5, "tall.png": 3}
    assert load.source == "data" and load.rows == 3 and load.detail == "the first 3 rows of data.train"
    assert load.tokens_per_image == max(per_image.values()) and load.row_tokens == max(per_row)
    assert load.images_per_row == 2 and load.mean_images == pytest.approx(4 / 3)
    assert load.row_patches == 16 * (tiles["wide.png"] + tiles["tall.png"])  # 16 patches a tile
    assert load.row_tokens == max(per_row) == per_row[1] != per_image["wide.png"] * 2  # the worst row's


def test_without_readable_data_the_processor_or_the_config_counts_one_image_and_says_so(tmp_path, tiny_idefics3):
    """A row whose image is missing: the data is not read, and one image a row is counted at the largest size the
    processor keeps (32×32: four tiles and the global view), as the processor counts it; `data.image.size` sets that
    size. A folder with a config and no processor: the config's count for one tile."""
    path = _recipe(tmp_path, tiny_idefics3, [_asked("missing.png")])
    recipe = load_recipe(path).recipe
    vision = read_shape(recipe).vision
    load = image_load(recipe, vision)
    processor = transformers.AutoProcessor.from_pretrained(tiny_idefics3)
    assert load.source == "processor" and load.images_per_row is None
    assert load.detail.startswith("data not read (data.train.0: 1 bad row in ") and "missing.png" in load.detail
    assert load.detail.endswith("the processor's count for one image at 32×32")
    assert load.tokens_per_image == load.row_tokens == _processor_tokens(processor, [Image.new("RGB", (32, 32))])
    sized = load_recipe(path, ["data.image.size=[16, 16]"]).recipe
    assert image_load(sized, vision).tokens_per_image == _processor_tokens(processor, [Image.new("RGB", (16, 16))])
    shown = plan(recipe, "recipe.yaml", device="cpu").render()
    assert f"images: {load.tokens_per_image} tokens per image (data not read" in shown
    assert f"per row unknown, counted as one: {load.row_tokens} image tokens a row" in shown
    bare = tmp_path / "config-only"
    bare.mkdir()
    shutil.copy(tiny_idefics3 / "config.json", bare)
    alone = image_load(load_recipe(_recipe(tmp_path, bare, [_asked("missing.png")])).recipe, vision)
    assert alone.source == "config" and alone.detail.startswith("no processor (")
    assert alone.tokens_per_image == 4 and alone.patches_per_image == 16  # one tile: 16 patches, 2×2 into one token


# --- activations ----------------------------------------------------------------------------------------------------

TOWER_CASES = {  # a tower kind and the recipe sections
    "clip-sdpa": ("clip", {}),
    "clip-eager": ("clip", {"model": {"attn_implementation": "eager"}}),
    "clip-bf16-autocast": ("clip", {"train": {"bf16": True}}),  # float32 weights: each projection its own cast
    "siglip-sdpa": ("siglip", {}),
    "idefics3-eager": ("idefics3", {"model": {"attn_implementation": "eager"}}),
}
SIZES = {"hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4, "image_size": 64, "patch_size": 8}
TOWER_CONFIGS = {"clip": transformers.CLIPVisionConfig, "siglip": transformers.SiglipVisionConfig,
                 "idefics3": transformers.Idefics3VisionConfig}
TOWER_MODELS = {"clip": transformers.CLIPVisionModel, "siglip": transformers.SiglipVisionModel,
                "idefics3": transformers.Idefics3VisionTransformer}


@pytest.mark.parametrize("case", TOWER_CASES)
def test_tower_layer_formula_equals_what_torch_saves_for_backward(tmp_path, case):
    """One tower layer's saved tensors, counted with saved_tensors_hooks (a 3-layer tower minus a 2-layer one), equal
    ``vision_layer_bytes`` times the tower's tokens (and, under autocast, the layer's cached half-precision weights)."""
    kind, sections = TOWER_CASES[case]
    attention = sections.get("model", {}).get("attn_implementation", "sdpa")
    batch, saved = 2, {}
    for layers in (2, 3):
        torch.manual_seed(0)
        tower = TOWER_MODELS[kind](TOWER_CONFIGS[kind](**SIZES, num_hidden_layers=layers,
                                                       attn_implementation=attention))
        tower.train()
        params = {p.untyped_storage().data_ptr() for p in tower.parameters()}
        storages = {}

        def keep(t, storages=storages):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if "train" in sections else nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), autocast:
            tower(pixel_values=torch.randn(batch, 3, 64, 64))
        saved[layers] = sum(n for ptr, n in storages.items() if ptr not in params)
    vision = TOWER_CONFIGS[kind](**SIZES, num_hidden_layers=3)
    config = (transformers.Idefics3Config(vision_config=vision.to_dict(), text_config=_llama().to_dict())
              if kind == "idefics3" else transformers.LlavaConfig(vision_config=vision, text_config=_llama()))
    config.save_pretrained(tmp_path / "model")
    _, shape, setup = _setup(_recipe(tmp_path, tmp_path / "model", **sections))
    v = shape.vision
    tokens = batch * v.encoder_tokens(v.grid)
    copies = 2 * sum(lin.fan_in * lin.fan_out for lin in v.layer_linears(1)) if setup.mixed else 0
    assert saved[3] - saved[2] == vision_layer_bytes(shape, setup, 1, v.encoder_tokens(v.grid)) * tokens + copies


def test_tower_activations_follow_the_images_and_vanish_where_no_gradient_reaches(tmp_path, tiny_llava):
    """Two images a row hold twice the tower's and projector's activations of one; the language model's stay (its
    sequence is data.max_length, image tokens included). A frozen tower keeps only the projector's; a frozen tower and
    projector, or LoRA on the language model, none; checkpointing keeps each tower layer's input alone."""
    folder = tmp_path / "data" / "images"
    _picture(folder / "a.png", (24, 24))
    one = _recipe(tmp_path, tiny_llava, [_asked("a.png")] * 4, train={"gradient_checkpointing": False})
    two = _recipe(tmp_path, tiny_llava, [_asked("a.png", "a.png")] * 4, train={"gradient_checkpointing": False})
    single, double = (estimate(*_setup(path)[1:]) for path in (one, two))
    assert _part(double, "vision tower") == 2 * _part(single, "vision tower") > 0
    assert _part(double, "activations saved") == _part(single, "activations saved")
    _, shape, setup = _setup(one)
    load = setup.images
    assert load.row_patches == 5 and load.row_tokens == 4  # CLIP: 4 patches and a class token; 4 tokens
    projector = [w for w in shape.vision.projector if w.kind == "linear"]
    per_token = 4 * (sum(w.cols for w in projector) + projector[0].rows)
    assert _part(estimate(*_setup(one, overrides=["model.freeze=[vision]"])[1:]), "vision tower") == \
        per_token * setup.batch * load.row_tokens
    for changes in (["model.freeze=[vision, projector]"], ["adapter.kind=lora"]):
        assert _part(estimate(*_setup(one, overrides=changes)[1:]), "vision tower") == 0
    checkpointed = estimate(*_setup(one, overrides=["train.gradient_checkpointing=true"])[1:])
    v = shape.vision
    assert _part(checkpointed, "vision tower") == v.layers * 4 * v.hidden * setup.batch * load.row_patches + \
        per_token * setup.batch * load.row_tokens


# --- the report -----------------------------------------------------------------------------------------------------


def test_the_report_shows_the_vision_side_and_suggests_freezing_the_tower(tmp_path, tiny_llava):
    """`ft plan` prints the tower's and projector's parameters and what trains, tokens per image, images per row and
    their share of the sequence, and the tower's activations; --json holds the same. A budget that only a frozen
    tower fits gets `model.freeze: [vision]`, whose --set gives the estimate it showed."""
    folder = tmp_path / "data" / "images"
    _picture(folder / "a.png", (24, 24))
    path = _recipe(tmp_path, tiny_llava, [_asked("a.png"), _asked("a.png", "a.png"), _asked("a.png"), _asked("a.png")],
                   model={"freeze": ["projector"]})
    shown = run_ft("plan", str(path), "--device", "cpu", "--gpu-memory", "80GiB")
    assert shown.returncode == 0, shown.stderr
    vision = read_shape(load_recipe(path).recipe).vision
    tower, projector = (f"{vision.count(part):,}" for part in ("vision", "projector"))
    lines = shown.stdout.splitlines()
    assert (f"vision: llava; tower clip_vision_model (1 layers, hidden 16) {tower} parameters, trained; projector "
            f"{projector} parameters, frozen") in lines
    assert "images: 4 tokens per image, 2 per row at most, 1.25 on average (the first 4 rows of data.train)" in lines
    assert "        up to 8 image tokens a row: 12.5% of the 64-token sequence" in lines
    assert any(line.startswith("vision tower and projector activations") for line in lines)
    data = json.loads(run_ft("plan", str(path), "--device", "cpu", "--json").stdout)
    assert data["vision"]["vision"] == {"parameters": vision.count("vision"),
                                        "trainable_parameters": vision.count("vision"), "state": "trained"}
    assert data["vision"]["projector"]["state"] == "frozen" and data["vision"]["projector"]["trainable_parameters"] == 0
    assert data["vision"]["tokens_per_image"] == 4 and data["vision"]["images_per_row"] == 2
    assert data["vision"]["image_token_share"] == 0.125
    assert data["parameters"] == data["trainable_parameters"] + vision.count("projector")

    recipe = load_recipe(path).recipe
    full = plan(recipe, str(path), device="cpu")
    frozen = plan(load_recipe(path, ["model.freeze=[vision, projector]"]).recipe, str(path), device="cpu")
    budget = f"{(full.estimate.total + frozen.estimate.total) / 2 / 0.9 / MiB:.4f}MiB"
    found = plan(recipe, str(path), gpu_memory=budget, device="cpu")
    assert found.fits is False
    suggestion = next(x for x in found.suggestions if "model.freeze" in x.changes)
    assert suggestion.changes == {"model.freeze": ["vision", "projector"]}
    again = plan(load_recipe(path, set_args(suggestion.changes)).recipe, str(path), gpu_memory=budget, device="cpu")
    assert again.fits and again.estimate.total == pytest.approx(suggestion.estimate.total)
