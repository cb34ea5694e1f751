"""Reproduce the abort a 2-process CPU run can end with, and show that ft's way of exiting avoids it.

A rank of a gloo run that exits right after a collective may die with "terminate called without an active
exception" (SIGABRT): a gloo worker thread still holds the finished work, frees its tensor as Python finalizes,
needs the GIL and is ended inside a C++ destructor (see ``ft.ranks.exit_without_finalizing``). In
tests/test_multiprocess.py it showed once in a loaded CI run. Here each launch is two processes that take a few
DistributedDataParallel steps, gather and all-reduce once (as evaluation and ft's stop agreement do), then end
either as a plain Python program or through ``exit_without_finalizing`` like ``ft train``. Busy loops load the
cores meanwhile, since the race shows only under load.

    python scripts/gloo_exit_race.py [--runs 20] [--burners 2]

Prints the failures of each way (e.g. plain 5 of 20 aborted, ft 0 of 20) and exits 1 when ft's way failed.
For the whole `ft train` command under load, see scripts/stress_multiprocess.sh.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys

WORKER = "FT_GLOO_EXIT_RACE"  # environment variable: set in the launched processes, to `plain` or `ft`


def worker(how: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    for _ in range(5):
        model(torch.randn(2, 4)).sum().backward()
    dist.all_gather([torch.empty(1) for _ in range(2)], torch.ones(1))
    flag = torch.tensor([1])
    dist.all_reduce(flag)
    del flag  # as in a callback: only the gloo work holds the tensor now
    if how == "ft":
        from ft.run.ranks import exit_without_finalizing

        exit_without_finalizing(0)


def launch(how: str) -> bool:
    """One 2-process run; True when both processes ended cleanly."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__]
    result = subprocess.run(command, env={**os.environ, WORKER: how}, capture_output=True, text=True, timeout=120)
    return result.returncode == 0


def burn() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="2-process runs of each way")
    parser.add_argument("--burners", type=int, default=2, help="busy-loop processes loading the cores meanwhile")
    args = parser.parse_args()
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burners)]
    for process in burners:
        process.start()
    failed = {"plain": 0, "ft": 0}
    try:
        for _ in range(args.runs):  # interleaved, so both ways meet the same load
            for how in failed:
                failed[how] += not launch(how)
    finally:
        for process in burners:
            process.terminate()
    for how, count in failed.items():
        print(f"{how:>5}: {count} of {args.runs} runs aborted")
    return 1 if failed["ft"] else 0


if __name__ == "__main__":
    if os.environ.get(WORKER):
        worker(os.environ[WORKER])
    else:
        sys.exit(main())
