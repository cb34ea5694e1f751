"""A weighted mixture's cost at scale, measured side by side in one run: does ``ft.data.sources.weighted`` (what
``data.train`` with ``weight:`` keys runs) cost no more than datasets' own draw, and grow only with the rows?

For mixtures of 1× and 4× ``--rows`` rows (three sources, weights 0.5 / 0.3 / 0.2, a text column of a few hundred
bytes a row, written to an Arrow file as ``ft`` reads them), each round times, in this one process, one after the
other (and checks that both drew the same rows):

1. ``weighted``: ft's function on the mixture, the source column read at once (Arrow), one ``interleave_datasets`` on
   row positions, one ``select``;
2. the floor: the same ``interleave_datasets`` and ``select`` on positions computed beforehand (what datasets costs
   whatever the caller does);
3. with ``--per-row``, the read ft made before 2026-12-07: ``np.asarray`` over the lazy ``Column`` that
   ``dataset[name]`` returns in datasets 4+, which formats one row at a time (shown for scale; slow at 100k rows).

It prints the median seconds of each at each size and the targets: ``weighted`` ≤ 1.3× the floor at each size (the
column read and the position lists are all ft adds), and ``weighted`` at 4× ≤ 4.4× at 1× (linear in the rows).
Results go in benchmarks/README.md with the date; it always exits 0.

    python benchmarks/mixture_scale.py [--rows 100000] [--rounds 5] [--per-row]   # 40 s on 2 cores with --per-row
    python benchmarks/mixture_scale.py --quick                                    # 1000 rows, once
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import datasets
import numpy as np

from ft.data.rows import SOURCE
from ft.data.sources import weighted

WEIGHTS = [0.5, 0.3, 0.2]
STOP = "first_exhausted"  # data.mix_stop's default: the mixture ends when its first source runs out


def mixture(rows: int, folder: Path) -> datasets.Dataset:
    """``rows`` rows of three sources (a third each), saved and read back memory-mapped, as ft's prepared rows are."""
    rng = np.random.default_rng(0)
    sources = np.arange(rows, dtype=np.int64) % len(WEIGHTS)
    texts = [f"row {i}: " + "the model learns to add numbers " * int(rng.integers(4, 12)) for i in range(rows)]
    path = folder / f"mix-{rows}"
    datasets.Dataset.from_dict({"text": texts, SOURCE: sources}).save_to_disk(str(path))
    return datasets.load_from_disk(str(path))


def floor(dataset: datasets.Dataset, positions: list[datasets.Dataset], seed: int) -> datasets.Dataset:
    """datasets' part alone: the seeded draw over prepared position lists, then the selection."""
    drawn = datasets.interleave_datasets(positions, probabilities=WEIGHTS, seed=seed, stopping_strategy=STOP)
    return dataset.select(drawn.with_format("arrow")["at"].to_numpy())


def per_row(dataset: datasets.Dataset) -> np.ndarray:
    """The source column as ft read it before: through the lazy Column, one formatted row at a time."""
    return np.asarray(dataset.with_format("numpy")[SOURCE])


def timed(call, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = call(*args, **kwargs)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows at 1× (4× is measured too)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-row", action="store_true", help="also time the row-by-row read ft made before")
    parser.add_argument("--quick", action="store_true", help="1000 rows, one round, --per-row (tests/test_benchmarks)")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.rounds, args.per_row = 1000, 1, True
    datasets.disable_progress_bars()
    results: dict[int, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for rows in (args.rows, 4 * args.rows):
            dataset = mixture(rows, Path(folder))
            sources = dataset.with_format("arrow")[SOURCE].to_numpy()
            positions = [datasets.Dataset.from_dict({"at": np.flatnonzero(sources == i)}) for i in range(3)]
            times = results[rows] = {"weighted": [], "floor": [], "per-row": []}
            for round_ in range(args.rounds + 1):  # round 0 warms the caches and is not kept
                spent, ours = timed(weighted, dataset, WEIGHTS, seed=round_, stop=STOP)
                base, theirs = timed(floor, dataset, positions, seed=round_)
                if not ours.with_format("arrow")[:]["text"].equals(theirs.with_format("arrow")[:]["text"]):
                    raise SystemExit(f"{rows} rows, round {round_}: weighted drew other rows than the floor")
                if round_:
                    times["weighted"].append(spent)
                    times["floor"].append(base)
                print(f"{rows:>8} rows  round {round_}  weighted {spent:.3f} s  floor {base:.3f} s  "
                      f"({len(ours)} rows drawn){'' if round_ else '  (warm-up)'}", flush=True)
            if args.per_row:
                spent, column = timed(per_row, dataset)
                assert (column == sources).all()
                times["per-row"].append(spent)
                print(f"{rows:>8} rows  per-row read of the source column {spent:.3f} s", flush=True)
    small, large = (statistics.median(results[n]["weighted"]) for n in results)
    print("\n| rows | weighted s | floor s | weighted / floor |" + (" per-row read s |" if args.per_row else ""))
    print("|---|---|---|---|" + ("---|" if args.per_row else ""))
    ratios = []
    for rows, times in results.items():
        ours, base = statistics.median(times["weighted"]), statistics.median(times["floor"])
        ratios.append(ours / base)
        extra = f" {times['per-row'][0]:.2f} |" if args.per_row else ""
        print(f"| {rows} | {ours:.3f} | {base:.3f} | {ours / base:.2f} |{extra}")
    print(f"\nweighted / floor = {max(ratios):.2f} at worst (target <= 1.30)")
    print(f"weighted at 4x / at 1x = {large / small:.2f} (target <= 4.40)")


if __name__ == "__main__":
    main()
