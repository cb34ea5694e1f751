"""Resume resolution: `auto` takes the newest *complete* checkpoint; a bad path is a clear exit-2 error."""

from __future__ import annotations

import pytest
from conftest import run_ft, tiny_sft

from ft.checkpoints import INCOMPLETE_MARKER, ResumeError, resolve_resume


def _checkpoint(out, step: int, complete: bool = True):
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text("{}")
    if not complete:
        (path / INCOMPLETE_MARKER).write_text("in progress")
    return path


def test_auto_skips_incomplete_and_orders_numerically(tmp_path):
    _checkpoint(tmp_path, 9)
    newest_complete = _checkpoint(tmp_path, 10)
    _checkpoint(tmp_path, 12, complete=False)
    assert resolve_resume("auto", tmp_path) == str(newest_complete)
    assert resolve_resume("never", tmp_path) is None
    assert resolve_resume("auto", tmp_path / "empty") is None


def test_explicit_path_must_be_a_complete_checkpoint(tmp_path):
    assert resolve_resume(str(_checkpoint(tmp_path, 3)), tmp_path) == str(tmp_path / "checkpoint-3")
    with pytest.raises(ResumeError, match="not a complete checkpoint"):
        resolve_resume(str(tmp_path / "nope"), tmp_path)


def test_bad_resume_path_exits_2(write_recipe, tmp_path):
    result = run_ft("train", str(write_recipe(tiny_sft(tmp_path / "out"))), "--resume", str(tmp_path / "nope"))
    assert result.returncode == 2 and "--resume" in result.stderr and "Traceback" not in result.stderr
