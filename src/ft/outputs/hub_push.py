"""A finished run on the Hugging Face Hub (``train.push_to_hub``): final/ and summary.json, in one commit, once the
run's report is written.

transformers pushes from two places. During training, each checkpoint save pushes as ``train.hub_strategy`` says (the
model files, and with ``checkpoint`` or ``all_checkpoints`` the checkpoint folder too); ft leaves that as transformers
documents it, but for one push at a time with ``hub_always_push`` (``one_push_at_a_time``). At the end,
``Trainer.save_model`` pushes the whole output directory as soon as the model is saved: for ft that is before
summary.json exists, and that push saves the model a second time into the output directory, so the weights would go up
twice (final/ and the copy). ft's trainers skip that push (``FtTrainerMixin.push_to_hub``) and ``push_final`` makes it
instead: final/'s files at the repository's root (so ``from_pretrained(repo)`` loads it), the model card the trainer
writes, and summary.json, each once.

A push that fails (refused, a server error, the Hub silent for ``FT_HUB_TIMEOUT`` seconds) leaves the run complete on
disk; ``PushFailed`` says why and how to push it by hand, and ``ft train`` exits 1."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..errors import FtError
from ..recipe.errors import first_line

DEFAULT_TIMEOUT = 300.0  # seconds the Hub may stay silent; huggingface_hub's own client waits forever
CONNECT_TIMEOUT = 10.0


class PushFailed(FtError, exit_code=1):
    """The run is saved, the push to the Hub is not (exit code 1). The message is for the user; ``record`` goes into
    summary.json under ``hub``."""

    def __init__(self, message: str, record: dict):
        super().__init__(message)
        self.record = record


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a failed Hub call (huggingface_hub's errors carry the response); None without one (no
    connection, a timeout)."""
    return getattr(getattr(exc, "response", None), "status_code", None)


def silence_limit() -> float:
    """Seconds a Hub call may go without an answer: ``FT_HUB_TIMEOUT``, else ``DEFAULT_TIMEOUT``."""
    return float(os.environ.get("FT_HUB_TIMEOUT") or DEFAULT_TIMEOUT)


def limit_silence() -> None:
    """Give huggingface_hub's shared HTTP client a read/write timeout (it has none), for every call this process makes
    to the Hub from now on: creating the repository, the checkpoint pushes, the final push. A Hub that stops
    answering then ends the push with an error instead of holding a finished run (and its GPUs) forever."""
    from huggingface_hub import get_session

    session = get_session()
    # httpx's Timeout class, from whichever httpx huggingface_hub is built on
    session.timeout = type(session.timeout)(silence_limit(), connect=CONNECT_TIMEOUT)


def push_final(trainer, output_dir: Path, say: Callable[[str], None]) -> dict:
    """Push final/ (at the repository's root), the model card and summary.json in one commit to the repository the
    trainer created, on ``train.hub_revision``; first wait for the checkpoint pushes still under way. Returns what
    went where (summary.json's ``hub``); raises ``PushFailed``."""
    from huggingface_hub import CommitOperationAdd, HfApi

    args = trainer.args
    repo, revision = trainer.hub_model_id, args.hub_revision
    record = {"repo": repo, "revision": revision or "main"}
    failed_checkpoint = _wait_for_checkpoint_pushes(trainer)
    if failed_checkpoint:
        say(f"ft: warning: the last checkpoint push to {repo} failed ({failed_checkpoint}); the final push sends the "
            "model again")
        record["checkpoint_push_failed"] = failed_checkpoint
    files = {path.relative_to(output_dir / "final").as_posix(): path
             for path in sorted((output_dir / "final").rglob("*")) if path.is_file()}
    trainer.create_model_card(model_name=repo.split("/")[-1])  # written into output_dir, as transformers' push does
    files["README.md"] = output_dir / "README.md"
    files["summary.json"] = output_dir / "summary.json"
    try:
        operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path)) for name, path in files.items()]
        step = trainer.state.global_step
        info = HfApi().create_commit(repo_id=repo, operations=operations, revision=revision,
                                     commit_message=f"ft: the model after {step} steps, with summary.json")
    except Exception as exc:  # refused, a server error, no answer: the run itself is complete
        record["error"] = f"{type(exc).__name__}: {first_line(exc)}"
        raise PushFailed(_failure(exc, repo, revision, output_dir), record) from exc
    say(f"ft: pushed final/ and summary.json to {repo} ({record['revision']}): {info.commit_url}")
    return {**record, "commit": info.oid, "files": sorted(files)}


def one_push_at_a_time(trainer):
    """A TrainerCallback for ``train.hub_always_push``: a checkpoint save's push waits, before it begins, for the push
    before it to finish. transformers copies each save's model files into the output directory and uploads that
    folder in the background; with ``hub_always_push`` it starts the next push while the last may still be reading
    those files, and copies the next save's weights over them, so the last push sent torn weights (against the sha256
    it announced to LFS storage: refused, or stored as they were read). Without ``hub_always_push`` transformers skips
    a push while one is under way, and this waits for nothing."""
    from transformers import TrainerCallback

    class OnePushAtATime(TrainerCallback):
        def on_push_begin(self, args, state, control, **kwargs):
            _wait_for_checkpoint_pushes(trainer)  # a failure is said at the end (push_final), as before

    return OnePushAtATime()


def _wait_for_checkpoint_pushes(trainer) -> str | None:
    """Wait for the uploads transformers started at the last checkpoint saves (it runs them in the background and
    never reads their outcome); the first failure among them, if any."""
    pending = getattr(trainer, "push_in_progress", None)
    if pending is None:
        return None
    pending.wait_until_done()
    for job in pending.jobs:
        problem = job.exception()
        if problem is not None:
            return f"{type(problem).__name__}: {first_line(problem)}"
    return None


def _failure(exc: Exception, repo: str, revision: str | None, output_dir: Path) -> str:
    status = status_of(exc)
    if status in (401, 403):
        why = (f"the Hub refused the token here ({status}): give HF_TOKEN (or `hf auth login`) a token that may "
               f"write to {repo}")
    elif isinstance(status, int) and status >= 500:
        why = f"the Hub answered {status} (a failure on its side): try again later"
    elif "Timeout" in type(exc).__name__:  # httpx's timeouts, whichever httpx huggingface_hub is built on
        why = (f"the Hub did not answer for {silence_limit():g} s (FT_HUB_TIMEOUT sets how long ft waits): check the "
               "network, or try again later")
    else:
        why = f"{type(exc).__name__}: {first_line(exc)}"
    return (f"training completed and the run is saved in {output_dir} (final/ and summary.json), but pushing it to "
            f"the Hub repository {repo} failed: {why}. Nothing is lost; to push it by hand: "
            f"{by_hand(repo, revision, output_dir)}.")


def by_hand(repo: str, revision: str | None, output_dir: Path) -> str:
    """The two commands that push a completed run (final/, then summary.json) as ft's push at the end would."""
    on = f" --revision {revision}" if revision else ""
    return (f"`hf upload {repo} {output_dir / 'final'} .{on}` and `hf upload {repo} {output_dir / 'summary.json'} "
            f"summary.json{on}`")
