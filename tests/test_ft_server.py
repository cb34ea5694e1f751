"""The suite's fork server (``tests/ft_server.py``) runs a command as a fresh ``python -m ft`` runs it: the same
stdout, stderr and exit status, in the command's folder and environment; a command whose environment the server was
not started with runs fresh. A forked command ends without the interpreter's module teardown (``ft_server._exit``):
the comparisons below are of commands ended that way."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import conftest
import ft_server
import pytest
from conftest import ROOT, run_ft, start_ft
from ft_server import Forked


def _fresh(*args: str, cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "ft", *args], cwd=cwd, env=env, text=True, capture_output=True,
                          timeout=120)


def _same(forked: subprocess.CompletedProcess, fresh: subprocess.CompletedProcess) -> None:
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_forked_command_prints_and_exits_as_a_fresh_one(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: sft\nmodel: {name: x}\ndata: {train: [{path: rows.jsonl}]}\nlearning_rat: 1\n")
    for args in (("--help",), ("validate", str(bad)), ("no-such-command",)):
        _same(run_ft(*args), _fresh(*args))
    assert run_ft("validate", str(bad)).returncode == 2


def test_a_forked_command_runs_in_its_folder(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    recipe = tmp_path / "r.yaml"
    recipe.write_text("method: sft\nmodel: {name: ./no-model}\ndata: {train: [{path: rows.jsonl}]}\n")
    _same(run_ft("validate", "r.yaml", cwd=tmp_path), _fresh("validate", "r.yaml", cwd=tmp_path))


def test_a_started_command_is_forked_and_read_back():
    process = start_ft("--help")
    assert isinstance(process, Forked)  # the server ran it: the comparisons above are of forked commands
    assert process.wait(timeout=120) == 0
    out, _ = process.communicate()
    assert out == _fresh("--help").stdout


def test_a_command_with_another_environment_runs_fresh():
    """An environment the server's imports did not see (here, what would move torch's threads) cannot be forked; the
    variables only read as a command runs (ft_server.READ_AS_IT_RUNS) may differ."""
    run_ft("--help")
    server = conftest._SERVER[0]
    changed = {**server.env, "OMP_NUM_THREADS": "3"}
    assert not server.serves(changed)
    assert server.serves({**server.env, "PYTEST_CURRENT_TEST": "another test", "NO_COLOR": "1", "FT_DEBUG": "1"})


def test_a_test_leaves_the_environment_as_it_found_it_whatever_its_libraries_did():
    """``datasets.map(num_proc=2)`` swaps ``os.environ`` for a copy, and a monkeypatched variable then stays after the
    patch is undone (what kept FT_CACHE_DATA=0 for the rest of a file and restarted the fork server); the suite's
    ``environment_kept`` puts back the object and every variable."""
    from datasets import Dataset

    original, value = os.environ, os.environ.get("FT_CACHE_DATA")
    with conftest.environment_kept():
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("FT_CACHE_DATA", "changed")
            Dataset.from_dict({"x": [1, 2, 3, 4]}).map(lambda row: row, num_proc=2)
            replaced = os.environ is not original
        stayed = os.environ.get("FT_CACHE_DATA")
        os.environ["FT_LEFT_BEHIND"] = "1"
    assert replaced and stayed == "changed"  # the leak, as it happens without environment_kept
    assert os.environ is original and os.environ.get("FT_CACHE_DATA") == value and "FT_LEFT_BEHIND" not in os.environ


def test_the_test_processes_servers_are_forked_from_one_import():
    """Under pytest-xdist each test process's server is forked for it by the session's root, which imported once
    (``ft_server.root``): the server is not this process's child but the root's."""
    if not os.environ.get(ft_server.ROOT_ADDRESS):
        pytest.skip("no root: one test process (-n 0), or a temporary folder too long for its socket's address")
    run_ft("--help")
    server = conftest._SERVER[0]
    assert server.process is None  # joined, not started here
    parent = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    assert "--root" in Path(f"/proc/{parent}/cmdline").read_text().split("\0")


def test_without_a_socket_for_the_root_the_session_starts_none(tmp_path, monkeypatch):
    """A temporary folder whose path is too long for a Unix socket's address: no root, no address for the test
    processes (each starts its own server, as with -n 0), and nothing left behind."""
    long = tmp_path / ("x" * 120)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    monkeypatch.delenv(ft_server.ROOT_ADDRESS, raising=False)
    roots = list(conftest._ROOT)
    conftest._start_root()
    assert ft_server.ROOT_ADDRESS not in os.environ and conftest._ROOT == roots and list(long.iterdir()) == []
