"""How much of real Axolotl configs `ft import axolotl` carries over, and how many of the recipes it writes ft accepts.

Imports every .yml/.yaml file under the corpus folder (default: ../shared/axolotl-examples, 215 example configs from
the Axolotl repository) in this process, as `ft import axolotl` does, and reports:

- the share of configs whose recipe `ft validate` accepts (target >= 90%), of all files, of the text-model training
  configs and, apart, of the vision-language ones (a `processor_type` and image rows); the audio-language configs are
  refused by design (ft trains text and images), and a file that is not an Axolotl training config is refused with
  exit 2, as the command does;
- the share of keys carried, ignored (empty or switched off) and not carried, over the whole corpus (nested keys of
  datasets, trl, fsdp_config, special_tokens… counted one by one);
- the most frequent keys not carried, and each config ft does not accept with ft's first reason;
- tracebacks: any exception other than the config error is caught, counted and shown (target 0);
- with ``--smoke``, the smoke test (``ft train RECIPE --smoke``) of every vision-language recipe ft accepts, counted
  apart: how many pass, how long each took, and for each failure the first line of its error (``smoke_runs``).

    python benchmarks/import_coverage.py [CORPUS] [--top 25] [--smoke]

Exit status 0 when the targets hold (>= 90% accepted, 0 tracebacks; with ``--smoke``, every smoke run passed), 1
otherwise. Needs no network: validation never reaches the Hub, and the smoke runs stand in for hub models and data
sets offline (HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1 are set here, before huggingface_hub is imported, to make
sure; a variable already set to something else is left as it is).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # the smoke runs' progress bars: read when tqdm is imported

from ft.importers.axolotl import ConfigError, import_axolotl  # noqa: E402
from ft.importers.ledger import CARRIED, IGNORED, NOT_CARRIED  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = ROOT.parent / "shared" / "axolotl-examples"
TARGET = 0.90


def generic(key: str) -> str:
    """``datasets.3.type`` -> ``datasets[].type``, ``plugins.0`` -> ``plugins[]``: one name per kind of key."""
    return re.sub(r"\.\d+(?=\.|$)", "[]", key)


def smoke_runs(corpus: Path, names: list[str]) -> list[tuple[str, str | None, float]]:
    """``ft train RECIPE --smoke`` of the recipe each config in ``names`` imports to, one after the other in this
    process: imported to ``<temp>/<name>.yaml`` as ``ft import axolotl CONFIG --out`` writes it (relative paths from
    the recipe's folder), then loaded with ``train.output_dir`` set under the same temp folder and rehearsed through
    ``ft.smoke.rehearse.train``, as ``ft train --smoke --set train.output_dir=...`` does, without the ~10 s of
    importing torch and transformers again for each (the first run pays for that import). Each run writes only into
    its own folder, and any exception is caught and counted; one that ends the process itself (a native crash) ends
    the benchmark: ``ft train RECIPE --smoke`` on that config alone shows it. Returns (name, None when it passed
    else the first line of its error, seconds) for each."""
    from ft.errors import FtError
    from ft.recipe import RecipeError, load_recipe
    from ft.recipe.errors import first_line
    from ft.run.notices import install as hide_notices_not_for_the_user
    from ft.smoke import rehearse

    results = []
    with tempfile.TemporaryDirectory(prefix="ft-import-smoke-") as folder:
        for name in names:
            stem = Path(folder) / name.replace("/", "_").rsplit(".", 1)[0]
            started, error = time.perf_counter(), None
            try:
                recipe = stem.with_suffix(".yaml")
                recipe.write_text(import_axolotl(corpus / name, recipe).text)
                loaded = load_recipe(recipe, [f"train.output_dir={stem}-out"])
                hide_notices_not_for_the_user(loaded.recipe.train_args)  # as `ft train` does
                result = rehearse.train(loaded, say=lambda _: None)
                if result.status != "completed":
                    error = f"the run stopped ({result.status})"
            except RecipeError as exc:  # its first problem, by key (the recipe's file is gone with the temp folder)
                problems = [p for p in exc.problems if p.level == "error"]
                error = f"{problems[0].path}: {first_line(problems[0].message)}" if problems else first_line(exc)
            except FtError as exc:
                error = first_line(exc.render())
            except Exception as exc:  # a bug or a library's failure: `ft train` says the same, traceback aside
                error = f"{type(exc).__name__}: {first_line(exc)}"
            results.append((name, error, time.perf_counter() - started))
            print(f"  smoke {'passed' if error is None else 'FAILED'} in {results[-1][2]:.0f} s: {name}",
                  file=sys.stderr, flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--top", type=int, default=25, help="How many of the most frequent not-carried keys to list.")
    parser.add_argument("--smoke", action="store_true", help="Also run the smoke test (ft train --smoke, offline, on "
                        "the CPU) of every vision-language recipe ft accepts, and count how many pass.")
    args = parser.parse_args()
    files = sorted(p for p in args.corpus.rglob("*") if p.suffix in (".yml", ".yaml") and p.is_file())
    if not files:
        print(f"no .yml/.yaml files under {args.corpus}", file=sys.stderr)
        return 1
    unreadable, crashes, refused = [], [], []
    accepted: collections.Counter = collections.Counter()  # modality -> configs ft accepts
    training: collections.Counter = collections.Counter()  # modality -> training configs (audio: refused by design)
    audio: list[str] = []
    keys: collections.Counter = collections.Counter()
    missing: collections.Counter = collections.Counter()
    seeing: list[str] = []  # the vision-language configs whose recipe ft accepts: the smoke runs' corpus
    started = time.perf_counter()
    for path in files:
        name = str(path.relative_to(args.corpus))
        try:
            result = import_axolotl(path)  # as to stdout: relative paths are read from the working directory
        except ConfigError as exc:
            unreadable.append((name, str(exc)))
            continue
        except Exception:  # the command must never crash: count and show every traceback
            crashes.append((name, traceback.format_exc()))
            continue
        for entry in result.ledger.entries.values():
            keys[entry.status] += 1
            keys["same"] += entry.status == CARRIED and entry.same
            keys["noted"] += entry.status == CARRIED and bool(entry.why) and not entry.same
            if entry.status == NOT_CARRIED:
                missing[generic(entry.key)] += 1
        training[result.modality] += 1
        if result.valid:
            accepted[result.modality] += 1
            if result.modality == "vision":
                seeing.append(name)
        elif result.out_of_scope:
            audio.append(name)
        else:
            refused.append((name, result.modality, result.verdict.errors[:1]))
    elapsed = time.perf_counter() - started
    smoked, smoke_elapsed = None, 0.0
    if args.smoke:
        started = time.perf_counter()
        smoked = smoke_runs(args.corpus, seeing)
        smoke_elapsed = time.perf_counter() - started
    text, vision = training["text"], training["vision"]
    total_keys = sum(keys[status] for status in (CARRIED, IGNORED, NOT_CARRIED)) or 1
    print(f"corpus: {args.corpus} ({len(files)} files: {text} text-model training configs, {vision} vision-language, "
          f"{training['audio']} audio-language refused by design, {len(unreadable)} not training configs; "
          f"{elapsed:.1f} s)")
    print(f"accepted by ft validate: {accepted['text']}/{text} text-model training configs = "
          f"{accepted['text'] / max(text, 1):.1%} (target >= 90%); {accepted['vision']}/{vision} vision-language = "
          f"{accepted['vision'] / max(vision, 1):.1%} (target >= 90%); {sum(accepted.values())}/{len(files)} files")
    print(f"audio-language configs refused (exit 1: ft trains text and images, not audio): {len(audio)}/"
          f"{training['audio']}")
    print(f"keys: {total_keys} in all; carried {keys[CARRIED]} ({keys[CARRIED] / total_keys:.1%}), ignored as empty "
          f"or off {keys[IGNORED]} ({keys[IGNORED] / total_keys:.1%}), not carried {keys[NOT_CARRIED]} "
          f"({keys[NOT_CARRIED] / total_keys:.1%})")
    print(f"  of the carried: {keys['same']} as ft's own default (nothing written), {keys['noted']} with a difference "
          "named in the recipe")
    print(f"tracebacks: {len(crashes)} (target 0)")
    if smoked is not None:
        passed = [seconds for _, error, seconds in smoked if error is None]
        spread = f"; {min(passed):.0f}-{max(passed):.0f} s each" if len(passed) > 1 else ""
        print(f"smoke tests (ft train --smoke, offline, CPU) of the vision-language recipes ft accepts: "
              f"{len(passed)}/{len(smoked)} pass ({smoke_elapsed:.0f} s in all{spread})")
    print("\nmost frequent keys not carried (occurrences):")
    for key, count in missing.most_common(args.top):
        print(f"  {count:4d}  {key}")
    if unreadable:
        print("\nnot training configs (exit 2):")
        for name, message in unreadable:
            print(f"  {name}: {message}")
    if audio:
        print("\naudio-language models (exit 1: ft trains text and images, not audio):")
        for name in audio:
            print(f"  {name}")
    if refused:
        print("\nrecipes ft does not accept (exit 1), with ft's first reason:")
        for name, modality, errors in refused:
            print(f"  {name}{' (vision)' if modality == 'vision' else ''}: {errors[0].render() if errors else '?'}")
    if smoked is not None and len(passed) < len(smoked):
        print("\nvision-language recipes whose smoke test fails, with the first line of its error:")
        for name, error, _ in smoked:
            if error is not None:
                print(f"  {name}: {error}")
    for name, text in crashes:
        print(f"\ntraceback importing {name}:\n{text}", file=sys.stderr)
    ok = not crashes and all(accepted[m] / training[m] >= TARGET for m in ("text", "vision") if training[m])
    ok = ok and (smoked is None or all(error is None for _, error, _ in smoked))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
