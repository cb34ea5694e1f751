"""Data preparation, measured side by side in one run (CPU, single process):

1. tokens/s of ft's SFT preprocessing (read → check rows → tokenize with masks → length column → write)
   against a raw batched tokenizer call on the same texts (target ≥ 0.8×);
2. masking a 50-turn chat (ft's linear mask) against plain tokenization of it with
   ``apply_chat_template(tokenize=True)`` (target ≤ 2×);
3. the non-pad fraction of training batches under random, group_by_length, batch_rebalance (with gradient
   accumulation, so there is something to balance) and packing, on a long-tailed length distribution, read
   from the batches of ft's real train dataloader (targets: packing ≥ 0.99, group_by_length ≥ 0.85).

    python benchmarks/preprocess.py [--rows 20000]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets" / "tiny-llama"
WORDS = ("the model learns to add numbers and answer questions about short stories while the loss falls "
         "every step of training on a small machine").split()


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def long_tailed_lengths(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [max(4, min(480, int(rng.lognormvariate(3.6, 0.8)))) for _ in range(n)]


def write_text_rows(path: Path, lengths: list[int], seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(n)) for n in lengths]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return texts


def recipe_file(tmp: Path, data_path: Path, **train) -> Path:
    recipe = {"method": "sft", "model": {"name": str(ASSETS), "init": "random"},
              "data": {"train": [{"path": str(data_path), "format": "text"}], "max_length": 512,
                       "prepared_path": str(tmp / "prepared")},
              "train": {"output_dir": str(tmp / "out"), "per_device_train_batch_size": 8, **train}}
    path = tmp / f"recipe-{len(list(tmp.glob('recipe-*')))}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def throughput(tmp: Path, rows: int) -> None:
    from ft import data
    from ft.model import loading
    from ft.recipe import load_recipe

    texts = write_text_rows(tmp / "text.jsonl", long_tailed_lengths(rows))
    recipe = load_recipe(recipe_file(tmp, tmp / "text.jsonl")).recipe
    tokenizer = loading.load_tokenizer(recipe.model)

    def raw():
        return [ids for i in range(0, len(texts), 1000) for ids in tokenizer(texts[i:i + 1000])["input_ids"]]

    def ft_preprocess():
        import shutil

        import datasets

        datasets.disable_caching()  # every repeat tokenizes for real (no datasets cache hit)
        shutil.rmtree(tmp / "prepared", ignore_errors=True)
        return data.prepare_data(recipe, tokenizer, None, lambda _: None)  # text rows: no chat template

    tokens = sum(len(ids) for ids in raw())
    raw_s, ft_s = best_of(raw), best_of(ft_preprocess)
    print(f"1. {rows} text rows, {tokens} tokens")
    print(f"   raw batched tokenizer: {tokens / raw_s:12,.0f} tokens/s")
    print(f"   ft preprocess:         {tokens / ft_s:12,.0f} tokens/s   ratio {raw_s / ft_s:.2f} (target ≥ 0.80)")


def masking() -> None:
    from transformers import AutoTokenizer

    from ft.data.tokenize import TokenizeSettings, tokenize_batch

    tokenizer = AutoTokenizer.from_pretrained(ASSETS)
    chat = [{"role": "system", "content": "You are a calculator."}]
    for i in range(50):
        chat += [{"role": "user", "content": f"What is {i} + {i * 3}?"},
                 {"role": "assistant", "content": f"It is {i * 4}, since {i} plus {i * 3} makes {i * 4}."}]
    settings = TokenizeSettings(template=tokenizer.chat_template, max_length=100_000, truncation="truncate",
                                train_on="assistant")
    batch = [chat] * 20
    plain = best_of(lambda: [tokenizer.apply_chat_template(c, tokenize=True) for c in batch], 5)
    masked = best_of(lambda: tokenize_batch({"messages": batch}, tokenizer, settings), 5)
    print(f"2. 50-turn chat: plain tokenization {plain / 20 * 1e3:.2f} ms, ft masked {masked / 20 * 1e3:.2f} ms, "
          f"ratio {masked / plain:.2f} (target ≤ 2.00)")


def nonpad_fraction(tmp: Path) -> None:
    from ft.machine import hardware
    from ft.recipe import load_recipe
    from ft.run.train import prepare_trainer
    from ft.trainers.hooks import Hooks

    write_text_rows(tmp / "tail.jsonl", long_tailed_lengths(4000, seed=1), seed=1)
    print("3. non-pad fraction of train batches (batch 8, gradient accumulation 4, long-tailed lengths):")
    for name, settings in {"random": {}, "group_by_length": {"train_sampling_strategy": "group_by_length"},
                           "batch_rebalance": {"train_sampling_strategy": "batch_rebalance"},
                           "packing": {"packing": True}}.items():
        packing = settings.pop("packing", False)
        path = recipe_file(tmp, tmp / "tail.jsonl", gradient_accumulation_steps=4, **settings)
        recipe = load_recipe(path, [f"data.packing={str(packing).lower()}"]).recipe
        trainer, _ = prepare_trainer(recipe, Hooks(), hardware.probe(), say=lambda _: None)
        tokenizer = trainer.processing_class
        real = padded = 0
        for batch in trainer.get_train_dataloader():  # the pad token never occurs in the data itself
            padded += batch["input_ids"].numel()
            real += int((batch["input_ids"] != tokenizer.pad_token_id).sum())
        target = {"packing": " (target ≥ 0.99)", "group_by_length": " (target ≥ 0.85)"}.get(name, "")
        print(f"   {name:16} {real / padded:.3f}{target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    rows = parser.parse_args().rows
    with tempfile.TemporaryDirectory() as tmp:
        throughput(Path(tmp), rows)
        masking()
        nonpad_fraction(Path(tmp))


if __name__ == "__main__":
    main()
