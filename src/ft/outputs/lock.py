"""One writer at a time: the lock a run holds on its output directory (and ``ft preprocess`` on a
``data.prepared_path``) for as long as it writes there.

Two ``ft train`` into one directory would overwrite each other's checkpoints, ``final/``, recipe.yaml and summary.json,
and with the same recipe the second would resume from the first one's checkpoints while the first still trains; both
would end with exit 0. So a run takes an exclusive ``flock`` on ``<output_dir>/.ft-lock`` before it writes anything
there, and a second one is refused (exit 2) with the holder's process id, host, start time and command, which the
holder writes into the lock file.

- **The kernel holds the lock**, not the file: it is released when the holder's last descriptor closes, so a holder
  ended by SIGKILL, a crash or a reboot leaves a lock file that blocks nobody. (A process forked while the lock is held,
  such as a data-loader worker, shares the descriptor and keeps the lock while it lives.)
- **Taking it checks the directory can be written.** The directory is created and the lock file opened in it: a
  path that is a file, a read-only filesystem or a folder without permission is refused (exit 2) before any data is
  prepared or model loaded.
- **A refused run leaves nothing behind.** On release the holder removes the lock file (while it still holds it),
  and the directories the hold created, when they are left empty. A process that opened the file before it was
  removed and then gets the lock sees that the path no longer names its file, and starts over.
- **Re-entrant in one process**: ``ft train --smoke`` holds the smoke directory while it prepares it, then runs
  ``ft train`` there, which takes the same lock again.
- **Held for the ranks**: ``ft train --num-processes N`` holds the output directory in the launching process, which
  names itself to the ranks (``held_by``); rank 0 then finds the lock held by that process and goes on.
- A ``data.prepared_path`` is swapped in whole by ``ft.data.cache`` (written beside it, then renamed), so its lock is
  a file beside it, ``<prepared_path>.ft-lock``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..errors import FtError
from ..recipe.redact import redact_arguments

LOCK_NAME = ".ft-lock"  # in the output directory
PREPARED_SUFFIX = ".ft-lock"  # beside a data.prepared_path
_ATTEMPTS = 100  # times to open and lock again when the file was removed under us (a holder releasing)


class Busy(FtError, exit_code=2):
    """Another process holds what this command would write (exit code 2)."""


class NotWritable(FtError, exit_code=2):
    """The directory a command writes cannot be created or written (exit code 2)."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as the holder wrote it into the lock file."""

    pid: int
    host: str
    started: str
    command: str

    def render(self) -> str:
        return f"process {self.pid} on {self.host}, started {self.started} (`{self.command}`)"

    @classmethod
    def read(cls, fd: int) -> Holder | None:
        """The holder written in the open lock file ``fd``; None while it has not written itself yet."""
        try:
            content = json.loads(os.pread(fd, 65536, 0).decode())
            return cls(int(content["pid"]), str(content["host"]), str(content["started"]), str(content["command"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


def lock_file(path: Path, prepared: bool = False) -> Path:
    """The lock file of an output directory (``<path>/.ft-lock``), or of a ``data.prepared_path`` (beside it)."""
    return path.with_name(path.name + PREPARED_SUFFIX) if prepared else path / LOCK_NAME


def output_dir(path: Path, *, held_by: int | None = None, key: str = "train.output_dir",
               command: str = "ft train") -> contextlib.AbstractContextManager[None]:
    """Hold the output directory ``path`` for a run (``key``: the recipe key that names it; ``command``: what writes
    it, in the refusal). ``held_by``: the process id that holds it for this one (the launcher of its ranks)."""

    def busy(holder: str, pid: int | None) -> str:
        stop = (f"stop it (`kill {pid}` saves a checkpoint; the same command then resumes it), " if pid else "")
        return (f"{key}: {path} is in use by another run: {holder} holds {lock_file(path)}. Two runs writing one "
                "output directory overwrite each other's checkpoints, final/ and summary.json (with the same recipe, "
                f"the second would resume from the first one's checkpoints while it trains). Wait for it to end, "
                f"{stop}or set {key} to another directory.")

    return _hold(lock_file(path), path, key, f"{command} writes its checkpoints, final/ and summary.json there",
                 busy, held_by=held_by)


def prepared_path(path: Path, *, wait: bool = False, say: Callable[[str], None] | None = None,
                  only_if_writable: bool = False) -> contextlib.AbstractContextManager[None]:
    """Hold ``data.prepared_path`` while the prepared data is checked and written there. ``wait``: when another
    process holds it, say so and wait for it (``ft train``, which then reuses what it wrote) instead of refusing.
    ``only_if_writable``: where the lock file cannot be written, go on without it (``ft train`` reading prepared data
    from a read-only place, which it only writes when it is stale; then that write fails as it would)."""

    def busy(holder: str, _pid: int | None) -> str:
        return (f"data.prepared_path: {path} is being written by {holder} (it holds {lock_file(path, True)}). Wait "
                "for it to finish (ft train then reuses what it wrote), or set data.prepared_path elsewhere.")

    held = _hold(lock_file(path, prepared=True), path.parent, "data.prepared_path",
                 "the prepared dataset is written beside it and renamed into place", busy, wait=wait, say=say)
    return _or_without(held) if only_if_writable else held


@contextlib.contextmanager
def _or_without(held: contextlib.AbstractContextManager[None]) -> Iterator[None]:
    """``held``, or nothing where its lock file cannot be written."""
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(NotWritable):
            stack.enter_context(held)
        yield


_held: dict[str, list[int]] = {}  # lock file -> [descriptor, holds]: the locks this process holds


@contextlib.contextmanager
def _hold(lock: Path, folder: Path, key: str, why: str, busy: Callable[[str, int | None], str], *, wait: bool = False,
          say: Callable[[str], None] | None = None, held_by: int | None = None) -> Iterator[None]:
    """Hold ``lock`` (a file in ``folder``, created with its missing parents) for the block; see the module."""
    name = os.path.realpath(lock)
    if name in _held:  # this process holds it already
        _held[name][1] += 1
        try:
            yield
        finally:
            _held[name][1] -= 1
        return
    created = _missing_parents(folder)
    try:
        fd = _acquire(lock, folder, key, why, busy, wait, say, held_by)
    except BaseException:
        _remove_empty(created)
        raise
    if fd is None:  # held for this process by the one that started it
        yield
        return
    _held[name] = [fd, 1]
    try:
        _write_holder(fd, lock, key, why)
        yield
    finally:
        del _held[name]
        _release(fd, lock, created)


def _acquire(lock: Path, folder: Path, key: str, why: str, busy: Callable[[str, int | None], str], wait: bool,
             say: Callable[[str], None] | None, held_by: int | None) -> int | None:
    """The descriptor of ``lock``, locked by this process; None when ``held_by`` holds it for us."""
    for _ in range(_ATTEMPTS):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:  # a holder removed the folder it had made between our mkdir and open
            continue
        except OSError as exc:
            raise NotWritable(_not_writable(folder, key, why, exc)) from None
        try:
            if not _try_lock(fd):
                holder = Holder.read(fd)
                if held_by is not None and holder is not None and holder.pid == held_by \
                        and holder.host == socket.gethostname():
                    os.close(fd)
                    return None
                if not wait:
                    shown = holder.render() if holder else "another process (it has not yet written who it is)"
                    raise Busy(busy(shown, holder.pid if holder else None))
                if say is not None:
                    say(f"ft: waiting for {holder.render() if holder else 'another process'}, which writes "
                        f"what {key} names ({lock})")
                fcntl.flock(fd, fcntl.LOCK_EX)  # the kernel wakes this process when the holder lets go
            if _same_file(fd, lock):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder removed the file as it let go: ours is no longer the lock file
    raise OSError(errno.EAGAIN, f"could not take {lock}: it was removed {_ATTEMPTS} times while being taken")


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _same_file(fd: int, lock: Path) -> bool:
    """True when ``lock`` still names the file open as ``fd``."""
    try:
        named, opened = os.stat(lock), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _write_holder(fd: int, lock: Path, key: str, why: str) -> None:
    """This process's id, host, start time and command line, into the lock file it holds. A disk too full for these
    few bytes is refused as not writable: the run could write nothing there."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    argv = ["ft" if program in ("ft", "__main__.py") else program, *sys.argv[1:]]
    content = {"pid": os.getpid(), "host": socket.gethostname(),
               "started": datetime.now().astimezone().isoformat(timespec="seconds"),
               "command": shlex.join(redact_arguments(argv))}  # a --set hub_token=... stays out of the file
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(content) + "\n").encode(), 0)
    except OSError as exc:
        raise NotWritable(_not_writable(lock.parent, key, why, exc)) from None


def _release(fd: int, lock: Path, created: list[Path]) -> None:
    """Remove the lock file while it is still held (see the module), let go, and remove the folders the hold made
    that are left empty (a run refused before it wrote anything)."""
    try:
        if _same_file(fd, lock):
            os.unlink(lock)
    except OSError:
        pass  # a lock file left behind blocks nobody
    finally:
        os.close(fd)
    _remove_empty(created)


def _remove_empty(created: list[Path]) -> None:
    """The folders a hold made (deepest first), each removed while it is empty."""
    for folder in created:
        try:
            folder.rmdir()
        except OSError:
            break  # not empty (or gone): the run wrote there, or another run holds it now


def _missing_parents(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist yet, deepest first: those a hold creates."""
    missing = []
    current = folder.absolute()
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    return missing


def _not_writable(folder: Path, key: str, why: str, exc: OSError) -> str:
    """The paragraph for a folder that cannot be created or written: what is in the way, and the fix."""
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        reason = f"{blocker} is a file, not a directory"
    elif exc.errno == errno.EROFS:
        reason = "its filesystem is read-only"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        reason = "permission denied"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason = "its disk is full"
    else:
        reason = exc.strerror or str(exc)
    return (f"{key}: {folder} cannot be written ({reason}); {why}. Set {key} to a directory this user can create "
            "and write (for example with `--set " + key + "=…`), or make that one writable.")
