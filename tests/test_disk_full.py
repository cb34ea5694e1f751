"""A full disk under the output directory, on a real small filesystem: a tmpfs of a few MB mounted in a private mount
namespace, inside a user namespace of its own where the test's user is root (`unshare -rm`: no privilege needed where
the kernel lets users create namespaces, so it runs as the Docker images' user too; nothing outside the test sees the
mount, and it goes when the test's shell ends). ft stops
cleanly before a checkpoint that would not fit, and names a write that failed anyway (here final/, filled by a
callback as training ends); after space is freed the same command resumes and completes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model

QUICK = ("--set train.max_steps=40 --set train.save_steps=10 --set train.save_total_limit=1 "
         "--set train.eval_strategy=\"'no'\" --set train.eval_on_start=false --set data.eval_exact_match=null "
         "--set train.report_to=none")


# a new user namespace (-r: the caller is root in it, so it may mount) with a mount namespace of its own (-m)
UNSHARE = ["unshare", "--map-root-user", "--mount"]


def _cannot_mount(tmp_path) -> str | None:
    """Why this machine cannot mount a tmpfs in a namespace of the test's own; None when it can."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = tmp_path / "probe"
    probe.mkdir()
    done = subprocess.run([*UNSHARE, "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs "$0"', str(probe)],
                          capture_output=True, text=True)
    if done.returncode == 0:
        return None
    return (f"this machine does not let a user mount a tmpfs in user and mount namespaces of its own (`unshare -rm`: "
            f"{done.stderr.strip() or f'exit {done.returncode}'}): user namespaces are off (sysctl "
            f"user.max_user_namespaces, kernel.unprivileged_userns_clone, AppArmor's restrict_unprivileged_userns) "
            f"or refused by the container's seccomp profile")


def _in_small_disk(tmp_path, script: str, megabytes: int = 6) -> None:
    """Run ``script`` (sh) in private user and mount namespaces with a tmpfs of ``megabytes`` at $MNT; $OUT is outside
    it."""
    if why := _cannot_mount(tmp_path):
        pytest.skip(why)
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    env = {**os.environ, "MNT": str(mnt), "OUT": str(out), "PY": sys.executable, "TQDM_DISABLE": "1",
           "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([*UNSHARE, "sh", "-c", f"mount -t tmpfs -o size={megabytes}m tmpfs $MNT && {script}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _read(tmp_path, name: str) -> str:
    return (tmp_path / "out" / name).read_text()


def test_a_checkpoint_that_would_not_fit_stops_the_run_cleanly_and_it_resumes_once_space_is_freed(tmp_path):
    """6 MB, 2.5 of them taken: checkpoint-10 (1.9 MB) fits, checkpoint-20 would not (1.7 MB free)."""
    command = f"$PY -m ft train recipes/quickstart.yaml --set train.output_dir=$MNT/run {QUICK}"
    _in_small_disk(tmp_path, f"""
        head -c 2500000 /dev/zero > $MNT/ballast
        {command} > $OUT/first.log 2>&1; echo $? > $OUT/first.rc
        ls $MNT/run > $OUT/first.ls; cp $MNT/run/summary.json $OUT/first.json
        rm $MNT/ballast
        {command} > $OUT/second.log 2>&1; echo $? > $OUT/second.rc
        ls $MNT/run > $OUT/second.ls; cp $MNT/run/summary.json $OUT/second.json""")
    first = _read(tmp_path, "first.log")
    assert _read(tmp_path, "first.rc").strip() == "1", first[-3000:]
    assert "ft: warning: " in first and "free on the disk of" in first  # foreseen at the start
    assert "stopped at step 20 before saving checkpoint-20" in first and "The last complete checkpoint is " \
        "checkpoint-10" in first and "Traceback" not in first
    assert "checkpoint-10" in _read(tmp_path, "first.ls").split() and "checkpoint-20" not in _read(tmp_path, "first.ls")
    assert json.loads(_read(tmp_path, "first.json"))["status"] == "failed"
    second = _read(tmp_path, "second.log")
    assert _read(tmp_path, "second.rc").strip() == "0", second[-3000:]
    summary = json.loads(_read(tmp_path, "second.json"))
    assert summary["status"] == "completed" and summary["resumed_from"].endswith("checkpoint-10")
    assert {"final", "checkpoint-40"} <= set(_read(tmp_path, "second.ls").split())


FILL = '''
import os
from transformers import TrainerCallback


class FillDisk(TrainerCallback):
    """Fills the output directory's disk as training ends, before ft writes final/."""

    def on_train_end(self, args, state, control, **kwargs):
        if os.environ.get("FILL") != "1":
            return
        with open(os.path.join(os.environ["MNT"], "filler"), "wb") as f:
            try:
                while True:
                    f.write(b"\\0" * 65536)
                    f.flush()
            except OSError:
                pass
'''


def test_a_write_the_disk_cannot_hold_is_named_with_the_checkpoint_to_resume_from(tmp_path):
    (tmp_path / "filldisk.py").write_text(FILL)
    (tmp_path / "recipe.yaml").write_text(f"extends: {ROOT / 'recipes' / 'quickstart.yaml'}\n"
                                          "callbacks: [{cls: 'filldisk:FillDisk'}]\n")
    command = f"$PY -m ft train {tmp_path / 'recipe.yaml'} --set train.output_dir=$MNT/run {QUICK}"
    _in_small_disk(tmp_path, f"""
        FILL=1 {command} > $OUT/first.log 2>&1; echo $? > $OUT/first.rc
        ls $MNT/run > $OUT/first.ls; cp $MNT/run/summary.json $OUT/first.json
        cp $MNT/run/error.log $OUT/first-error.log
        rm $MNT/filler
        {command} --set train.logging_steps=1 > $OUT/second.log 2>&1; echo $? > $OUT/second.rc
        ls $MNT/run > $OUT/second.ls; cp $MNT/run/final/model.safetensors $OUT/final.safetensors
        cp $MNT/run/checkpoint-40/model.safetensors $OUT/checkpoint.safetensors""", megabytes=12)
    first = _read(tmp_path, "first.log")
    assert _read(tmp_path, "first.rc").strip() == "1", first[-3000:]
    assert "is full: writing final/ failed" in first and "The last complete checkpoint is checkpoint-40" in first
    assert "Traceback" not in first and "not a recipe error" not in first
    assert "final" not in _read(tmp_path, "first.ls").split()  # the half-written final/ is gone
    failure = json.loads(_read(tmp_path, "first.json"))["failure"]
    assert failure["traceback"] == str(tmp_path / "mnt" / "run" / "error.log")  # the disk filled by something else:
    # ft gives back the room it kept for this record (disk.hold_reserve), so the summary and the traceback are written
    assert "Traceback" in _read(tmp_path, "first-error.log")  # the file summary.json names exists
    # the run had trained its last step (checkpoint-40 of 40): resuming writes final/ from it and trains nothing
    second = _read(tmp_path, "second.log")
    assert _read(tmp_path, "second.rc").strip() == "0", second[-3000:]
    assert "final" in _read(tmp_path, "second.ls").split() and "checkpoint-41" not in _read(tmp_path, "second.ls")
    assert "step 41/40" not in second and "nothing is left to train" in second, second[-3000:]
    from safetensors.torch import load_file

    final, checkpoint = (load_file(tmp_path / "out" / name) for name in ("final.safetensors", "checkpoint.safetensors"))
    assert final.keys() == checkpoint.keys() and all((final[k] == checkpoint[k]).all() for k in final)


def test_an_output_dir_on_a_read_only_filesystem_is_refused_before_the_data_is_prepared(tmp_path):
    command = (f"$PY -m ft train recipes/quickstart.yaml --set train.output_dir=$MNT/run "
               f"--set data.prepared_path=$OUT/prepared {QUICK}")
    # read-only as a mount (bind): remounting the tmpfs itself is refused in a user namespace of a user other than
    # root (mount(8) passes back the uid= and gid= it reads, which are not mapped in it)
    _in_small_disk(tmp_path, f"mount -o remount,bind,ro $MNT && {{ {command} > $OUT/ro.log 2>&1; "
                             "echo $? > $OUT/ro.rc; }", megabytes=1)
    log = _read(tmp_path, "ro.log")
    assert _read(tmp_path, "ro.rc").strip() == "2", log[-3000:]
    assert "train.output_dir" in log and "read-only" in log and "Traceback" not in log, log[-3000:]
    assert not (tmp_path / "out" / "prepared").exists()  # refused before the data was prepared


WRITE_WHEN_FULL = """
import json, os, sys
from pathlib import Path
from ft.inference.exact_match import write_answers
from ft.outputs.summary import write_summary

run = Path(os.environ["MNT"]) / "run"
run.mkdir()
write_summary(run, {"status": "stopped", "steps": 10})
with open(Path(os.environ["MNT"]) / "filler", "wb", buffering=0) as filler:  # the disk fills, by something else
    try:
        while True:
            filler.write(b"\\0" * 4096)
    except OSError:
        pass
failed = []
for write in (lambda: write_summary(run, {"status": "failed", "steps": 10, "log": ["x" * 100] * 2000}),
              lambda: write_answers(run / "exact_match.jsonl", {"answers": [{"prompt": "p" * 100, "expected": "1",
                                                                             "got": "2"}] * 2000}, None)):
    try:
        write()
    except OSError as exc:
        failed.append(type(exc).__name__)
print(json.dumps({"failed": failed, "files": sorted(p.name for p in run.iterdir()),
                  "summary": json.loads((run / "summary.json").read_text())}))
"""


def test_summary_and_exact_match_answers_are_written_whole_or_not_at_all_on_a_full_disk(tmp_path):
    (tmp_path / "write_when_full.py").write_text(WRITE_WHEN_FULL)
    _in_small_disk(tmp_path, f"$PY {tmp_path / 'write_when_full.py'} > $OUT/result.json", megabytes=1)
    result = json.loads(_read(tmp_path, "result.json"))
    assert result["failed"] == ["OSError", "OSError"]  # both writes failed for want of space ...
    assert result["files"] == ["summary.json"]  # ... leaving no 0-byte exact_match.jsonl, no temporary file
    assert result["summary"] == {"status": "stopped", "steps": 10}  # and the previous summary.json whole


def test_on_several_processes_every_one_stops_where_any_one_is_short(tmp_path):
    """The guard on each of several processes: each asks its own disk and they agree (``agree``: the largest of every
    process's answer, a collective made only at step ends that save, the same on every process), so all skip the save
    and stop together when one disk is short, and the process whose disk had room says why it stopped too."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from ft.outputs import disk

    def guarded(first_bytes: float, others_short: int):
        asked: list[int] = []

        def agree(short: int, device) -> int:
            asked.append(short)
            return max(short, others_short)

        guard = disk.guard(tmp_path, first_bytes, "ft train recipe.yaml", agree)
        control = guard.on_step_end(SimpleNamespace(device="cpu"), TrainerState(global_step=6),
                                    TrainerControl(should_save=True))
        return guard, control, asked

    guard, control, asked = guarded(1.0, others_short=1)  # room here, another process short
    assert asked == [0] and not control.should_save and control.should_training_stop
    assert guard.refused.startswith("stopped at step 6 before saving checkpoint-6: another process found too little")
    guard, control, asked = guarded(1.0e18, others_short=0)  # short here
    assert asked == [1] and not control.should_save and control.should_training_stop
    assert "has" in guard.refused and "free and a checkpoint needs about" in guard.refused
    guard, control, asked = guarded(1.0, others_short=0)  # room everywhere: the save goes on
    assert asked == [0] and control.should_save and not control.should_training_stop and guard.refused is None
    quiet = disk.guard(tmp_path, 1.0e18, "ft train recipe.yaml", lambda short, device: pytest.fail("asked"))
    quiet.on_step_end(SimpleNamespace(device="cpu"), TrainerState(global_step=5), TrainerControl())  # no save: none
