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


TOL = 1e-4  # per-token loss, nats: packed and unpacked measured within 5e-6 of each other


def _row_losses(model, batch, **changes) -> list[tuple[tuple[int, ...], torch.Tensor, bool]]:
    """(token ids, cross-entropy of each trained token, whether the row opens its sequence) of every row of one
    collated batch, fed to ``model`` with ``changes`` to the batch's inputs. A packed (padding-free) batch is one
    sequence whose rows start where TRL's position ids restart at 0; an unpacked one holds a row per sequence, its
    padding after the attention mask's end."""
    labels = batch["labels"]
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    with torch.no_grad():
        logits = model(**{**inputs, **changes}, use_cache=False).logits.float()
    # token j's loss is the prediction of labels[j] from position j - 1
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:].clamp(min=0),
                                               reduction="none")
    rows = []
    for b in range(len(labels)):
        if "position_ids" in batch:
            starts = (batch["position_ids"][b] == 0).nonzero().flatten().tolist()
        else:
            starts = [0]
        ends = [*starts[1:], int(batch["attention_mask"][b].sum()) if "attention_mask" in batch else labels.size(1)]
        for start, end in zip(starts, ends, strict=True):
            trained = labels[b, start + 1:end] != -100
            rows.append((tuple(batch["input_ids"][b, start:end].tolist()), losses[b, start:end - 1][trained],
                         start == 0))
    return rows


def test_packed_rows_score_token_for_token_as_the_same_rows_unpacked(write_recipe, tmp_path, sft_model):
    """A trained model (``sft_model``: its loss depends on what came before, where a random model's is about ln V
    whatever the context) scores every trained token of 64 uneven chats, through the trainer's own dataset, collator
    and model as training feeds them. Packed, several rows share a sequence and each attends only within itself
    (TRL's position ids, restarting at each row, read by transformers' attention masks): each row's tokens score as
    they do unpacked. The same packed batches with the positions running on across rows, or with one causal mask
    over the whole sequence, let a row see the rows before it: every such row scores differently."""
    _uneven_chats(tmp_path / "train.jsonl")
    fed = {}
    for packing in (False, True):
        recipe = tiny_sft(tmp_path / f"out-{packing}", per_device_train_batch_size=4, seed=0)
        recipe["model"] = {"name": str(sft_model), "init": "pretrained"}
        recipe["data"].update(train=[{"path": str(tmp_path / "train.jsonl"), "format": "chat"}], eval=[],
                              max_length=256, packing=packing)
        trainer, _ = built_trainer(write_recipe(recipe, name=f"packing-{packing}.yaml"))
        fed[packing] = trainer.model.eval(), list(trainer.get_train_dataloader())
    model, batches = fed[False]
    plain = {ids: losses for batch in batches for ids, losses, _ in _row_losses(model, batch)}
    assert len(plain) == 64 and sum(len(losses) for losses in plain.values()) > 64 * 20

    model, batches = fed[True]
    assert all(batch["input_ids"].size(0) == 1 for batch in batches)  # padding-free: a batch is one sequence
    packed = [row for batch in batches for row in _row_losses(model, batch)]
    assert len(packed) == 64 and {ids for ids, _, _ in packed} == plain.keys()
    assert sum(first for _, _, first in packed) == len(batches) < 10  # rows share sequences: packing happened
    for ids, losses, _ in packed:
        torch.testing.assert_close(losses, plain[ids], rtol=0, atol=TOL)

    for name, change in (("position_ids", lambda batch: torch.arange(batch["input_ids"].size(1))[None]),
                         ("attention_mask", lambda batch: torch.ones_like(batch["input_ids"]))):
        for batch in batches:
            for ids, losses, first in _row_losses(model, batch, **{name: change(batch)}):
                moved = float((losses - plain[ids]).abs().max())
                assert (moved <= TOL) == first, (name, moved, first)  # only the row that opens a sequence is unmoved
