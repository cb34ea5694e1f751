"""Where the test suite's CPU goes, process by process: runs pytest with a ``sitecustomize`` on PYTHONPATH that makes
every Python process the run starts (test processes, ``ft`` commands forked from tests/ft_server.py or started fresh,
the ranks of multi-process runs, helper scripts) write, as it exits, its CPU seconds, whether it imported torch and its
command line; then prints the totals by kind.

    python benchmarks/suite_processes.py                      # CI's suite (about 22 minutes on 2 cores)
    python benchmarks/suite_processes.py -- -m "not slow"     # the quick lane; anything after -- goes to pytest

A process forked from the fork server counts only its own CPU after the fork (what it adds); a fresh one counts its
imports too, which is the point: a fresh process that imports ft's training stack costs some 12 s of CPU on the
2-core development machine (benchmarks/README.md, "The test suite's time"). A process killed by a signal it does not
handle writes nothing and is missing from the counts. Exit code: pytest's.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# written into a temporary folder put first on PYTHONPATH: Python imports ``sitecustomize`` at every start
PROBE = '''
import atexit, os, resource, sys

def _record():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = "\\t".join((str(os.getpid()), f"{usage.ru_utime + usage.ru_stime:.2f}", str(int("torch" in sys.modules)),
                       " ".join(sys.argv).replace("\\t", " ").replace("\\n", " ")))
    with open(os.environ["FT_SUITE_PROCESSES_LOG"], "a") as log:
        log.write(line + "\\n")

atexit.register(_record)
'''


def kind(argv: str) -> str:
    """A process's kind from its command line: a fresh or forked ``ft`` command (with its verb), a test process, a
    launcher, or another script."""
    words = argv.split()
    if not words:
        return "other"
    program = Path(words[0])
    if words[0].endswith("ft/__main__.py") or program.name == "ft":  # ``python -m ft``, or the installed command
        return f"fresh ft {words[1] if len(words) > 1 else ''}".rstrip()
    if words[0] == "-m" and len(words) > 1:  # ``runpy`` in a child of tests/ft_server.py: argv[0] is "-m"
        return f"forked ft {words[1]}"
    if words[0] == "-c":
        return "python -c (the test processes, and tests' own snippets)"
    if words[0].endswith("torch/distributed/run.py"):
        return "torchrun"
    return f"script {program.parent.name}/{program.name}" if program.name == "__main__.py" else f"script {program.name}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: -q)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ft-suite-processes-") as folder:
        (Path(folder) / "sitecustomize.py").write_text(PROBE)
        log = Path(folder) / "processes.tsv"
        env = {**os.environ, "FT_SUITE_PROCESSES_LOG": str(log),
               "PYTHONPATH": os.pathsep.join(filter(None, (folder, os.environ.get("PYTHONPATH"))))}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run([sys.executable, "-m", "pytest", *(args.pytest_args or ["-q"])], cwd=ROOT, env=env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = [line.split("\t", 3) for line in log.read_text().splitlines()] if log.exists() else []
    total = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    counts, seconds = collections.Counter(), collections.Counter()
    for _pid, cpu, _torch, argv in rows:
        counts[kind(argv)] += 1
        seconds[kind(argv)] += float(cpu)
    print(f"\nCPU of the whole run (every process it waited for): {total:.0f} s; recorded per process: "
          f"{sum(seconds.values()):.0f} s in {sum(counts.values())} processes")
    print(f"{'processes':>9}  {'CPU s':>7}  {'share':>5}  kind")
    for name, cpu in seconds.most_common():
        print(f"{counts[name]:>9}  {cpu:>7.0f}  {cpu / max(total, 1e-9):>5.0%}  {name}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
