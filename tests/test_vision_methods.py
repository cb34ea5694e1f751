"""Preference and RL methods on a vision-language model, offline: DPO, KTO, GRPO and RLOO on rows whose prompts hold
images (OpenAI-style content parts, or an ``images`` column with ``<image>`` placeholders), on a tiny random LLaVA
built from the shipped tiny tokenizer. The images must reach the model: runs whose rows differ only in the pixels of
their images log different figures at their first step, and runs whose images have the same pixels under other
paths and the other layout log the same ones; the rows hold paths and are read a row at a time. A missing image is
a bad row named by file and line; what TRL cannot train on images is refused before the model loads, saying why.
Real TRL trainers and transformers models throughout."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import built_trainer, run_ft
from PIL import Image
from test_vision import COLOURS, _jsonl, _square, build_tiny_llava
from transformers import AutoProcessor

import ft.run.train
from ft import data
from ft.data.formats import normalize
from ft.data.rows import BadRows, DataError
from ft.data.sources import read_source
from ft.model import loading
from ft.recipe import RecipeError, load_recipe
from ft.recipe.data_section import DataSource
from ft.recipe.methods import METHODS
from ft.recipe.rules import check_modality

QUESTION = "What colour is the square?"
NAMES = list(COLOURS)


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


# --- rows --------------------------------------------------------------------------------------------------------


def _squares(folder: Path, count: int, shift: int = 0) -> list[str]:
    """``count`` pictures in ``folder``, the i-th a square of colour ``i + shift`` (of four); their names relative to
    the data file (one folder up)."""
    return [_square(folder / f"{i}.png", NAMES[(i + shift) % 4]).relative_to(folder.parent).as_posix()
            for i in range(count)]


def _pair(image: str, i: int, listed: bool = False) -> dict:
    """A preference row about one picture: its prompt's image as a content part, or (``listed``) as an ``images``
    column filling an ``<image>`` placeholder. The answers name the colour the row's index gives, whatever the
    picture shows, so that two runs on other pictures compare the same texts."""
    chosen, rejected = NAMES[i % 4].capitalize(), NAMES[(i + 1) % 4].capitalize()
    prompt = ([{"role": "user", "content": f"<image>{QUESTION}"}] if listed else
              [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": QUESTION}]}])
    return {"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}], **({"images": [image]} if listed else {})}


def _asked(image: str, i: int, listed: bool = False) -> dict:
    """A prompt row (GRPO, RLOO) about one picture, with its expected answer."""
    row = _pair(image, i, listed)
    return {"prompt": row["prompt"], "answer": NAMES[i % 4].capitalize(),
            **({"images": row["images"]} if listed else {})}


def _recipe(tmp_path: Path, model: Path, method: str, rows: list[dict], name: str = "run", **sections) -> Path:
    """A recipe training ``model`` (from its config, seed 0) on ``rows`` for 2 steps of 4 rows, every step logged;
    the data file in ``tmp_path``/data, where the rows' relative image paths are read from."""
    fmt = "prompt" if METHODS[method].generates else "preference"
    recipe = {"method": method, "model": {"name": str(model), "init": "random"},
              "data": {"train": [{"path": str(_jsonl(tmp_path / "data" / f"{name}.jsonl", rows)), "format": fmt}],
                       "max_length": 64},
              "optimizer": {"lr": 1e-2},
              "train": {"output_dir": str(tmp_path / name), "max_steps": 2, "per_device_train_batch_size": 4,
                        "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0}}
    for key, value in sections.items():
        recipe[key] = {**recipe.get(key, {}), **value}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _train(path: Path) -> list[dict]:
    """``ft train``'s run (in this process), its log history."""
    result = ft.run.train.train(load_recipe(path), resume="never", say=lambda _: None)
    assert result.summary["status"] == "completed", result.summary
    return json.loads((Path(load_recipe(path).recipe.train_args["output_dir"]) / "log_history.json").read_text())


def _first(log: list[dict], key: str) -> float:
    return next(entry[key] for entry in log if key in entry)


def _copies(tmp_path: Path, images: list[str], folder: str) -> list[str]:
    """The same pictures under other names, in another folder (same pixels, other paths)."""
    copies = []
    for i, image in enumerate(images):
        target = tmp_path / "data" / folder / f"copy-{i}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "data" / image, target)
        copies.append(target.relative_to(tmp_path / "data").as_posix())
    return copies


# --- DPO and KTO -------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_dpo_trains_on_prompt_images_and_its_figures_follow_the_pixels(tmp_path, tiny_llava):
    """The trainer's rows hold the images' paths, and yield them decoded and sized (data.image) as TRL's vision
    collator takes them; its batches hold their pixels, the prompt's and chosen/rejected's together. DPO's log-
    probabilities at the first step are the same for the same pixels under other paths in the other layout, and
    differ when the pictures differ: the images went through the model."""
    pics = _squares(tmp_path / "data" / "pics", 8)
    path = _recipe(tmp_path, tiny_llava, "dpo", [_pair(image, i) for i, image in enumerate(pics)],
                   data={"image": {"size": [16, 16]}})
    trainer, _ = built_trainer(path)
    stored = trainer.train_dataset.with_format(None)[0]["images"]
    assert stored == [str(tmp_path / "data" / pics[0])]  # a path, not pixels
    row = trainer.train_dataset[0]
    assert isinstance(row["images"][0], Image.Image) and row["images"][0].size == (16, 16)  # 24x24 on disk
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    processor = AutoProcessor.from_pretrained(tiny_llava)
    own = processor.image_processor([row["images"][0]], return_tensors="pt")["pixel_values"][0]
    assert batch["pixel_values"].shape == (4, 3, 16, 16)  # two rows, each prompt under chosen and under rejected
    assert np.allclose(batch["pixel_values"][0].numpy(), own.numpy())
    assert (batch["input_ids"] == processor.image_token_id).sum(1).tolist() == [4] * 4

    first = _train(path)
    same = _train(_recipe(tmp_path, tiny_llava, "dpo", [_pair(image, i, listed=True) for i, image in
                                                        enumerate(_copies(tmp_path, pics, "copies"))],
                          name="same", data={"image": {"size": [16, 16]}}))
    other = _train(_recipe(tmp_path, tiny_llava, "dpo", [_pair(image, i) for i, image in
                                                         enumerate(_squares(tmp_path / "data" / "other", 8, 2))],
                           name="other", data={"image": {"size": [16, 16]}}))
    assert len([entry for entry in first if "loss" in entry]) == 2
    for key in ("logps/chosen", "logps/rejected"):
        assert _first(same, key) == _first(first, key)
        assert _first(other, key) != _first(first, key), key


@pytest.mark.slow
def test_kto_unpairs_rows_with_images_and_trains_on_them(tmp_path, tiny_llava):
    """KTO unpairs the pairs first (their images' paths copied to both halves, read as rows are taken) and trains
    through TRL's vision collator: its batches hold the images' pixels."""
    pics = _squares(tmp_path / "data" / "pics", 8)
    path = _recipe(tmp_path, tiny_llava, "kto", [_pair(image, i, listed=i % 2 == 1) for i, image in enumerate(pics)])
    trainer, _ = built_trainer(path)
    stored = trainer.train_dataset.with_format(None)
    assert len(stored) == 16 and sorted(stored["label"]) == [False] * 8 + [True] * 8
    assert all(len(images) == 1 and images[0].startswith(str(tmp_path)) for images in stored["images"])
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    assert batch["pixel_values"].shape[0] >= 4 and batch["pixel_values"].abs().sum() > 0
    log = _train(path)
    assert len([entry for entry in log if "loss" in entry]) == 2


# --- GRPO and RLOO -----------------------------------------------------------------------------------------------


REWARDS = """
    def width(prompts, completions, images=None, **kwargs):
        # the width of each completion's prompt image, as the reward functions receive it
        return [float(row[0].size[0]) for row in images]
"""


def _rewards_module(tmp_path: Path, name: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(REWARDS))


@pytest.mark.slow
def test_grpo_generates_from_prompt_images_and_its_rewards_receive_them(tmp_path, tiny_llava):
    """GRPO puts each prompt's image into the prompt it generates from and scores: a reward function receives the
    images as ft sized them (data.image), and the policy's entropy at the first step follows the pixels (the same
    for the same pixels in the other layout, another for other pictures)."""
    _rewards_module(tmp_path, "grpo_image_rewards")
    grpo = {"num_generations": 4, "max_completion_length": 4, "rewards": [{"fn": "grpo_image_rewards:width"}]}
    sized = {"image": {"size": [12, 16]}}
    pics = _squares(tmp_path / "data" / "pics", 8)
    first = _train(_recipe(tmp_path, tiny_llava, "grpo", [_asked(image, i) for i, image in enumerate(pics)],
                           grpo=grpo, data=sized))
    assert [entry["rewards/width/mean"] for entry in first if "rewards/width/mean" in entry] == [12.0, 12.0]
    same = _train(_recipe(tmp_path, tiny_llava, "grpo", [_asked(image, i, listed=True) for i, image in
                                                         enumerate(_copies(tmp_path, pics, "copies"))],
                          name="same", grpo=grpo, data=sized))
    other = _train(_recipe(tmp_path, tiny_llava, "grpo", [_asked(image, i) for i, image in
                                                          enumerate(_squares(tmp_path / "data" / "other", 8, 2))],
                           name="other", grpo=grpo, data=sized))
    assert _first(same, "entropy") == _first(first, "entropy")
    assert _first(other, "entropy") != _first(first, "entropy")


@pytest.mark.slow
def test_grpo_with_images_skips_the_memory_preflight_saying_why(tmp_path, tiny_llava):
    """The memory preflight rehearses a policy batch of token ids, which would leave a prompt's images out (and read
    its text as an image path through the processor): with prompt images it is skipped, said, and training runs."""
    _rewards_module(tmp_path, "grpo_preflight_rewards")
    grpo = {"num_generations": 4, "max_completion_length": 4, "rewards": [{"fn": "grpo_preflight_rewards:width"}]}
    pics = _squares(tmp_path / "data" / "pics", 4)
    path = _recipe(tmp_path, tiny_llava, "grpo", [_asked(image, i) for i, image in enumerate(pics)], grpo=grpo,
                   train={"preflight": True, "max_steps": 1})
    said: list[str] = []
    result = ft.run.train.train(load_recipe(path), resume="never", say=said.append)
    assert result.summary["status"] == "completed", result.summary
    assert any(line.startswith("preflight: memory: skipped (the prompts hold images") for line in said), said


def test_grpo_refuses_prompts_with_and_without_images_together(tmp_path, tiny_llava):
    """TRL's GRPOTrainer fails on a batch where one prompt has images and another none; ft names the split instead."""
    _rewards_module(tmp_path, "grpo_mixed_rewards")
    pics = _squares(tmp_path / "data" / "pics", 4)
    rows = [_asked(image, i) if i % 2 else {"prompt": [{"role": "user", "content": "Say a colour."}], "answer": "Red"}
            for i, image in enumerate(pics)]
    path = _recipe(tmp_path, tiny_llava, "grpo", rows, grpo={"num_generations": 4, "max_completion_length": 4,
                                                            "rewards": [{"fn": "grpo_mixed_rewards:width"}]})
    with pytest.raises(DataError, match=r"^data.train: 2 of the 4 prompts hold no image and the others hold images; "
                       r"TRL's GRPOTrainer cannot batch the two kinds together"):
        built_trainer(path)


@pytest.mark.slow
def test_rloo_trains_on_prompt_images(tmp_path, tiny_llava):
    _rewards_module(tmp_path, "rloo_image_rewards")
    rloo = {"num_generations": 4, "max_completion_length": 4, "rewards": [{"fn": "rloo_image_rewards:width"}]}
    pics = _squares(tmp_path / "data" / "pics", 8)
    log = _train(_recipe(tmp_path, tiny_llava, "rloo", [_asked(image, i, listed=True) for i, image in enumerate(pics)],
                         rloo=rloo))
    assert [entry["rewards/width/mean"] for entry in log if "rewards/width/mean" in entry] == [24.0, 24.0]


# --- bad rows ----------------------------------------------------------------------------------------------------


def _prepared(path: Path):
    recipe = load_recipe(path).recipe
    processor = loading.load_processing_class(recipe.model)
    return data.prepare_data(recipe, processor, data.chat_template_for(recipe, processor), lambda _: None)


def test_a_missing_image_in_a_preference_row_is_a_bad_row_named_by_file_and_line(tmp_path, tiny_llava):
    pics = _squares(tmp_path / "data" / "pics", 3)
    rows = [_pair(pics[0], 0), _pair("pics/gone.png", 1), _pair("pics/lost.png", 2, listed=True), _pair(pics[2], 3)]
    path = _recipe(tmp_path, tiny_llava, "dpo", rows)
    with pytest.raises(DataError) as caught:
        _prepared(path)
    message, where = str(caught.value), tmp_path / "data" / "run.jsonl"
    assert message.startswith(f"data.train.0: 2 bad rows in {where} (format `preference`):")
    gone = tmp_path / "data" / "pics" / "gone.png"
    assert (f"{where}:2: prompt[0].content[0]: 'pics/gone.png' does not exist (read as {gone}, relative to the data "
            "file's folder) (image_missing)") in message
    assert f"{where}:3: images[0]: 'pics/lost.png' does not exist" in message
    assert "data.on_bad_row: skip" in message
    skipped = _prepared(_recipe(tmp_path, tiny_llava, "dpo", rows, data={"on_bad_row": "skip"}))
    assert len(skipped.train) == 2 and skipped.stats["skipped_rows"] == {"data.train.0": {"image_missing": 2}}
    assert skipped.train["images"] == [[str(tmp_path / "data" / pics[0])], [str(tmp_path / "data" / pics[2])]]


def _normalized(path: Path, fmt: str, images: bool = True):
    source = DataSource(path=str(path), format=fmt)
    report = BadRows()
    raw = read_source(source, seed=0, on_bad_row="error", report=report, key="data.train.0")
    return normalize(raw, source, key="data.train.0", on_bad_row="error", report=report, images=images)


def test_images_go_in_a_conversational_prompt_once_each(tmp_path):
    """Both layouts give the same canonical rows (prompt parts, checked paths); an image in an answer, images beside
    a text prompt, placeholders that disagree with the list, and images for a text model are bad rows, each named."""
    red = _square(tmp_path / "pics" / "red.png", "red")
    parts, listed = _pair("pics/red.png", 0), _pair("pics/red.png", 0, listed=True)
    canonical = [_normalized(_jsonl(tmp_path / f"{name}.jsonl", [row]), "preference")[0]
                 for name, row in (("parts", parts), ("listed", listed))]
    assert canonical[0] == canonical[1]
    assert canonical[0]["prompt"] == [{"role": "user", "content": [{"type": "image", "text": None},
                                                                   {"type": "text", "text": QUESTION}]}]
    assert canonical[0]["images"] == [str(red)]
    prompt_row = _normalized(_jsonl(tmp_path / "prompts.jsonl", [_asked("pics/red.png", 0, listed=True)]), "prompt")
    assert prompt_row.column_names == ["prompt", "answer", "images", "__ft_row"]
    assert prompt_row[0]["images"] == [str(red)]

    in_answer = {**parts, "chosen": [{"role": "assistant", "content": [{"type": "image", "image": "pics/red.png"}]}]}
    text_prompt = {"prompt": "<image>What colour?", "chosen": "Red", "rejected": "Blue", "images": ["pics/red.png"]}
    two = {**listed, "images": ["pics/red.png", "pics/red.png"]}
    path = _jsonl(tmp_path / "bad.jsonl", [in_answer, text_prompt, two])
    with pytest.raises(DataError) as caught:
        _normalized(path, "preference")
    message = str(caught.value)
    assert (f"{path}:1: chosen[0].content[0]: an image in an answer: TRL's preference trainers read a row's images "
            "into its prompt only; move it to the prompt (image_place)") in message
    assert f"{path}:2: images: `images` lists images and the prompt is text;" in message
    assert "(image_place)" in message.splitlines()[2]
    assert f"{path}:3: images: the messages hold 1 <image> placeholder and `images` lists 2 images" in message

    text_model = _jsonl(tmp_path / "text.jsonl", [listed])
    with pytest.raises(DataError, match=r"text.jsonl:1: images: the row lists images under `images`: images need a "
                       r"vision-language model"):
        _normalized(text_model, "preference", images=False)


# --- what is refused, and why --------------------------------------------------------------------------------------


def test_the_method_table_says_which_methods_train_images_and_why_the_others_do_not():
    trained = [name for name, method in METHODS.items() if "vision" in method.modalities]
    assert trained == ["sft", "dpo", "grpo", "kto", "rloo"]
    assert {METHODS[name].model_class("vision") for name in trained} == {"AutoModelForImageTextToText"}
    for name, method in METHODS.items():
        assert ("vision" in method.modalities) != bool(method.cannot_train.get("vision")), name
    assert "trl.experimental.orpo" in METHODS["orpo"].cannot_train["vision"]


def test_ft_train_refuses_orpo_on_a_vision_model_naming_what_trl_lacks(tmp_path, tiny_llava):
    pics = _squares(tmp_path / "data" / "pics", 2)
    path = _recipe(tmp_path, tiny_llava, "orpo", [_pair(image, i) for i, image in enumerate(pics)])
    result = run_ft("train", str(path))
    assert result.returncode == 2, result.stderr[-2000:]
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith("name:"))
    assert (f"{path}:{line}: model.name: is a vision model (transformers has no text-only class for it), and method "
            "`orpo` trains text models (TRL's ORPOTrainer (trl.experimental.orpo, TRL 1.16) tokenizes text alone: "
            "it has no collator for images and reads no `images` column); name a text model, or use method `sft` or "
            "`dpo` or `grpo` or `kto` or `rloo`.") in " ".join(result.stderr.split())
    assert not (tmp_path / "run" / "final").exists()


def test_settings_trl_refuses_with_images_are_refused_by_their_keys(tmp_path, tiny_llava):
    rows = [_pair("pics/0.png", 0)]
    dpo = load_recipe(_recipe(tmp_path, tiny_llava, "dpo", rows, dpo={"ref_model": str(tiny_llava)},
                              train={"precompute_ref_log_probs": True, "truncation_mode": "keep_end",
                                     "pad_to_multiple_of": 8})).recipe
    found = {problem.path: problem.message for problem in check_modality(dpo, "vision")}
    assert list(found) == ["dpo.ref_model", "train.precompute_ref_log_probs", "train.truncation_mode",
                           "train.pad_to_multiple_of"]
    assert "Remove it: the reference is then a frozen copy of the start model" in found["dpo.ref_model"]
    assert check_modality(dpo, "text") == []  # a text model takes all of them
    grpo = load_recipe(_recipe(tmp_path, tiny_llava, "grpo", [_asked("pics/0.png", 0)], name="grpo",
                               grpo={"num_generations": 4, "rewards": [{"model": str(tiny_llava)}]})).recipe
    assert [(p.path, "reads text alone" in p.message) for p in check_modality(grpo, "vision")] == [
        ("grpo.rewards.0.model", True)]
    reward = load_recipe(_recipe(tmp_path, tiny_llava, "reward", rows, name="reward")).recipe
    (problem,) = check_modality(reward, "vision")
    assert problem.path == "model.name" and "sequence-classification class" in problem.message
    with pytest.raises(RecipeError):  # refused where the data is prepared, before any row is read
        _prepared(_recipe(tmp_path, tiny_llava, "reward", rows, name="reward"))
