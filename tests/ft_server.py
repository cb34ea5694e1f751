"""A fork server for the test suite's ``ft`` commands: it imports what ``ft train`` imports (torch, transformers, TRL,
PEFT, datasets, bitsandbytes: about 4 of the 5-6 seconds a smoke run takes on 2 cores) once, then forks one child per
command, and each child runs ``python -m ft ARGS`` as that command would: ``runpy`` runs ``ft.__main__`` as
``__main__`` with ``sys.argv`` set, in the command's folder and environment, with stdin on /dev/null and stdout and
stderr in files, and it ends as the interpreter ends (``SystemExit``, an uncaught exception's traceback and exit 1,
the threads joined, atexit handlers) but for the module teardown (``_exit``). The suite runs some 300 commands; this is
what keeps it within CI's time.

What differs from a fresh process is only what was decided at import, that the imports' objects are frozen out of the
garbage collector's sight (``gc.freeze``: they live as long as the process anyway), and the teardown skipped. The
server's environment is the one the commands run with (``conftest.run_ft`` sends one whose environment differs, but for
``PYTEST_CURRENT_TEST``, to a fresh process instead), and bitsandbytes is imported as ``ft.model.bnb_import`` imports it
for a run that uses none of its code (a QLoRA run here runs its fallback kernels uncompiled, with the same results).
Tests of what a command imports run their own interpreter. A fork is safe only from one Python thread (another could
hold a lock the child then waits on forever): the server checks that it runs no other before each fork and answers
``fresh`` otherwise, and the client then starts a fresh process. The native thread pools these imports start (OpenBLAS's
through numpy, jemalloc's through pyarrow) release their locks around a fork themselves, as every forked ``DataLoader``
worker and ``datasets.map(num_proc=...)`` relies on.

Under pytest-xdist the session imports once for all its test processes: the controller starts a root
(``start_root``), which imports on the first test process's call and then forks one server per test process
(``ForkServer.joined``), each as if it had imported itself (the same imports, the same environment: the root's is
the controller's, and a test process's differs only by variables nothing reads at import, ``READ_AS_IT_RUNS``): one
import for the session, not one per test process. A test process whose environment has changed starts its own.

Protocol, over a connection (``multiprocessing.connection``, a Unix socket: the one on the file descriptor named by
argv[1], or one the root accepted): the client sends ``{"args", "env", "cwd", "stdout", "stderr"}`` (``stdout``
None: a terminal's descriptor follows, passed with ``multiprocessing.reduction.send_handle``); the server answers
``{"pid"}`` (or ``{"fresh": why}``) once the child has started and ``{"status"}`` (``os.waitstatus_to_exitcode``)
once it has ended; EOF ends the server. A server the root forked first says ``{"pid", "env"}``: its own process and
the environment it imported with."""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from multiprocessing import reduction
from multiprocessing.connection import Connection, Pipe
from pathlib import Path

import quick_lane


def preload() -> None:
    """Import, once, what every ``ft train`` imports before it trains (``ft.run.stack.TRAINING``, bitsandbytes as a run
    without its code imports it), but for TRL's trainers: they import trackio, which reads ``TRACKIO_DIR`` at import,
    and ``ft.machine.trackers`` sets it, per run, before they are imported; and build the recipe classes every command
    builds (cached per process, as in a command that reads two recipes)."""
    import ft.cli  # noqa: F401
    from ft.model.bnb_import import import_bitsandbytes
    from ft.run.stack import TRAINING

    import_bitsandbytes(uses_it=False)
    for name in TRAINING:
        importlib.import_module(name)
    from torch.utils import tensorboard  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    import ft.plan  # noqa: F401
    import ft.run.train  # noqa: F401
    from ft.recipe.methods import METHODS
    from ft.recipe.schema import recipe_model

    for method in METHODS:  # each method's recipe class, built once (pydantic, 0.1 s per command that reads a recipe)
        recipe_model(method)


