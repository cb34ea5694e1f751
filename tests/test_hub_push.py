"""`train.push_to_hub`, pushed for real: `ft train` talks HTTP to a local stand-in for the Hub (tests/fake_hub.py,
through HF_ENDPOINT), which keeps every repository, branch, commit and uploaded byte.

A finished run sends final/ (at the repository's root) and summary.json in one commit, each file once, to the
repository, privacy and branch the recipe names, with the token only in the Authorization header, the weights
through LFS storage as the Hub takes them, byte for byte. `hub_strategy`'s checkpoint pushes happen during training
as transformers documents them. A Hub that refuses or stays silent ends the run with exit 1, the reason and the
commands that push it by hand; nothing local is lost. A token that may not create the repository stops the run before
any model loads."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest
from conftest import hub_env, run_ft, tiny_sft

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model

TOKEN = "hf_pushPlanted0123456789abcdef"
REPO = "someone/tiny-run"


@pytest.fixture(scope="module")
def module_hub(tmp_path_factory):
    """One stand-in for the module and one HF_HOME, so that every command here runs with one environment and is forked
    from one server started with it (conftest.run_ft's ``shared``: 10 s of imports once, not in each); each test
    starts from an empty stand-in (``fake_hub``). HF_HUB_DISABLE_XET for all: see the first test."""
    from fake_hub import FakeHub

    hub = FakeHub()
    yield hub, hub_env(tmp_path_factory.mktemp("hub"), hub, TOKEN, HF_HUB_DISABLE_XET="1")
    hub.close()


@pytest.fixture
def fake_hub(module_hub):
    hub, _ = module_hub
    hub.reset()
    return hub


@pytest.fixture
def push_env(module_hub) -> dict:
    return module_hub[1]


def _recipe(tmp_path, strategy: str, **train) -> dict:
    return tiny_sft(tmp_path / "out", push_to_hub=True, hub_model_id=REPO, hub_private_repo=True,
                    hub_revision="experiments", hub_strategy=strategy, hub_always_push=True, save_strategy="steps",
                    save_steps=2, eval_strategy="no", **train)


def _final_commit_holds_the_run(hub, out, revision: str = "experiments") -> dict:
    """The last commit is ft's: every file of final/ at the root, the model card and summary.json; the bytes on the
    branch are the local ones. Returns the uploaded summary."""
    final = {path.relative_to(out / "final").as_posix(): path.read_bytes()
             for path in (out / "final").rglob("*") if path.is_file()}
    last = hub.commits[-1]
    assert last["revision"] == revision and last["message"].startswith("ft: the model after 4 steps")
    assert set(last["files"]) == set(final) | {"README.md", "summary.json"}
    pushed = hub.files(REPO, revision)
    assert {name: pushed[name] for name in final} == final
    assert b"tiny-run" in pushed["README.md"]  # the trainer's model card, named after the repository
    return json.loads(pushed["summary.json"])


def test_a_run_pushes_final_and_summary_once_each_to_the_repo_and_branch_it_names(write_recipe, tmp_path, fake_hub,
                                                                                  push_env):
    """The weights (.safetensors) are answered "lfs" at preupload, as the Hub answers them: they go up through the LFS
    batch API and a PUT of their bytes, and the commit names them by sha256. HF_HUB_DISABLE_XET: huggingface_hub
    sends such files to Xet storage instead whenever hf_xet is installed, which the stand-in does not serve."""
    out = tmp_path / "out"
    fake_hub.lfs_suffixes = (".safetensors",)
    result = run_ft("train", str(write_recipe(_recipe(tmp_path, "end"))), env=push_env, shared=True)
    assert result.returncode == 0, result.stderr[-3000:]

    assert list(fake_hub.repos) == [REPO] and fake_hub.repos[REPO]["private"] is True
    assert len(fake_hub.commits) == 1  # hub_strategy end: no push at the checkpoint saves (steps 2 and 4)
    uploaded = _final_commit_holds_the_run(fake_hub, out)
    assert fake_hub.files(REPO, "main") == {}  # all of it on train.hub_revision
    assert Counter(path for _, _, path in fake_hub.uploads).most_common(1)[0][1] == 1  # no file went up twice
    # the weights through LFS storage, the other files inside the commit; the bytes PUT, once, are the local file's
    weights = (out / "final" / "model.safetensors").read_bytes()
    assert fake_hub.commits[-1]["lfs"] == ["model.safetensors"]
    assert fake_hub.lfs_puts == [(REPO, hashlib.sha256(weights).hexdigest())]
    assert fake_hub.lfs_objects[fake_hub.lfs_puts[0]] == weights == fake_hub.files(REPO, "experiments")[
        "model.safetensors"]

    local = json.loads((out / "summary.json").read_text())
    assert local.pop("hub") == {"repo": REPO, "revision": "experiments", "commit": fake_hub.commits[-1]["oid"],
                                "files": sorted(fake_hub.commits[-1]["files"])}
    assert uploaded == local and uploaded["status"] == "completed" and uploaded["steps"] == 4
    assert f"pushed final/ and summary.json to {REPO} (experiments)" in result.stderr

    # the token went where it must (every call carried it) and nowhere else
    assert set(fake_hub.authorizations) - {None} == {f"Bearer {TOKEN}"}
    assert fake_hub.authorizations.count(f"Bearer {TOKEN}") >= 4  # repository, branch, preupload, commit
    assert not [name for name, content in fake_hub.files(REPO, "experiments").items() if TOKEN.encode() in content]
    assert not [path for path in out.rglob("*") if path.is_file() and TOKEN.encode() in path.read_bytes()]
    assert TOKEN not in result.stdout + result.stderr


@pytest.mark.parametrize("strategy", ["every_save", "checkpoint"])
def test_hub_strategy_pushes_at_each_save_then_the_final_run(write_recipe, tmp_path, fake_hub, push_env, strategy):
    """transformers' documented behaviour: every_save pushes the model at each save; checkpoint also the checkpoint
    as last-checkpoint/ (to resume from); ft's final push comes last, after those have finished.

    With hub_always_push, each save's push goes up whole, its weights the checkpoint's own bytes (through LFS storage,
    which checks them against the sha256 the push announced): transformers copies the next save's weights over the
    files the push before may still be reading, so ft holds the next push until the one before has finished
    (``hub_push.one_push_at_a_time``; without it the step-2 push went up with torn bytes in 2 of 3 runs)."""
    out = tmp_path / "out"
    fake_hub.lfs_suffixes = (".safetensors",)
    result = run_ft("train", str(write_recipe(_recipe(tmp_path, strategy))), env=push_env, shared=True)
    assert result.returncode == 0, result.stderr[-3000:]

    saves = ["Training in progress, step 2", "Training in progress, step 4"]
    expected = saves + ([f"{message}, checkpoint" for message in saves] if strategy == "checkpoint" else [])
    assert sorted(commit["message"] for commit in fake_hub.commits[:-1]) == sorted(expected)
    for step, message in ((2, saves[0]), (4, saves[1])):
        (commit,) = [commit for commit in fake_hub.commits if commit["message"] == message]
        weights = (out / f"checkpoint-{step}" / "model.safetensors").read_bytes()
        assert commit["lfs_oids"]["model.safetensors"] == hashlib.sha256(weights).hexdigest(), step
    _final_commit_holds_the_run(fake_hub, out)
    uploads = Counter(path for _, _, path in fake_hub.uploads)
    assert uploads["summary.json"] == 1 and "summary.json" in fake_hub.commits[-1]["files"]
    assert uploads["model.safetensors"] == 3  # at the two saves and at the end
    checkpoint = [path for path in fake_hub.files(REPO, "experiments") if path.startswith("last-checkpoint/")]
    if strategy == "checkpoint":
        state = json.loads(fake_hub.files(REPO, "experiments")["last-checkpoint/trainer_state.json"])
        assert state["global_step"] == 4 and "last-checkpoint/optimizer.pt" in checkpoint
    else:
        assert checkpoint == []


def test_a_failed_checkpoint_push_is_named_and_the_final_push_still_goes_up(write_recipe, tmp_path, fake_hub,
                                                                           push_env):
    """transformers runs the checkpoint pushes in the background and never reads their outcome: ft waits for the last
    of them before its own push, and says when it failed."""
    out = tmp_path / "out"
    fake_hub.refuse_commits["Training in progress"] = 403
    result = run_ft("train", str(write_recipe(_recipe(tmp_path, "every_save"))), env=push_env, shared=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ft: warning: the last checkpoint push to someone/tiny-run failed" in result.stderr
    assert [commit["message"] for commit in fake_hub.commits] == ["ft: the model after 4 steps, with summary.json"]
    _final_commit_holds_the_run(fake_hub, out)
    assert "403" in json.loads((out / "summary.json").read_text())["hub"]["checkpoint_push_failed"]


@pytest.mark.parametrize("failure", ["401", "500", "silent"])
def test_a_hub_that_fails_the_final_push_ends_the_run_with_exit_1_and_nothing_lost(write_recipe, tmp_path, fake_hub,
                                                                                   push_env, failure):
    out = tmp_path / "out"
    if failure == "silent":
        fake_hub.stall.add("commit")
    else:
        fake_hub.refuse["commit"] = int(failure)
    env = {**push_env, "FT_HUB_TIMEOUT": "2"}
    result = run_ft("train", str(write_recipe(_recipe(tmp_path, "end"))), env=env, shared=True)
    assert result.returncode == 1, result.stderr[-3000:]

    said = result.stderr.strip().splitlines()[-1]
    why = {"401": "refused the token here (401)", "500": "answered 500", "silent": "did not answer for 2 s"}[failure]
    assert said.startswith("ft: training completed and the run is saved") and why in said, said
    assert f"hf upload {REPO} {out / 'final'} . --revision experiments" in said
    assert "Traceback" not in result.stderr
    assert fake_hub.commits == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4
    assert summary["hub"]["repo"] == REPO and "commit" not in summary["hub"] and summary["hub"]["error"]
    assert (out / "final" / "model.safetensors").stat().st_size > 0 and (out / "checkpoint-4").is_dir()


def test_a_token_that_may_not_create_the_repository_stops_the_run_before_anything_loads(write_recipe, tmp_path,
                                                                                       fake_hub, push_env):
    out = tmp_path / "out"
    fake_hub.refuse["create"] = 401
    path = write_recipe(_recipe(tmp_path, "end"))
    result = run_ft("train", str(path), env=push_env, shared=True)
    assert result.returncode == 2, result.stderr[-3000:]
    line = next(line for line in result.stderr.splitlines() if "train.hub_model_id" in line)
    assert f"{path}:" in line and "refused to create or open the repository 'someone/tiny-run'" in line
    assert "HF_TOKEN" in line
    assert not out.exists()
