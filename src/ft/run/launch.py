"""``ft train RECIPE --num-processes N``: ft starts the run's processes itself and stays their parent.

The ranks are started by torch.distributed's elastic launcher (the engine behind ``torchrun``), run in this process
as its agent; each rank is ``python -m ft train`` with the same recipe and ``--set`` overrides, so everything a
single process does (validation, resume, drift, JIT checkpoints, the summary) happens the same way. What ft adds:

- **Signals.** The launcher's own handling of SIGTERM/SIGINT is switched off (``signals_to_handle``):
  it would raise in the agent, kill the ranks after its shutdown timeout and exit 1 with a traceback. Instead ft
  passes each SIGTERM and SIGINT on to every rank (each runs in its own session, so a terminal's Ctrl-C reaches
  the ranks only through ft: once per press), the ranks agree on a step, save one checkpoint and exit 143 (130),
  and ft exits with the same code. A second Ctrl-C is passed on too: the ranks end at once.
- **No orphans.** Each rank asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``,
  ``watch_parent``), so even a SIGKILL of ft leaves no rank behind; a rank that fails makes the launcher stop
  the others.
- **Data first.** With ``data.prepared_path``, ft tokenizes in this process before any rank starts, so no rank
  waits on another inside a collective (and none can hit the process group's timeout while the data is built).
- **The resume command** each rank prints and records is this command line (``FT_RESUME_COMMAND``).
- **One run per output directory.** On one machine ft holds the output directory's lock (``ft.outputs.lock``)
  before it prepares the data or starts a rank, and names itself to the ranks (``FT_LOCK_HOLDER``): rank 0 finds the
  lock held by its launcher and goes on, the other ranks never take it, and a second ``ft train`` into the directory
  is refused before any of its ranks start. Across machines (``--nnodes``, or an accelerate config, which may name
  several) each machine runs its own launcher, so none holds it: the run's rank 0 takes it itself. A launcher killed
  with SIGKILL lets go at once, while its ranks save their checkpoint and end (``watch_parent``).

Several machines: run the same ``ft train`` on each with ``--nnodes``, ``--node-rank`` and ``--master-addr``/
``--master-port`` (a static rendezvous, as torchrun's), or ``--rdzv-endpoint`` (c10d rendezvous, ranks assigned by
it). An accelerate config file (``launch.accelerate_config``) hands the launch to ``accelerate launch`` instead.

What ``ft train`` decides here before it trains, so that the CLI only calls: the ``--num-processes`` it was given
(``num_processes_flag``), the process count the recipe's rules see (``known_processes``), whether this command starts
the ranks itself (``several_processes_wanted``, then ``start_ranks``), and the command line that resumes the run
(``command_that_resumes``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import FtError
from ..recipe import LoadedRecipe, Problem, Processes
from ..recipe.errors import first_line
from .ranks import launched_world_size
from .signals import STOP_SIGNALS, StoppedBeforeTraining, exit_code, signal_name

# the CLI's launch flags: the launcher reads them, the ranks must not see them
FLAGS = ("--num-processes", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--rdzv-endpoint")
RESUME_COMMAND_ENV = "FT_RESUME_COMMAND"
LAUNCHED_ENV = "FT_LAUNCHED"  # set for the ranks ft starts: they watch their parent
LOCK_HOLDER_ENV = "FT_LOCK_HOLDER"  # set for the ranks ft starts when it holds the output directory: its pid
STOPPED_ENV = "FT_LAUNCHER_STOPPED"  # a file where ft writes a stop signal's number before passing it on
SHUTDOWN_TIMEOUT = 3600  # seconds the launcher gives ranks that are still saving after one rank ended


@dataclass(frozen=True)
class Launch:
    """How many processes, on how many machines, meeting where (None: torch's defaults for one machine)."""

    num_processes: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    accelerate_config: Path | None = None
    join_timeout: int = 300  # seconds the machines wait for each other at the rendezvous (launch.join_timeout)

    @property
    def needed(self) -> bool:
        """True when ft must start processes (more than one, or an accelerate config to follow)."""
        return self.num_processes * self.nnodes > 1 or self.accelerate_config is not None

    def describe(self) -> str:
        if self.accelerate_config is not None:
            return f"accelerate launch --config_file {self.accelerate_config}"
        machines = f" on each of {self.nnodes} machines (this one: node {self.node_rank})" if self.nnodes > 1 else ""
        return f"{self.num_processes} processes{machines}"


def num_processes_flag(value: str | None) -> int | str | None:
    """``--num-processes`` as given: None (not given), ``auto`` or a count of 1 or more; anything else is refused
    (exit 2) before the recipe is read."""
    if value is None or value == "auto":
        return value
    if not value.isdigit() or int(value) < 1:
        raise FtError(f"--num-processes {value!r}: give a number of processes (1 or more) or auto (the visible GPUs).")
    return int(value)


def known_processes(num_processes: int | str | None) -> Processes | None:
    """The process count the rules that involve processes see: inside a rank, the run's (WORLD_SIZE, set by torchrun,
    accelerate or ft); else ``--num-processes`` (``auto``: the visible GPUs); else None (the recipe's ``launch:``)."""
    size = launched_world_size()
    if size is not None:
        return Processes(size, f"WORLD_SIZE={size}")
    if num_processes is None:
        return None
    count = max(visible_gpus(), 1) if num_processes == "auto" else int(num_processes)
    return Processes(count, f"--num-processes {count}")


def visible_gpus() -> int:
    """The GPUs this process sees (``auto`` processes: one per GPU)."""
    import torch

    return torch.cuda.device_count()


def several_processes_wanted(loaded: LoadedRecipe, flags: dict[str, object]) -> bool:
    """True when this command must start the ranks itself (not when it already is one of them): a launch flag was
    given, or the recipe has a ``launch:`` section."""
    if launched_world_size() is not None:  # started by torchrun / accelerate / ft: one rank of the run
        return False
    return any(value is not None for value in flags.values()) or getattr(loaded.recipe, "launch", None) is not None


def start_ranks(loaded: LoadedRecipe, flags: dict[str, object], argv: list[str], command: str,
                say: Callable[[str], None]) -> int | None:
    """Start the ranks (``argv``: this command's arguments after ``ft``) and return the exit code ft should end with;
    None when the launch comes to one process, which then trains in this one."""
    chosen = resolve(loaded, flags, visible_gpus)
    return run(loaded, chosen, argv, command, say=say) if chosen.needed else None


def command_that_resumes(argv: list[str]) -> str:
    """This command line (``argv``: ``sys.argv``), as the one that resumes the run; under torchrun, the launcher's
    (this process's parent); in a rank ``ft train --num-processes`` started, ft's (``FT_RESUME_COMMAND``)."""
    from ..outputs.checkpoints import resume_command

    if os.environ.get(RESUME_COMMAND_ENV):
        return os.environ[RESUME_COMMAND_ENV]
    launched = "TORCHELASTIC_RUN_ID" in os.environ
    return resume_command(argv, Path(f"/proc/{os.getppid()}/cmdline") if launched else None)


def resolve(loaded: LoadedRecipe, flags: dict[str, object], visible_gpus: Callable[[], int]) -> Launch:
    """The launch from the CLI's flags, else the recipe's ``launch:`` section, else one process. ``auto`` processes
    are the visible GPUs (one on a machine without)."""
    section = getattr(loaded.recipe, "launch", None)
    base_dir = loaded.source.resolve().parent

    def pick(name: str, default=None):
        value = flags.get(name)
        if value is None and section is not None:
            value = getattr(section, name, None)
        return default if value is None else value

    count = pick("num_processes", 1)
    if count == "auto":
        count = max(visible_gpus(), 1)
    config = pick("accelerate_config")
    launch = Launch(int(count), int(pick("nnodes", 1)), int(pick("node_rank", 0)), pick("master_addr"),
                    pick("master_port"), pick("rdzv_endpoint"), (base_dir / config) if config else None,
                    int(pick("join_timeout", 300)))
    problems = _problems(launch)
    if problems:
        raise loaded.error(problems)
    return launch


def _problems(launch: Launch) -> list[Problem]:
    problems = []
    if launch.num_processes < 1:
        problems.append(Problem("launch.num_processes", "must be at least 1 (or `auto`: the visible GPUs)."))
    if launch.node_rank >= launch.nnodes:
        problems.append(Problem("launch.node_rank", f"is {launch.node_rank}, but the ranks of {launch.nnodes} "
                                f"machines are 0..{launch.nnodes - 1}."))
    if launch.nnodes > 1 and not (launch.master_addr or launch.rdzv_endpoint):
        problems.append(Problem("launch.master_addr", f"{launch.nnodes} machines must meet somewhere: give "
                                "--master-addr (and --master-port) of node 0, or --rdzv-endpoint host:port."))
    if launch.rdzv_endpoint and (launch.master_addr or launch.master_port):
        problems.append(Problem("launch.rdzv_endpoint", "give either --rdzv-endpoint or --master-addr/--master-port, "
                                "not both."))
    if launch.accelerate_config is not None and not launch.accelerate_config.is_file():
        problems.append(Problem("launch.accelerate_config", f"{launch.accelerate_config} does not exist; name an "
                                "accelerate config YAML (`accelerate config` writes one)."))
    return problems


def rank_argv(argv: list[str]) -> list[str]:
    """This command's arguments without the launch flags (and their values)."""
    kept, skip = [], False
    for part in argv:
        if skip:
            skip = False
        elif part in FLAGS:
            skip = True
        elif not part.startswith(tuple(flag + "=" for flag in FLAGS)):
            kept.append(part)
    return kept


def run(loaded: LoadedRecipe, launch: Launch, argv: list[str], command: str, say: Callable[[str], None]) -> int:
    """Start the ranks of ``ft train`` (``argv``: this command's arguments after ``ft``), pass stop signals on,
    wait for them, and return the exit code ft should end with. On one machine the output directory is held from
    before the data is prepared until the last rank ends (see the module)."""
    from ..outputs import lock

    holds = launch.nnodes == 1 and launch.accelerate_config is None
    held = lock.output_dir(Path(loaded.recipe.train_args["output_dir"])) if holds else contextlib.nullcontext()
    with held, tempfile.TemporaryDirectory(prefix="ft-launch-") as folder:
        _prepare_data(loaded, launch, say)
        stopped = Path(folder) / "stopped"
        env = {RESUME_COMMAND_ENV: command, LAUNCHED_ENV: "1", STOPPED_ENV: str(stopped),
               **({LOCK_HOLDER_ENV: str(os.getpid())} if holds else {})}
        args = ["-m", "ft", *rank_argv(argv)]
        say(f"ft: starting {launch.describe()}; each runs `python {' '.join(args)}`")
        with _environment(env), _PassSignalsOn(stopped) as relay:
            if launch.accelerate_config is not None:
                codes = _accelerate(launch, args, relay)
            else:
                codes = _elastic(launch, args)
    return ended_with(codes, relay.received, say, launch, command)


def lock_holder() -> int | None:
    """In a rank ft started on one machine: the process id of ft, which holds the output directory for the run
    (``FT_LOCK_HOLDER``); else None."""
    value = os.environ.get(LOCK_HOLDER_ENV, "")
    return int(value) if value.isdigit() else None


def _prepare_data(loaded: LoadedRecipe, launch: Launch, say: Callable[[str], None]) -> None:
    """``ft preprocess`` in this process before the ranks start (node 0 only: the others find it on the shared
    filesystem, or wait for it without a time limit, ``ft.data.prepare_data``)."""
    from ..recipe.methods import METHODS

    recipe = loaded.recipe
    if recipe.data.prepared_path is None or not METHODS[recipe.method].ft_tokenizes or launch.node_rank != 0:
        return
    from .preprocess import preprocess

    say(f"ft: preparing the data once, before the ranks start, into {recipe.data.prepared_path}")
    preprocess(loaded, say=say, wait=True)


def _elastic(launch: Launch, args: list[str]) -> dict[int, int]:
    """Run the ranks through torch.distributed's elastic agent; {global rank: exit code} of those that failed."""
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # ft says what happens, once
    if launch.rdzv_endpoint:
        backend, endpoint, configs = "c10d", launch.rdzv_endpoint, {"join_timeout": launch.join_timeout}
    elif launch.nnodes > 1 or launch.master_port:
        backend = "static"
        endpoint = meeting_point(launch)
        configs = {"rank": launch.node_rank, "timeout": launch.join_timeout}
    else:
        backend, endpoint, configs = "c10d", "localhost:0", {}  # torchrun --standalone: a free port
    config = LaunchConfig(min_nodes=launch.nnodes, max_nodes=launch.nnodes, nproc_per_node=launch.num_processes,
                          run_id="ft", rdzv_backend=backend, rdzv_endpoint=endpoint, rdzv_configs=configs,
                          max_restarts=0, monitor_interval=0.5, start_method="spawn",
                          shutdown_timeout=SHUTDOWN_TIMEOUT, signals_to_handle="SIGHUP,SIGQUIT")  # ft: TERM, INT
    try:
        elastic_launch(config, sys.executable)(*args)
    except ChildFailedError as exc:
        return {rank: failure.exitcode for rank, failure in exc.failures.items()}
    except (DistNetworkError, DistStoreError, RendezvousError) as exc:
        raise LaunchError(_not_met(launch, exc)) from None
    return {}


class LaunchError(FtError):
    """The machines of a run did not meet (exit 2): a port in use, a node that never joined or could not be reached.
    Nothing was trained; the same command runs again once the cause is gone."""


def meeting_point(launch: Launch) -> str:
    """``host:port`` where the machines meet: the c10d rendezvous endpoint, else node 0's address and port."""
    return launch.rdzv_endpoint or f"{launch.master_addr or '127.0.0.1'}:{launch.master_port or 29500}"


def _not_met(launch: Launch, exc: Exception) -> str:
    """The paragraph for a rendezvous that failed: which case it is (from torch's message), where the machines were to
    meet, and what to check."""
    import re

    where, said = meeting_point(launch), first_line(exc)
    port = where.rsplit(":", 1)[-1]
    if "EADDRINUSE" in said or "address already in use" in said.lower():
        return (f"launch: port {port} is in use on this machine, so node 0 cannot serve the rendezvous at {where} "
                f"(--master-port / launch.master_port). Choose a free port, the same on every node, or end the "
                f"process that holds it (`ss -ltnp 'sport = :{port}'` names it).")
    joined = re.search(r"(\d+)/(\d+) clients joined", said)
    count = (f"{joined.group(1)} of {joined.group(2)} nodes joined" if joined
             else f"node {launch.node_rank} could not meet the others")
    return (f"launch: {count} within launch.join_timeout ({launch.join_timeout} s) at {where} (torch: {said}). "
            f"Check that every node runs the same `ft train` with --nnodes {launch.nnodes} and its own --node-rank, "
            f"that each can reach {where} (node 0's address as the others see it; a firewall), and that the scheduler "
            "started them all; raise launch.join_timeout when nodes start minutes apart.")


def _accelerate(launch: Launch, args: list[str], relay: _PassSignalsOn) -> dict[int, int]:
    """``accelerate launch --config_file F -m ft train …`` as a child in its own session (ft passes signals on)."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(launch.accelerate_config),
               *args]
    child = subprocess.Popen(command, start_new_session=True)
    relay.children = lambda: [child.pid]
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - Python retries wait() after a handled signal
            continue
    return {} if code == 0 else {0: code}


def ended_with(failures: dict[int, int], received: int | None, say: Callable[[str], None],
               launch: Launch | None = None, command: str = "") -> int:
    """The exit code ft ends with, from ``failures`` ({rank: its exit code, negative when a signal killed it}) and
    the stop signal this launcher ``received`` (None: none): 0 when every rank ended 0, a signal received or not (it
    came after the last step, so the ranks completed the run and saved final/, as one process does); the ranks' stop
    (143, 130) when they stopped for it, or, on one of several machines, for a signal another machine received (said,
    with the command to run again on each); 2 when the ranks refused the run (they said why); else 1, naming each
    failed rank."""
    if not failures:
        return 0
    codes = {abs(code) if code < 0 else code for code in failures.values()}
    stopped = {exit_code(signum) for signum in STOP_SIGNALS} | set(STOP_SIGNALS)
    if received is not None and codes <= stopped:
        return exit_code(received)
    saved = {exit_code(signum): signum for signum in STOP_SIGNALS}  # a rank's exit after the checkpoint of a stop
    if launch is not None and launch.nnodes > 1 and set(failures.values()) <= saved.keys():
        # another machine was stopped (preempted): every rank agreed on its step and saved one checkpoint
        signum = max(saved[code] for code in failures.values())
        say(f"ft: this node's ranks stopped with the run: another node received {signal_name(signum)} and every "
            f"rank saved the same checkpoint. Resume by running the same command on every node: {command}")
        return exit_code(signum)
    if codes == {2}:
        return 2  # the ranks said why (an invalid recipe, data or resume), once, from rank 0
    detail = ", ".join(f"rank {rank}: {_shown(code)}" for rank, code in sorted(failures.items()))
    say(f"ft: the run failed ({detail}); each rank's error is printed above, and rank 0's traceback is in the "
        "output directory's error.log when ft caught it.")
    return 1


def _shown(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"


class _PassSignalsOn:
    """While open, SIGTERM and SIGINT sent to ft are passed on to every rank (ft's child processes, each the leader
    of its own process group) instead of ending ft; ``received`` is the first one.

    The first is also written to ``note`` before it is passed on: a rank that was not yet ft's child then, or not yet
    the leader of its own group (torch starts the ranks while the signal may come), finds it there as it starts and
    stops before its first step (``stop_if_the_launcher_was``), rather than train the whole run unsignalled."""

    def __init__(self, note: Path | None = None):
        self.received: int | None = None
        self.children: Callable[[], list[int]] = _child_pids
        self.note = note
        self._previous: dict[int, object] = {}

    def __enter__(self):
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._pass_on)
        return self

    def _pass_on(self, signum, _frame):
        if self.received is None and self.note is not None:
            with contextlib.suppress(OSError):
                self.note.write_text(str(signum))
        self.received = self.received or signum
        for pid in self.children():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signum)

    def __exit__(self, *_exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _child_pids() -> list[int]:
    """This process's children, from /proc (Linux; the ranks are started as direct children)."""
    me, pids = str(os.getpid()), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2:].split()[1] == me:  # the field after the state: the parent's pid
                pids.append(int(entry.name))
    return pids


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def stop_if_the_launcher_was() -> None:
    """In a rank ft started: raise ``StoppedBeforeTraining`` when ft took a stop signal before it could pass it on to
    this rank (``_PassSignalsOn``), so that the rank ends as one signalled before its first step would."""
    note = os.environ.get(STOPPED_ENV)
    if note and os.path.exists(note):
        raise StoppedBeforeTraining(int(Path(note).read_text() or signal.SIGTERM))


def watch_parent() -> None:
    """In a rank ft started: ask the kernel to send this process SIGTERM when its parent (ft) dies, so that no rank
    outlives ft even when ft is killed with SIGKILL (Linux; elsewhere a no-op). SIGTERM, not SIGKILL: the rank
    still saves its JIT checkpoint with the others."""
    if os.environ.get(LAUNCHED_ENV) != "1" or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        if os.getppid() == 1:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)
