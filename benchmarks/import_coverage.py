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
- tracebacks: any exception other than the config error is caught, counted and shown (target 0).

    python benchmarks/import_coverage.py [CORPUS] [--top 25]

Exit status 0 when the targets hold (>= 90% accepted, 0 tracebacks), 1 otherwise. Needs no network: validation
never reaches the Hub (HF_HUB_OFFLINE=1 is set here to make sure).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from ft.importers.axolotl import ConfigError, import_axolotl  # noqa: E402
from ft.importers.ledger import CARRIED, IGNORED, NOT_CARRIED  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = ROOT.parent / "shared" / "axolotl-examples"
TARGET = 0.90


def generic(key: str) -> str:
    """``datasets.3.type`` -> ``datasets[].type``, ``plugins.0`` -> ``plugins[]``: one name per kind of key."""
    return re.sub(r"\.\d+(?=\.|$)", "[]", key)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--top", type=int, default=25, help="How many of the most frequent not-carried keys to list.")
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
        elif result.out_of_scope:
            audio.append(name)
        else:
            refused.append((name, result.modality, result.verdict.errors[:1]))
    elapsed = time.perf_counter() - started
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
    for name, text in crashes:
        print(f"\ntraceback importing {name}:\n{text}", file=sys.stderr)
    ok = not crashes and all(accepted[m] / training[m] >= TARGET for m in ("text", "vision") if training[m])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