def child(request: dict, connection: Connection) -> None:
    """In the forked child: become ``python -m ft ARGS`` run in ``cwd``; ends the interpreter, never returns."""
    connection.close()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = request["terminal"] if path is None else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(request["env"])
    quick_lane.forbid_training_if_quick()
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()  # as `python -m` puts the current folder first
    sys.argv = ["-m", *request["args"]]
    interrupted = False
    try:
        runpy.run_module("ft", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as done:
        code = _status(done)
    except BaseException as error:  # noqa: BLE001 (the interpreter's own handling of an uncaught exception)
        sys.excepthook(type(error), error, error.__traceback__)
        code, interrupted = 1, isinstance(error, KeyboardInterrupt)
    _exit(code, interrupted)


def _status(done: SystemExit) -> int:
    """The exit status the interpreter gives ``done``: None is 0, an integer itself, anything else printed and 1."""
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    print(done.code, file=sys.stderr)
    return 1


def _exit(code: int, interrupted: bool) -> None:
    """End as the interpreter ends, without its last step. ``Py_FinalizeEx`` waits for the threads that are not daemons
    (``threading._shutdown``, which also stops ``concurrent.futures``' idle workers), runs the atexit handlers
    (logging's flush, tempfile's and multiprocessing's clean-ups, trackers' last uploads), flushes stdout and
    stderr, and then tears the modules down. That last step changes nothing a command leaves behind, and prints
    nothing: what ft writes is closed by then, and ft has moved what is alive when its command returns out of the
    collector's sight (``ft.cli``: ``gc.freeze``; a frozen object whose ``__del__`` raises printed nothing at a
    fresh exit). But in a forked child it writes to each page the fork shares with the server (reference counts),
    and the kernel copies them: 0.5 s of the 0.9 s a forked ``ft validate`` took. An uncaught KeyboardInterrupt ends
    the process by SIGINT, as the interpreter ends it."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def prepare() -> None:
    """``preload`` with no garbage collections while it imports, as ``ft train`` imports (ft.run.stack: 2 s of CPU
    less); what the imports made lives as long as the process: out of the garbage collector's sight (its permanent
    generation), each child's collections walk only what the child makes. A forked tiny `ft train` took 1.15 s with
    every collection walking the imported modules' objects (accelerate's gc.collect alone 0.23 s), 0.65 s without."""
    gc.disable()
    preload()
    gc.freeze()
    gc.enable()


def serve(connection: Connection) -> None:
    """Fork a child per request on ``connection`` until it ends (EOF)."""
    while True:
        try:
            request = connection.recv()
            # a terminal for stdout comes as the descriptor itself (a container's /dev/pts may not be opened by name)
            request["terminal"] = reduction.recv_handle(connection) if request["stdout"] is None else None
        except EOFError:
            return
        if threading.active_count() != 1:
            connection.send({"fresh": f"the server runs {threading.active_count()} Python threads"})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(request, connection)
        if request["terminal"] is not None:
            os.close(request["terminal"])
        connection.send({"pid": pid})
        _, status = os.waitpid(pid, 0)
        connection.send({"status": os.waitstatus_to_exitcode(status)})


def root(listener: socket.socket, lifeline: int) -> None:
    """Serve the session's test processes from one import: on each connection to ``listener`` (a Unix socket, listening
    before any test process starts), fork a server for that connection; import first (``prepare``), on the first.
    Ends when ``lifeline`` (a pipe the controller holds open) reads EOF: the session is over. The servers it forked end
    with their test processes' connections."""
    env = dict(os.environ)  # what the imports read, as they start to
    prepared = False
    while True:
        ready, _, _ = select.select([listener, lifeline], [], [])
        if lifeline in ready:
            break
        accepted, _ = listener.accept()
        if not prepared:
            prepare()
            prepared = True
        pid = os.fork()
        if pid == 0:
            listener.close()
            os.close(lifeline)
            connection = Connection(accepted.detach())
            connection.send({"pid": os.getpid(), "env": env})
            serve(connection)
            os._exit(0)
        accepted.close()
        _reap()
    _reap()


def _reap() -> None:
    """Collect the exit status of the servers that have ended (their test processes are done)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


ROOT_ADDRESS = "FT_TESTS_FORK_ROOT"  # the root's socket, for the test processes; set in the controller's environment


def start_root(env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """Start the session's root with environment ``env`` (``ROOT_ADDRESS`` in it names its socket); returns it and the
    lifeline to close when the session ends. The socket listens before this returns, so a test process started
    afterwards finds it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(env[ROOT_ADDRESS])
        listener.listen(16)
    except OSError:
        listener.close()
        raise
    lifeline, held = os.pipe()
    process = subprocess.Popen([sys.executable, __file__, "--root", str(listener.fileno()), str(lifeline)], env=env,
                               pass_fds=[listener.fileno(), lifeline], stdin=subprocess.DEVNULL)
    listener.close()
    os.close(lifeline)
    return process, held


# variables nothing reads as it is imported, only as a command runs (the child is given them): pytest's own, which
# changes with every test; pytest-xdist's in its test processes, and the terminal's size they find set there
# (COLUMNS, LINES: read as output is laid out, by rich's Console as it is made and by click's help); NO_COLOR
# (ft.data.show, rich's Console as it is made); FT_DEBUG (ft.cli and ft.run.notices, as the command starts);
# FT_HUB_TIMEOUT (ft.outputs.hub_push, at each push); ft's cache settings (ft.caching, as a command looks for what it
# keeps), which conftest's session fixture sets in each test process; torch's compiler cache folder (torch._inductor
# reads it as it compiles, and sets it in the process that first asks for it: a test process that has compiled)
READ_AS_IT_RUNS = ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
                   "COLUMNS", "LINES", "NO_COLOR", "FT_DEBUG", "FT_HUB_TIMEOUT", "FT_CACHE_DIR", "FT_CACHE_DATA",
                   "FT_CACHE_GGUF_WEIGHTS", "TORCHINDUCTOR_CACHE_DIR")


