"""What ft's trainers do at every step beyond the model's forward and backward: the same numbers as transformers
computes, with less work per step."""

from __future__ import annotations

import yaml
from conftest import built_trainer, tiny_sft
from transformers import Trainer


def test_flops_estimate_is_transformers_own_with_the_parameters_counted_once(tmp_path, monkeypatch):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(tiny_sft(tmp_path / "out")))
    trainer = built_trainer(path)[0]
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    expected = Trainer.floating_point_ops(trainer, batch)  # transformers' estimate, recounting the parameters
    assert expected == 6 * batch["input_ids"].numel() * trainer.model.num_parameters(exclude_embeddings=True) > 0
    assert trainer.floating_point_ops(batch) == expected
    counted = []
    recount = trainer.model.num_parameters
    monkeypatch.setattr(trainer.model, "num_parameters", lambda *a, **k: counted.append(1) or recount(*a, **k))
    shorter = {**batch, "input_ids": batch["input_ids"][:, :5]}
    assert trainer.floating_point_ops(shorter) == expected * 5 // batch["input_ids"].size(1)
    assert trainer.floating_point_ops(batch) == expected
    assert counted == []  # the later steps reuse the first step's count
    assert trainer.floating_point_ops({"prompt": ["raw rows, as GRPO passes them"]}) == 0
