"""Peak memory of ft's data preparation for a vision-language model, at 1× and 4× the rows.

``ft preprocess`` on a tiny LLaVA's recipe (its processor: CLIP's image processor at 16x16, 4 tokens an image, the
shipped tiny-llama tokenizer plus `<image>`; no weights are read) over ``--rows`` and 4 × ``--rows`` chats, each
a question about its own 64x64 PNG on disk (default 500 and 2000 rows, as many pictures): the rows read, every image
checked (opened and decoded once), the chats rendered, tokenized and masked, each image's placeholder replaced by
its tokens, the length column added, and the prepared dataset written to ``data.prepared_path``. Each size runs in
its own process, with a datasets cache of its own (nothing reused from the other), through
benchmarks/data_scale.py's measuring child, which reports:

  peak RSS        the largest resident set of the process tree (``getrusage``): what a user sees. Most of it is the
                  libraries (torch, transformers, datasets, Pillow), the same at both sizes.
  peak anonymous  the tree's anonymous memory (``Pss_Anon``, sampled every 100 ms): what the machine must hold; it
                  leaves out the pages of memory-mapped Arrow files, which the kernel drops under pressure.

and the growth per row: (4× − 1×) / (3 × ``--rows``), in KB, of each. Target: peak RSS at 4× ≤ 1.1 × peak RSS at 1×
(preparation holds the rows on disk, not in memory, and never holds more than one image decoded). Sizes run
``--repeats`` times, interleaved (1×, 4×, 1×, 4×, …), and the median of each is reported. A measurement, not a test:
it exits 1 only when a command fails.

    python benchmarks/vision_prep_memory.py                     # about 1-2 minutes on 2 cores
    python benchmarks/vision_prep_memory.py --quick             # 50 and 200 rows, once: does it run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data_scale import measure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "assets" / "tiny-llama"
PIXELS = 64
TEMPLATE = (  # ChatML; an image part is written as LLaVA's `<image>`, which the processor expands into its tokens
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- for part in message['content'] %}{%- if part['type'] == 'image' %}{{- '<image>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (40, 60, 230), "yellow": (240, 220, 40)}


def build_llava(folder: Path) -> Path:
    """A tiny random LLaVA's folder: its config and processor (what `ft preprocess` reads; no weights)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_processor = transformers.CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    transformers.LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=8,
                                chat_template=TEMPLATE).save_pretrained(folder)
    vision = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=16, patch_size=8)
    text = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=2, vocab_size=len(tokenizer))
    transformers.LlavaConfig(vision_config=vision, text_config=text,
                             image_token_index=tokenizer.convert_tokens_to_ids("<image>")).save_pretrained(folder)
    return folder


def write_rows(folder: Path, rows: int) -> Path:
    """``rows`` chats in ``folder``/rows.jsonl, each about its own 64x64 PNG in ``folder``/images (paths relative to
    the data file, as a dataset on disk gives them)."""
    from PIL import Image, ImageDraw

    names, lines = list(COLOURS), []
    (folder / "images").mkdir(parents=True)
    for i in range(rows):
        colour = names[i % len(names)]
        image = Image.new("RGB", (PIXELS, PIXELS), (255, 255, 255))
        ImageDraw.Draw(image).rectangle([4 + i % 9, 4 + i % 7, PIXELS - 5 - i % 5, PIXELS - 5], fill=COLOURS[colour])
        image.save(folder / "images" / f"{i}.png")
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": [{"type": "image", "image": f"images/{i}.png"},
                                         {"type": "text", "text": f"Picture {i}: what colour is the square?"}]},
            {"role": "assistant", "content": f"The square is {colour}."}]}))
    path = folder / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def recipe(folder: Path, model: Path, data: Path) -> Path:
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "method": "sft", "model": {"name": str(model), "init": "random"},
        "data": {"train": [{"path": str(data), "format": "chat"}], "max_length": 128,
                 "prepared_path": str(folder / "prepared")},
        "train": {"output_dir": str(folder / "out"), "per_device_train_batch_size": 8, "report_to": "none"}}))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500, help="rows (and pictures) at 1×; 4× is four times it")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each size, interleaved; medians reported")
    parser.add_argument("--quick", action="store_true", help="50 and 200 rows, once: does it run")
    opts = parser.parse_args()
    if opts.quick:
        opts.rows, opts.repeats = 50, 1
    sizes = {"1×": opts.rows, "4×": 4 * opts.rows}
    results: dict[str, list[dict]] = {label: [] for label in sizes}
    with tempfile.TemporaryDirectory(prefix="ft-bench-") as tmp:
        tmp = Path(tmp)
        model = build_llava(tmp / "llava")
        recipes = {label: recipe(tmp / label, model, write_rows(tmp / label, rows)) for label, rows in sizes.items()}
        print(f"ft preprocess of a tiny LLaVA's chats, one {PIXELS}x{PIXELS} PNG each: {opts.rows} and "
              f"{4 * opts.rows} rows, {opts.repeats} runs each, interleaved", flush=True)
        for repeat in range(opts.repeats):
            for label, path in recipes.items():
                run = f"{label}-{repeat}"
                result = measure(sys.executable, "-m", "ft", "preprocess", str(path), cache=tmp / f"cache-{run}")
                stats = json.loads(result["stdout"][result["stdout"].index("{"):])
                if stats["train_rows"] != sizes[label]:
                    raise SystemExit(f"ft preprocess kept {stats['train_rows']} of {sizes[label]} rows")
                (path.parent / "prepared").rename(path.parent / f"prepared-{run}")  # the next run builds its own
                results[label].append({"peak_mb": result["peak_kb"] / 1024, "anon_mb": result["anon_kb"] / 1024,
                                       "seconds": result["seconds"]})
                print(f"{label} ({sizes[label]} rows), run {repeat + 1}: peak RSS {result['peak_kb'] / 1024:.0f} MB, "
                      f"peak anonymous {result['anon_kb'] / 1024:.0f} MB, {result['seconds']:.1f} s", flush=True)

    median = {label: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
              for label, runs in results.items()}
    print(f"\n{'size':<6}{'rows':>7}{'peak RSS MB':>13}{'peak anon MB':>14}{'seconds':>9}   (medians)")
    for label, m in median.items():
        print(f"{label:<6}{sizes[label]:>7}{m['peak_mb']:>13.0f}{m['anon_mb']:>14.0f}{m['seconds']:>9.1f}")
    added = 3 * opts.rows
    one, four = median["1×"], median["4×"]
    print(f"growth per row: peak RSS {(four['peak_mb'] - one['peak_mb']) * 1024 / added:.2f} KB, peak anonymous "
          f"{(four['anon_mb'] - one['anon_mb']) * 1024 / added:.2f} KB")
    print(f"\npeak anonymous 4× / 1× = {four['anon_mb'] / one['anon_mb']:.3f}")
    print(f"peak RSS 4× / 1× = {four['peak_mb'] / one['peak_mb']:.3f} (target <= 1.1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