def _imported(env: dict[str, str]) -> dict[str, str]:
    """What of ``env`` the server's imports could have read: all of it, but for ``READ_AS_IT_RUNS``."""
    return {key: value for key, value in env.items() if key not in READ_AS_IT_RUNS}


class ForkServer:
    """The client: one server per test process, started by its first command (or forked for it by the session's root:
    ``joined``), ended with that process."""

    def __init__(self, env: dict[str, str], joined: tuple[Connection, int] | None = None):
        """A server started with ``env``, or, with ``joined`` (its connection and process), one the root forked."""
        self.env = env
        if joined is None:
            self.connection, theirs = Pipe()
            self.process = subprocess.Popen([sys.executable, __file__, str(theirs.fileno())], env=env,
                                            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
            self.pid = self.process.pid
            theirs.close()
        else:
            (self.connection, self.pid), self.process = joined, None
        self.lock = threading.Lock()
        self.broken = False

    @classmethod
    def joined(cls, address: str) -> ForkServer | None:
        """A server the session's root (at the socket ``address``) forks for this process; None if there is none."""
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.connect(address)
        except OSError:
            client.close()
            return None
        connection = Connection(client.detach())
        try:
            hello = connection.recv()
        except (EOFError, OSError):
            connection.close()
            return None
        return cls(hello["env"], (connection, hello["pid"]))

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a command with environment ``env`` runs here: ``env`` is the server's, but for the variables read
        only as a command runs (``READ_AS_IT_RUNS``, which the child is given)."""
        return _imported(env) == _imported(self.env)

    def start(self, command: list[str], env: dict[str, str], cwd: Path, terminal: int | None = None) -> Forked | None:
        """``command`` (``python -m ft ARGS``) started as ``subprocess.Popen`` starts it, its stdout and stderr
        captured, or its stdout the file descriptor ``terminal`` (a pseudo-terminal's); None when this server cannot
        (busy with another thread's command, another Python thread, or gone)."""
        if self.broken or not self.lock.acquire(blocking=False):
            return None
        folder = tempfile.TemporaryDirectory()
        out, err = Path(folder.name) / "stdout", Path(folder.name) / "stderr"
        try:
            self.connection.send({"args": command[3:], "env": env, "cwd": str(cwd),
                                  "stdout": None if terminal is not None else str(out), "stderr": str(err)})
            if terminal is not None:
                reduction.send_handle(self.connection, terminal, self.pid)
            reply = self.connection.recv()
        except (EOFError, OSError):
            self.broken = True
            reply = {"fresh": "the server is gone"}
        if "fresh" in reply:
            folder.cleanup()
            self.lock.release()
            return None
        return Forked(self, command, reply["pid"], folder)

    def run(self, command: list[str], env: dict[str, str], cwd: Path,
            timeout: float) -> subprocess.CompletedProcess | None:
        """``command`` run as ``subprocess.run(..., text=True, capture_output=True, timeout=timeout)`` runs it; None
        when this server cannot."""
        if (forked := self.start(command, env, cwd)) is None:
            return None
        try:
            out, err = forked.communicate(timeout)
        except subprocess.TimeoutExpired:
            forked.kill()
            out, err = forked.communicate()
            raise subprocess.TimeoutExpired(command, timeout, out, err) from None
        return subprocess.CompletedProcess(command, forked.returncode, out, err)

    def close(self) -> None:
        self.connection.close()
        if self.process is not None:  # a server the root forked is the root's to collect
            self.process.wait(timeout=60)


class Forked:
    """A command the server forked, with the part of ``subprocess.Popen``'s interface the tests use; it holds the
    server (its lock) until its exit status has been read."""

    def __init__(self, server: ForkServer, command: list[str], pid: int, folder: tempfile.TemporaryDirectory):
        self.server, self.args, self.pid, self.folder = server, command, pid, folder
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.server.connection.poll(0):
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self.server.connection.poll(timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._ended()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Its stdout (empty where a terminal was its stdout) and stderr once it has ended, read as text mode reads a
        pipe (the locale's encoding, universal newlines)."""
        self.wait(timeout)
        folder = Path(self.folder.name)
        try:
            out = folder / "stdout"
            return (out.read_text() if out.exists() else ""), (folder / "stderr").read_text()
        finally:
            self.folder.cleanup()

    def _ended(self) -> None:
        self.returncode = self.server.connection.recv()["status"]
        self.server.lock.release()


if __name__ == "__main__":
    if sys.argv[1] == "--root":
        root(socket.socket(fileno=int(sys.argv[2])), int(sys.argv[3]))
    else:
        prepare()
        serve(Connection(int(sys.argv[1])))
