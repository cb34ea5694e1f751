"""`ft merge` checks what it wrote on a few rows of the run's data: the merged model against the adapter on the
unmerged base (the fold itself), and for a QLoRA run against the model as trained, the 4-bit base + adapter, whose
answers a merge into the full-precision base can change (peft #2321)."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import run_ft, tiny_sft

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model


def _run(write_recipe, tmp_path, quantization: dict | None):
    recipe = tiny_sft(tmp_path / "run", max_steps=8)
    recipe["data"]["eval"] = []
    recipe["adapter"] = {"kind": "lora", "target_modules": "all-linear"}
    if quantization:
        recipe["model"]["quantization"] = quantization
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    merged = run_ft("merge", str(tmp_path / "run"), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr[-3000:]
    return [line for line in (merged.stdout + merged.stderr).splitlines()
            if line.startswith(("ft: merge check", "ft: warning"))]


def _figures(line: str) -> tuple[float, int, float]:
    share, positions, gap = re.search(r"same at ([\d.]+)% of (\d+) positions, largest logit gap ([\d.e+-]+)",
                                      line).groups()
    return float(share), int(positions), float(gap)


def _rows(tmp_path):
    """The four rows the check reads (the run's first training rows), rendered and tokenized as ft merge does."""
    from transformers import AutoTokenizer

    from ft.data.build import read_splits
    from ft.inference.merge import CHECK_ROWS, row_text
    from ft.recipe import load_recipe

    recipe = load_recipe(tmp_path / "run" / "recipe.yaml").recipe
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "final")
    train, _, _ = read_splits(recipe, lambda _: None)
    return recipe, [tokenizer(row_text(train[i], tokenizer), return_tensors="pt") for i in range(CHECK_ROWS)]


def _logits(model, rows) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model.eval()(**row).logits.float()[0] for row in rows])


def test_a_lora_merge_is_checked_against_the_unmerged_adapter(write_recipe, tmp_path):
    (line,) = _run(write_recipe, tmp_path, None)
    share, positions, gap = _figures(line)
    assert "4 rows of the run's data, against the adapter on the unmerged base" in line
    assert share == 100.0 and positions > 50 and gap < 1e-4


def test_a_qlora_merge_is_checked_against_the_4_bit_model_as_trained(write_recipe, tmp_path):
    """The second line's figures are the merged model's logits against the base loaded in 4 bits, as the run built it
    (its config and seed), plus the saved adapter, computed here independently."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ft.model import loading

    fold, trained = _run(write_recipe, tmp_path, {"bits": 4, "compute_dtype": "float32"})  # no warning line: 100%
    assert _figures(fold)[2] < 1e-4
    assert "against the model as trained (4-bit base + adapter)" in trained
    share, positions, gap = _figures(trained)
    recipe, rows = _rows(tmp_path)
    quantized = PeftModel.from_pretrained(loading.load_model(recipe, seed=recipe.train_args.get("seed", 42)),
                                          str(tmp_path / "run" / "final"))
    theirs = _logits(quantized, rows)
    ours = _logits(AutoModelForCausalLM.from_pretrained(tmp_path / "merged"), rows)
    assert positions == len(ours)
    assert gap == pytest.approx(float((ours - theirs).abs().max()), rel=0.05) and gap > 1e-3  # the 4-bit rounding
    assert share == pytest.approx(100 * float((ours.argmax(-1) == theirs.argmax(-1)).float().mean()), abs=0.1)


def test_a_qlora_merge_that_changes_the_answers_warns(write_recipe, tmp_path):
    """A base whose layers, not its (unquantized, tied) embeddings, decide the logits: initialized with
    ``initializer_range`` 1.0 instead of 0.02, the 4-bit rounding of its linear layers moves the top-1 token at most
    positions (measured: 38% the same), so merging into the full-precision base changes the answers; one step at a
    small learning rate keeps the adapter from mattering. The warning names the share and what to do instead."""
    import json
    import shutil

    from conftest import ASSETS

    base = tmp_path / "base"
    shutil.copytree(ASSETS, base)
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "initializer_range": 1.0}))
    recipe = tiny_sft(tmp_path / "run", max_steps=1)
    recipe["model"] = {"name": str(base), "init": "random", "quantization": {"bits": 4, "compute_dtype": "float32"}}
    recipe["data"]["eval"] = []
    recipe["adapter"] = {"kind": "lora", "target_modules": "all-linear"}
    recipe["optimizer"] = {"lr": 1.0e-4}
    assert run_ft("train", str(write_recipe(recipe))).returncode == 0
    merged = run_ft("merge", str(tmp_path / "run"), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr[-3000:]
    lines = (merged.stdout + merged.stderr).splitlines()
    (trained,) = [line for line in lines if "against the model as trained" in line]
    share = _figures(trained)[0]
    assert share < 90.0
    (warning,) = [line for line in lines if line.startswith("ft: warning")]
    assert f"differs from the model you trained at {100 - share:.1f}% of the positions" in warning
    assert "Serve the adapter on the base loaded in 4 bits" in warning
