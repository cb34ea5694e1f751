"""Generate the written-dates dataset in ``data/dates/``: a date as people write it, and the same date in ISO 8601.

A task the shipped arithmetic recipes do not cover, in the ``instruction`` format (instruction, input, output), as a
new user brings one: ``recipes/smollm2-dates.yaml`` teaches SmolLM2-135M-Instruct to answer with the ISO date alone.
Each row has a ``form`` field naming how the input writes the date, which the training ignores (the instruction
format keeps its own three fields) and ``data.eval_exact_match.group_by: form`` scores by, to show which forms the
misses are in. The forms are the common English ones and one numeric form, day first (``05.03.2024``), which a
model that reads the month first gets wrong.

2,000 training rows and 200 held out, deterministic (fixed seed); no held-out date occurs in the training rows in any
form. Usage: python scripts/make_dates_data.py [--out data/dates]
"""

import argparse
import datetime
import json
import random
from pathlib import Path

SEED = 2024
TRAIN, HELD_OUT = 2000, 200
INSTRUCTION = "Write this date in ISO 8601 (YYYY-MM-DD)."
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
FORMS = {  # form -> how it writes a date
    "day month": lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    "month day": lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    "abbreviated": lambda d: f"{d.day} {MONTHS[d.month - 1][:3]} {d.year}",
    "numeric day first": lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",
}


def row(date: datetime.date, form: str) -> dict:
    return {"instruction": INSTRUCTION, "input": FORMS[form](date), "output": date.isoformat(), "form": form}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "data" / "dates")
    out = parser.parse_args().out
    rng = random.Random(SEED)
    start, days = datetime.date(1950, 1, 1), (datetime.date(2049, 12, 31) - datetime.date(1950, 1, 1)).days
    dates = [start + datetime.timedelta(days=offset) for offset in rng.sample(range(days + 1), TRAIN + HELD_OUT)]
    forms = list(FORMS)
    out.mkdir(parents=True, exist_ok=True)
    for name, chosen in (("train.jsonl", dates[:TRAIN]), ("eval.jsonl", dates[TRAIN:])):
        rows = [row(date, forms[i % len(forms)]) for i, date in enumerate(chosen)]
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{out / name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
