"""What peers' users found broken after training, proven here: gradient accumulation that changes the loss
(transformers #34191, Axolotl #2262) and packing that changes it (TRL #1230, LLaMA-Factory #8277). Batch 8 ×
accumulation 4 must train as batch 32 does, on rows of very different lengths; rows packed into one sequence must
score as the same rows one per sequence."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import ASSETS, MEASURED_THREADS, built_trainer, final_weights, run_ft, tiny_sft
from test_preference import preference_recipe

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model


def _uneven_chats(path, rows: int = 64) -> None:
    """Chats whose answers run from 1 to about 60 tokens: the trained tokens per row differ by a factor of ~50, so a
    loss averaged per micro-batch (the bug) weighs a short row's tokens many times more than a long row's."""
    rng = random.Random(0)
    lines = []
    for i in range(rows):
        words = rng.choice([1, 2, 30, 45])
        answer = " ".join(str(rng.randint(0, 99)) for _ in range(words))
        lines.append(json.dumps({"messages": [{"role": "user", "content": f"Say {words} numbers, {i}."},
                                              {"role": "assistant", "content": answer}]}))
    path.write_text("\n".join(lines) + "\n")


def _losses(out) -> list[tuple[float, float]]:
    history = json.loads((out / "log_history.json").read_text())
    return [(row["loss"], row["grad_norm"]) for row in history if "loss" in row]


def _same_training(runs: dict, rel: float) -> None:
    (a, b) = runs.values()
    assert len(_losses(a)) == len(_losses(b)) == 3
    for (loss_a, norm_a), (loss_b, norm_b) in zip(_losses(a), _losses(b), strict=True):
        assert loss_a == pytest.approx(loss_b, rel=rel) and norm_a == pytest.approx(norm_b, rel=rel)
    ours, theirs = final_weights(a), final_weights(b)
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-5, msg=name)


def test_sft_batch_8_with_accumulation_4_trains_as_batch_32(write_recipe, tmp_path):
    _uneven_chats(tmp_path / "train.jsonl")
    runs = {}
    for batch, accumulation in ((32, 1), (8, 4)):
        out = tmp_path / f"b{batch}"
        recipe = tiny_sft(out, max_steps=3, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                          logging_steps=1, seed=0, eval_strategy="no")
        recipe["data"].update(train=[{"path": str(tmp_path / "train.jsonl"), "format": "chat"}], eval=[],
                              max_length=128)
        result = run_ft("train", str(write_recipe(recipe, name=f"b{batch}.yaml")), env=MEASURED_THREADS)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[batch] = out
    _same_training(runs, rel=1e-4)


def test_dpo_batch_8_with_accumulation_4_trains_as_batch_32(write_recipe, tmp_path):
    runs = {}
    for batch, accumulation in ((32, 1), (8, 4)):
        out = tmp_path / f"b{batch}"
        recipe = preference_recipe("dpo", ASSETS, out, init="random", train_fraction=0.1, max_steps=3,
                                   per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                                   eval_strategy="no")
        result = run_ft("train", str(write_recipe(recipe, name=f"b{batch}.yaml")), env=MEASURED_THREADS)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[batch] = out
    _same_training(runs, rel=1e-4)


def _token_losses(recipe_path) -> tuple[float, int, int]:
    """(sum of the cross-entropy over every trained token, trained tokens, sequences) of all training rows, through
    the trainer's own dataset, collator and model, as training feeds them."""
    trainer, _ = built_trainer(recipe_path)
    model = trainer.model.eval()
    total, count, sequences = 0.0, 0, 0
    with torch.no_grad():
        for batch in trainer.get_train_dataloader():
            labels = batch.pop("labels")
            logits = model(**batch).logits.float()
            targets = labels[:, 1:]
            mask = targets != -100
            loss = torch.nn.functional.cross_entropy(logits[:, :-1][mask], targets[mask], reduction="sum")
            total += float(loss)
            count += int(mask.sum())
            sequences += len(labels)
    return total, count, sequences


def test_packed_rows_score_as_the_same_rows_unpacked(write_recipe, tmp_path):
    """The same random-initialised model (seeded) scores every trained token of 64 uneven chats; packed, several rows
    share a sequence and attend only within themselves (TRL's position ids, read by transformers' attention masks).
    A packed sequence that let a row see the row before it would change the scores."""
    _uneven_chats(tmp_path / "train.jsonl")
    measured = {}
    for packing in (False, True):
        recipe = tiny_sft(tmp_path / f"out-{packing}", per_device_train_batch_size=4, seed=0)
        recipe["data"].update(train=[{"path": str(tmp_path / "train.jsonl"), "format": "chat"}], eval=[],
                              max_length=256, packing=packing)
        measured[packing] = _token_losses(write_recipe(recipe, name=f"packing-{packing}.yaml"))
    (plain, tokens, rows), (packed, packed_tokens, packed_rows) = measured[False], measured[True]
    assert packed_rows < rows  # several rows per sequence: packing happened
    assert packed_tokens == tokens
    assert packed == pytest.approx(plain, rel=1e-5)
