"""`ft train RECIPE --smoke` of a vision-language recipe, offline on the CPU: the stand-in is a tiny random
image-text-to-text model whose images are a few tokens (the real config shrunk and the real processor re-sized where
they can be read, else a shipped asset of the family, else the generic tiny LLaVA, said so); its data the first rows
with their images still found, or chats about generated pictures in the source's layout; the adapter's target modules
checked against its module names. Real transformers models and processors throughout (the slow image processors:
torchvision is not installed)."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import tomllib
from pathlib import Path

import datasets
import pytest
import yaml
from conftest import ROOT, run_ft
from PIL import Image, ImageDraw
from test_vision import COLOURS, build_tiny_llava
from transformers import AutoConfig, AutoProcessor

from ft.data.formats import normalize
from ft.data.images import ImageTokens
from ft.data.rows import BadRows
from ft.data.sources import read_source
from ft.model.loading import ModelLoadError
from ft.recipe.adapter import AdapterSection
from ft.recipe.data_section import DataSource
from ft.smoke import first_rows, tiny_model

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
LANGUAGE_MODEL = r"model.language_model.layers.[\d]+.(mlp|self_attn).(up|down|gate|q|k|v|o)_proj"
TEXT_MODEL = r"model.text_model.layers.[\d]+.(mlp|self_attn).(up|down|gate|q|k|v|o)_proj"



def _unreadable(hub_id: str) -> str:
    """A model named like ``hub_id`` whose files cannot be read, as the hub's cannot offline, without asking the hub
    (which a test process may reach: huggingface_hub reads HF_HUB_OFFLINE once, when imported): a folder that does
    not exist. The smoke runs through ``ft`` below name the hub ids themselves, offline."""
    return f"/nonexistent/{hub_id}"


def _smoke(recipe: Path, output_dir: Path):
    return run_ft("train", str(recipe), "--smoke", "--set", f"train.output_dir={output_dir}", env=OFFLINE)


def _smoked(result, smoke_dir: Path) -> dict:
    """summary.json's ``smoke`` of a smoke run that must have passed: three steps, final/ written."""
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((smoke_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert (smoke_dir / "final").is_dir()
    return summary["smoke"]


def _changes(described: dict) -> dict:
    return {entry["key"]: entry for entry in described["substitutions"]}


def _tokens_of_an_image(folder: Path) -> int:
    """How many tokens the processor saved in ``folder`` writes for a 24x24 picture."""
    return len(ImageTokens(AutoProcessor.from_pretrained(folder), None).expansion((24, 24)))


def _read(path: Path, **source) -> list[dict]:
    """The rows of a local data file (or saved dataset) as ft reads them for a vision-language model (images checked
    and resolved)."""
    source = DataSource(path=str(path), format="chat", **source)
    report = BadRows()
    raw = read_source(source, seed=0, on_bad_row="error", report=report, key="data.train.0")
    return normalize(raw, source, key="data.train.0", on_bad_row="error", report=report, images=True).to_list()


def _square(path: Path, colour: str) -> Path:
    """A 24x24 white picture with a square of ``colour`` in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    picture = Image.new("RGB", (24, 24), (255, 255, 255))
    ImageDraw.Draw(picture).rectangle([4, 4, 19, 19], fill=COLOURS[colour])
    picture.save(path)
    return path


def _pictures(folder: Path, count: int) -> list[dict]:
    """``count`` chats about pictures in ``folder/images``, each named by its path relative to ``folder``."""
    names = list(COLOURS)
    rows = []
    for i in range(count):
        picture = _square(folder / "images" / f"{i}.png", names[i % 4]).relative_to(folder).as_posix()
        rows.append({"messages": [{"role": "user", "content": [{"type": "image", "image": picture},
                                                              {"type": "text", "text": "What colour is it?"}]},
                                  {"role": "assistant", "content": names[i % 4].capitalize()}]})
    return rows


def _jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


# --- the stand-in ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "modality", "family", "kind", "note"), [
    ("HuggingFaceTB/SmolVLM-256M-Instruct", None, "idefics3", "idefics3", "'smolvlm' in its name"),
    ("google/gemma-3-4b-it", "vision", "gemma3", "gemma3", None),
    ("google/gemma-3-4b-it", None, "gemma", "gemma", None),  # Gemma 3 trains as text unless model.modality says
    ("Qwen/Qwen2-VL-7B-Instruct", None, "llava", "llava", "generic tiny llava"),
    ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", "vision", "llava", "llava", "generic tiny llava"),
])
def test_an_unreadable_config_stands_in_as_its_family_by_name_and_modality(name, modality, family, kind, note):
    """Offline nothing of the real model can be read: a vision-language stand-in where model.modality says vision or
    the name names a vision-only family, the family's shipped asset (the generic LLaVA for a family ft ships none of,
    said so); an image is at most 16 tokens of its processor."""
    notes: list[str] = []
    stand = tiny_model.stand_in(_unreadable(name), None, False, 0, notes, modality=modality)
    assert (stand.described["family"], stand.model_type) == (family, kind)
    vision = family in tiny_model.VISION_FAMILIES
    assert stand.described["modality"] == ("vision" if vision else "text")
    assert stand.described["config"].startswith(f"shipped assets/{tiny_model.ASSET_FOLDERS[family]}")
    assert note in " ".join(notes) if note else not notes
    if vision:
        assert type(stand.model).__name__.endswith("ForConditionalGeneration")
        processor = stand.processing
        tokens = ImageTokens(processor, None)
        assert len(tokens.expansion((300, 200))) <= 16
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour?"}]}]
        text = processor.tokenizer.apply_chat_template(messages, tokenize=False, chat_template=processor.chat_template,
                                                       add_generation_prompt=True)
        inputs = processor(text=text, images=[Image.new("RGB", (40, 24))], add_special_tokens=False,
                           return_tensors="pt")
        assert stand.model(**inputs).logits.shape[1] == inputs["input_ids"].shape[1]


def test_model_modality_that_the_readable_config_contradicts_is_refused_naming_the_key(tmp_path):
    llava = build_tiny_llava(tmp_path / "llava")
    with pytest.raises(ModelLoadError, match=r"^model\.modality: is text, and the model's family \(llava\)"):
        tiny_model.stand_in(str(llava), None, False, 0, [], modality="text")


@pytest.mark.parametrize(("name", "modality", "targets", "says"), [
    # SmolVLM (Idefics3) calls its language model text_model, as its stand-in does
    ("HuggingFaceTB/SmolVLM-256M-Instruct", None, TEXT_MODEL, None),
    ("HuggingFaceTB/SmolVLM-256M-Instruct", None, LANGUAGE_MODEL, "shipped tiny idefics3 model (tiny-smolvlm)"),
    ("google/gemma-3-4b-it", "vision", LANGUAGE_MODEL, None),
    ("HuggingFaceTB/SmolVLM-256M-Instruct", None, ["q_proj", "v_proj", "connector.modality_projection.proj"], None),
    # Qwen2-VL's language model has LLaVA's path, its vision tower another name: the fallback says it may be right
    ("Qwen/Qwen2-VL-7B-Instruct", None, LANGUAGE_MODEL, None),
    ("Qwen/Qwen2-VL-7B-Instruct", None, r"model.visual.blocks.[\d]+.attn.qkv", "generic tiny llava model (tiny-llava)"),
])
def test_lora_targets_are_checked_against_the_vision_stand_ins_module_names(name, modality, targets, says):
    stand = tiny_model.stand_in(_unreadable(name), None, False, 0, [], modality=modality)
    problems = tiny_model.adapter_problems(AdapterSection(kind="lora", target_modules=targets), stand, name)
    if says is None:
        assert problems == []
        return
    [problem] = problems
    assert problem.path == "adapter.target_modules" and says in problem.message
    assert "these names may be right" in problem.message


@pytest.fixture(scope="module")
def generic_stand_in():
    """The generic tiny LLaVA standing in, offline, for Qwen2-VL (a family ft ships no tiny model of)."""
    stand = tiny_model.stand_in(_unreadable("Qwen/Qwen2-VL-7B-Instruct"), None, False, 0, [], modality="vision")
    assert stand.described["fallback"] and stand.model_type == "llava"
    return stand


QWEN2_VL_TOWER = r"model.visual.blocks.[\d]+.attn.qkv"  # Qwen2-VL's vision tower, which the generic LLaVA lacks


@pytest.mark.parametrize(("adapter", "fitted"), [
    # names: those the stand-in has are kept (in order), the others leave; none of them: all-linear
    ({"target_modules": ["q_proj", "qkv", "v_proj", "merger.mlp.0"]}, {"target_modules": ["q_proj", "v_proj"]}),
    ({"target_modules": ["qkv", "merger.mlp.0"]}, {"target_modules": "all-linear"}),
    # a regular expression that matches none of its modules: all-linear; one that matches some stays as written
    ({"target_modules": QWEN2_VL_TOWER}, {"target_modules": "all-linear"}),
    ({"target_modules": LANGUAGE_MODEL}, {}),
    ({"target_modules": "all-linear"}, {}),
    # modules to save it lacks leave, and the key too when none is left
    ({"modules_to_save": ["lm_head", "visual.merger"]}, {"modules_to_save": ["lm_head"]}),
    ({"modules_to_save": ["visual.merger"]}, {"modules_to_save": None}),
    ({"target_modules": ["q_proj", "qkv"], "modules_to_save": ["visual.merger"]},
     {"target_modules": ["q_proj"], "modules_to_save": None}),
    ({"target_modules": QWEN2_VL_TOWER, "path": "/somewhere/adapter"}, {}),  # a saved adapter's shape: not fitted
])
def test_the_generic_stand_in_fits_the_adapter_to_the_names_it_has(generic_stand_in, adapter, fitted):
    """``fitted_to_generic``: another family's names cannot be checked against the generic LLaVA, so the smoke run
    keeps the ones it has and trains all linear layers where none is left, instead of refusing the recipe."""
    assert tiny_model.fitted_to_generic(AdapterSection(kind="lora", **adapter), generic_stand_in) == fitted


def test_a_stand_in_of_the_family_itself_fits_nothing(generic_stand_in):
    """A stand-in that is not the generic one (Gemma 3's shipped asset) has the family's names: nothing is fitted,
    ``adapter_problems`` checks them instead; nor is anything fitted without an adapter."""
    gemma3 = tiny_model.stand_in(_unreadable("google/gemma-3-4b-it"), None, False, 0, [], modality="vision")
    assert not gemma3.described["fallback"]
    adapter = AdapterSection(kind="lora", target_modules=QWEN2_VL_TOWER, modules_to_save=["visual.merger"])
    assert tiny_model.fitted_to_generic(adapter, gemma3) == {}
    assert [p.path for p in tiny_model.adapter_problems(adapter, gemma3, "google/gemma-3-4b-it")] == [
        "adapter.target_modules", "adapter.modules_to_save"]
    assert tiny_model.fitted_to_generic(None, generic_stand_in) == {}


# --- the data -------------------------------------------------------------------------------------------------------


SHAREGPT = {"fields": {"messages": "conversations", "role": "from", "content": "value", "images": "pictures"},
            "roles": {"human": "user", "gpt": "assistant"}}  # LLaMA-Factory's layout, its images column renamed


@pytest.mark.parametrize("layout", [{}, SHAREGPT], ids=["parts", "images-column"])
def test_generated_chats_about_pictures_are_in_the_sources_layout_and_ft_reads_them(tmp_path, layout):
    """A chat source that cannot be read: chats about generated PNG pictures next to the rows, named by relative
    paths, as content parts or (a source that maps ``images``) LLaMA-Factory's column with `<image>` placeholders."""
    source = DataSource(path="someone/vision-chats", format="chat", **layout)
    path = tmp_path / "data" / "train.0.generated.jsonl"
    said = first_rows.generated_with_images(source, "train", 12, path)
    assert "8 PNG pictures" in said
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    first = raw[0]
    if layout:
        assert first["conversations"][0]["value"].startswith("<image>") and first["pictures"][0].endswith(".png")
        assert not Path(first["pictures"][0]).is_absolute()
    else:
        picture = {"type": "image", "image": "train.0.generated.images/red-32x32.png"}
        assert first["messages"][0]["content"][0] == picture
    rows = _read(path, **layout)
    assert len(rows) == 12 and all(len(row["images"]) == 1 and Path(row["images"][0]).is_file() for row in rows)
    sizes = {Image.open(row["images"][0]).size for row in rows}
    assert sizes == set(first_rows.PICTURE_SIZES)
    assert {row["messages"][-1]["content"][0]["text"] for row in rows} >= {"Red", "Green", "Blue", "Yellow", "White"}


def test_a_copy_of_the_first_rows_keeps_its_images_and_its_line_numbers(tmp_path):
    """The first rows are copied elsewhere: each relative image path (a part's, the ``images`` column's) is made
    absolute against the data file's folder, URLs and absolute paths stay, and a line that is not JSON is copied as it
    is, at its line."""
    folder = tmp_path / "set"
    rows = _pictures(folder, 60)
    rows[1]["messages"][0]["content"][0] = {"type": "image_url", "image_url": {"url": rows[1]["messages"][0]
                                                                               ["content"][0]["image"]}}
    rows[2]["messages"][0]["content"][0]["image"] = "https://example.com/a.png"
    rows[3]["messages"][0]["content"][0]["image"] = str(folder / "images" / "3.png")
    lines = [*rows[:4], '{"messages": [', *rows[4:]]
    data = _jsonl(folder / "train.jsonl", lines)
    stem = tmp_path / "copy" / "train.0"
    stem.parent.mkdir()
    copy, why = first_rows.head(DataSource(path=str(data), format="chat"), 48, stem, images=True)
    assert copy is not None and "image paths made absolute" in why
    copied = copy.read_text().splitlines()
    assert len(copied) == 48 and copied[4] == '{"messages": ['  # line 5 of the original, as it was
    parsed = [json.loads(line) for number, line in enumerate(copied) if number != 4]
    refs = [row["messages"][0]["content"][0] for row in parsed]
    assert refs[0]["image"] == str(folder / "images" / "0.png")
    assert refs[1]["image_url"]["url"] == str(folder / "images" / "1.png")
    assert refs[2]["image"] == "https://example.com/a.png" and refs[3]["image"] == str(folder / "images" / "3.png")
    assert all(Path(ref["image"]).is_file() for ref in refs[4:])
    # a text model's copy is the original's lines, untouched
    text_copy, _ = first_rows.head(DataSource(path=str(data), format="chat"), 48, tmp_path / "copy" / "text")
    assert text_copy.read_text().splitlines() == data.read_text().splitlines()[:48]


def test_a_saved_datasets_copy_keeps_its_images_and_writes_nothing_beside_the_source(tmp_path):
    """A ``save_to_disk`` folder reads relative image paths from its own folder: its copy's paths are made absolute,
    LLaMA-Factory's ``images`` column included, without a cache file written into the source's folder."""
    folder = tmp_path / "saved"
    rows = [{"conversations": [{"from": "human", "value": "<image>Which colour?"}, {"from": "gpt", "value": "Red"}],
             "pictures": [_square(folder / "images" / f"{i}.png", "red").relative_to(folder).as_posix()]}
            for i in range(20)]
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    before = sorted(p.name for p in folder.iterdir())
    layout = SHAREGPT
    source = DataSource(path=str(folder), format="chat", **layout)
    copy, _ = first_rows.head(source, 8, tmp_path / "copy" / "train.0", images=True)
    assert sorted(p.name for p in folder.iterdir()) == before
    copied = datasets.load_from_disk(str(copy))
    assert len(copied) == 8 and copied[0]["pictures"] == [str(folder / "images" / "0.png")]
    assert [row["images"] for row in _read(copy, **layout)][:2] == [[str(folder / "images" / f"{i}.png")]
                                                                     for i in range(2)]


# --- the shipped assets ---------------------------------------------------------------------------------------------


def test_the_vision_assets_are_package_data_and_what_the_script_writes(tmp_path):
    """Each vision family's asset is found through importlib.resources (``tiny_model.asset``), every file of it is
    carried by pyproject's package-data globs (an installed wheel has it), and scripts/make_tiny_model.py writes the
    same bytes (but the transformers version it records)."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["ft"]
    spec = importlib.util.spec_from_file_location("make_tiny_model", ROOT / "scripts" / "make_tiny_model.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.VISION_ASSETS.keys() == tiny_model.VISION_FAMILIES.keys()
    for family, sizes in tiny_model.VISION_FAMILIES.items():
        folder = tiny_model.asset(family)
        assert folder.name == sizes.folder
        for file in folder.iterdir():
            assert any(fnmatch.fnmatch(f"smoke/assets/{folder.name}/{file.name}", glob) for glob in globs), file
        assert AutoConfig.from_pretrained(folder).model_type == family
        assert _tokens_of_an_image(folder) <= 16
        script.write_vision_family(family, script.VISION_ASSETS[family], tmp_path / family)
        written = {p.name: p.read_text() for p in (tmp_path / family).iterdir()}
        shipped = {p.name: p.read_text() for p in folder.iterdir()}
        version = re.compile(r'"transformers_version": "[^"]*"')
        assert {k: version.sub("", v) for k, v in written.items()} == {k: version.sub("", v) for k, v in
                                                                        shipped.items()}, family


# --- smoke runs -----------------------------------------------------------------------------------------------------


@pytest.fixture
def llava_64(tmp_path) -> Path:
    """A random LLaVA whose config and processor are readable (tests/test_vision.build_tiny_llava's) and whose images
    are 64 tokens (64-pixel images in 8-pixel patches): more than a smoke run should spend on one."""
    folder = build_tiny_llava(tmp_path / "llava")
    config = json.loads((folder / "config.json").read_text())
    config["vision_config"]["image_size"] = 64
    (folder / "config.json").write_text(json.dumps(config))
    processor = json.loads((folder / "processor_config.json").read_text())
    processor["image_processor"].update(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64})
    (folder / "processor_config.json").write_text(json.dumps(processor))
    assert _tokens_of_an_image(folder) == 64
    return folder


@pytest.mark.slow
def test_a_readable_vision_model_is_shrunk_with_its_processor_and_trains_on_its_first_rows_with_their_images(
        tmp_path, llava_64, write_recipe):
    """The real config and processor are read: the config shrunk (its vision tower to 16-pixel images), the processor
    re-sized to match (4 tokens an image), the LoRA regex checked against it; the data's first 48 rows copied with
    their images found where the original's are."""
    data = _jsonl(tmp_path / "set" / "train.jsonl", _pictures(tmp_path / "set", 60))
    beside = sorted(p.name for p in data.parent.iterdir())
    recipe = {"method": "sft", "model": {"name": str(llava_64), "dtype": "bfloat16"},
              "adapter": {"kind": "lora", "r": 4, "target_modules": LANGUAGE_MODEL},
              "data": {"train": [{"path": str(data), "format": "chat"}], "max_length": 128},
              "train": {"output_dir": str(tmp_path / "run"), "max_steps": 100, "per_device_train_batch_size": 8,
                        "bf16": True, "report_to": "none"}}
    result = _smoke(write_recipe(recipe), tmp_path / "run")
    smoke_dir = tmp_path / "run-smoke"
    described = _smoked(result, smoke_dir)
    model = described["model"]
    assert (model["family"], model["modality"], model["fallback"]) == ("llava", "vision", False)
    assert model["config"].startswith(f"the real one ({llava_64})") and "vision_config.image_size 64 -> 16" in \
        model["config"]
    assert model["processor"].startswith(f"the real one ({llava_64}), its images re-sized")
    assert _tokens_of_an_image(smoke_dir / "final") == 4 and _tokens_of_an_image(llava_64) == 64
    copy = Path(_changes(described)["data.train.0.path"]["now"])
    first = json.loads(copy.read_text().splitlines()[0])
    assert first["messages"][0]["content"][0]["image"] == str(data.parent / "images" / "0.png")
    assert sorted(p.name for p in data.parent.iterdir()) == beside and not (tmp_path / "run").exists()
    adapter = json.loads((smoke_dir / "final" / "adapter_config.json").read_text())
    assert adapter["target_modules"] == LANGUAGE_MODEL


@pytest.mark.slow
def test_a_hub_vision_model_offline_stands_in_by_modality_with_generated_pictures_in_the_sources_layout(
        tmp_path, write_recipe):
    """Gemma 3 with model.modality: vision, offline, on a hub dataset laid out the LLaMA-Factory way: the shipped tiny
    Gemma 3 (image-text-to-text) and chats about generated pictures in that layout."""
    recipe = {"method": "sft", "model": {"name": "google/gemma-3-4b-it", "modality": "vision"},
              "adapter": {"kind": "lora", "r": 4, "target_modules": LANGUAGE_MODEL},
              "data": {"train": [{"path": "someone/sharegpt-vision", "format": "chat", **SHAREGPT}],
                       "max_length": 256},
              "train": {"output_dir": str(tmp_path / "run"), "max_steps": 100, "report_to": "none"}}
    result = _smoke(write_recipe(recipe), tmp_path / "run")
    smoke_dir = tmp_path / "run-smoke"
    described = _smoked(result, smoke_dir)
    assert (described["model"]["family"], described["model"]["model_type"]) == ("gemma3", "gemma3")
    assert described["model"]["config"].startswith("shipped assets/tiny-gemma3")
    generated = Path(_changes(described)["data.train.0.path"]["now"])
    row = json.loads(generated.read_text().splitlines()[0])
    assert row["conversations"][0]["value"].startswith("<image>")
    assert (generated.parent / row["pictures"][0]).is_file()
    assert "generated `chat` rows with images" in result.stderr
    saved = yaml.safe_load((smoke_dir / "recipe.yaml").read_text())
    assert saved["model"]["modality"] == "vision"
    assert type(AutoProcessor.from_pretrained(smoke_dir / "final")).__name__ == "Gemma3Processor"


@pytest.mark.slow
def test_the_smolvlm_cloud_recipe_passes_its_smoke_test_offline(tmp_path):
    """recipes/smolvlm-lora.yaml as shipped: SmolVLM's config cannot be read offline, its name says it is Idefics3,
    the shipped tiny SmolVLM stands in; the colour pictures' first rows train and evaluate with their images."""
    result = _smoke(ROOT / "recipes" / "smolvlm-lora.yaml", tmp_path / "run")
    smoke_dir = tmp_path / "run-smoke"
    described = _smoked(result, smoke_dir)
    model = described["model"]
    assert (model["family"], model["model_type"], model["modality"]) == ("idefics3", "idefics3", "vision")
    assert model["config"].startswith("shipped assets/tiny-smolvlm") and model["parameters"] < 1_000_000
    changes = _changes(described)
    assert {"model.name", "model.dtype", "train.bf16", "data.train.0.path", "data.eval.0.path"} <= set(changes)
    copy = Path(changes["data.train.0.path"]["now"])
    assert "image paths made absolute" in changes["data.train.0.path"]["why"]
    image = json.loads(copy.read_text().splitlines()[0])["messages"][0]["content"][0]["image"]
    assert Path(image).is_absolute() and Path(image).is_file()
    history = json.loads((smoke_dir / "log_history.json").read_text())
    assert any("eval_loss" in entry for entry in history)
    assert "smoke test passed" in result.stderr and not (tmp_path / "run").exists()
