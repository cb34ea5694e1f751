"""Write ``data/colours/``: pictures whose answer only the picture holds, for ``recipes/vlm-colours.yaml``.

Each picture (32x32 PNG, under ``images/``) is a grey background with one shape (a square, a disc or a triangle) of
one of ``COLOURS``, at a random size and place; the question is always "What colour is the shape?" and the answer is
the colour's name. A model that does not see the picture answers at chance (1 in ``len(COLOURS)``), whatever it
learned of the text. Files:

- ``train.jsonl`` (``TRAIN`` rows) and ``eval.jsonl`` (``EVAL`` held-out rows): chats in OpenAI-style content parts,
  the image's path relative to the data file;
- ``train-shuffled.jsonl``: the training rows with their pictures dealt out again at random, so that the answer no
  longer follows from the picture: the control run, which must stay at chance on the held-out rows.

Deterministic (``SEED``): running it again writes the same bytes.
Usage: python scripts/make_colours_data.py [--to DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "data" / "colours"
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (235, 215, 20)}
SHAPES = ("square", "disc", "triangle")
QUESTION = "What colour is the shape?"
TRAIN, EVAL, SIZE, SEED = 480, 120, 32, 0


def picture(rng: random.Random, colour: str):
    """A grey picture with one shape of ``colour``, its kind, size, place and background shade drawn from ``rng``."""
    from PIL import Image, ImageDraw

    shade = rng.randint(90, 200)
    image = Image.new("RGB", (SIZE, SIZE), (shade, shade, shade))
    side = rng.randint(14, 26)
    x, y = rng.randint(0, SIZE - side), rng.randint(0, SIZE - side)
    box = [x, y, x + side - 1, y + side - 1]
    draw, fill = ImageDraw.Draw(image), COLOURS[colour]
    shape = rng.choice(SHAPES)
    if shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "disc":
        draw.ellipse(box, fill=fill)
    else:
        draw.polygon([(x, y + side - 1), (x + side - 1, y + side - 1), (x + side // 2, y)], fill=fill)
    return image


def row(image: str, colour: str) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                      {"type": "text", "text": QUESTION}]},
                         {"role": "assistant", "content": colour}]}


def write(folder: Path) -> None:
    rng = random.Random(SEED)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str]] = []
    for i in range(TRAIN + EVAL):
        colour = rng.choice(sorted(COLOURS))
        name = f"images/{i:04d}.png"
        picture(rng, colour).save(folder / name, optimize=True)
        rows.append((name, colour))
    train, held_out = rows[:TRAIN], rows[TRAIN:]
    dealt = [image for image, _ in train]
    rng.shuffle(dealt)
    files = {"train.jsonl": train, "eval.jsonl": held_out,
             "train-shuffled.jsonl": [(image, colour) for image, (_, colour) in zip(dealt, train, strict=True)]}
    for name, pairs in files.items():
        (folder / name).write_text("".join(json.dumps(row(image, colour)) + "\n" for image, colour in pairs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", type=Path, default=DEFAULT)
    args = parser.parse_args(argv)
    write(args.to)
    print(f"wrote {args.to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
