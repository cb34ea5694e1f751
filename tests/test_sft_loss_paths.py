"""FtSFTTrainer's two loss paths agree: on a CPU (and whenever the logits are wanted) ft takes the model's own
loss over full logits; elsewhere TRL's fused LM head. Same loss, same gradients, same logged metrics."""

from __future__ import annotations

import pytest
import torch
import yaml
from conftest import built_trainer, tiny_sft
from trl import SFTTrainer


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loss-paths")
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(tiny_sft(tmp / "out", gradient_accumulation_steps=2)))
    return built_trainer(path)[0]


def _batch(trainer):
    return trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))


def _loss_and_grads(compute, trainer, batch, num_items):
    trainer.model.zero_grad()
    trainer._metrics["train"].clear()
    loss = compute(trainer, trainer.model, dict(batch), num_items_in_batch=num_items)
    loss.backward()
    grads = [p.grad.detach().clone() for p in trainer.model.parameters() if p.grad is not None]
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k != "num_tokens"}
    return loss.detach(), grads, metrics


def test_cpu_training_takes_the_model_loss_path(trainer):
    assert trainer._wants_full_logits(return_outputs=False)


def test_model_loss_matches_trls_fused_loss(trainer):
    trainer.model.train()
    batch = _batch(trainer)
    # as under gradient accumulation: the count covers more targets than this micro-batch holds
    num_items = torch.tensor(int((batch["labels"][:, 1:] != -100).sum()) * 2)
    ours = _loss_and_grads(type(trainer).compute_loss, trainer, batch, num_items)
    trls = _loss_and_grads(SFTTrainer.compute_loss, trainer, batch, num_items)
    assert ours[0] == pytest.approx(float(trls[0]), rel=1e-5)
    assert len(ours[1]) == len(trls[1]) > 0
    for mine, theirs in zip(ours[1], trls[1], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)
    assert set(ours[2]) == {"entropy", "mean_token_accuracy"} == set(trls[2])
    for key in ours[2]:
        assert ours[2][key] == pytest.approx(trls[2][key], rel=1e-4, abs=1e-6)


def test_evaluation_with_logits_takes_one_forward(trainer):
    trainer.model.eval()
    batch = _batch(trainer)
    calls = []
    hook = trainer.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        loss, logits, labels = trainer.prediction_step(trainer.model, batch, prediction_loss_only=False)
    finally:
        hook.remove()
        trainer.model.train()
    assert len(calls) == 1  # TRL's path runs the fused forward, then a second one for the logits
    assert logits.shape[:2] == labels.shape and torch.isfinite(loss)


def test_metrics_score_only_targeted_positions_in_chunks_without_changing_them():
    from ft.trainers.token_metrics import scored_sums

    logits, targets = torch.randn(3, 7, 11), torch.randint(0, 11, (3, 7))
    position = torch.arange(21).reshape(3, 7)
    sparse = position % 3 == 0  # a prompt-heavy batch: a third of the positions have a target, 1-2 in every 4
    dense = ~sparse  # mostly targeted
    log_probs = torch.log_softmax(logits, dim=-1)
    for mask in (sparse, dense):
        entropy = (-(log_probs.exp() * log_probs).sum(-1))[mask].sum()
        correct = (logits.argmax(-1) == targets)[mask].sum()
        poisoned = logits.clone()
        poisoned[~mask] = float("nan")  # a position without a target must not reach picked sums
        # the accelerator way (mask multiplied in); the CPU way, which gathers the targeted rows alone (so a
        # position without a target never reaches its sums), also from a non-contiguous view (the shifted logits)
        wide = torch.cat([poisoned, torch.zeros(3, 1, 11)], dim=1)[:, :-1]
        cases = [(logits, False), (logits, True), (poisoned, True), (wide, True)]
        for scored, pick in cases:
            for elements in (2**25, 4 * 11):  # one chunk; 4 positions per chunk, 6 chunks
                got_entropy, got_correct = scored_sums(scored, targets, mask, elements=elements, pick=pick)
                assert torch.allclose(got_entropy, entropy)
                assert int(got_correct) == int(correct)
