"""A vision-language SFT run (a tiny random LLaVA, images in the rows) stopped by SIGTERM and resumed with
``--resume auto`` ends bit for bit where the uninterrupted run ends: the same final tensors and the same logged loss
and gradient norm at every step. With LoRA (whose dropout draws random numbers every step) it does; a full fine-tune
does not, because transformers' Trainer does not read its checkpoint's weights back (``FULL_NOT_READ_BACK`` below).

What the resume has to carry for a vision run beyond a text one: the dataloader's place in a shuffled epoch (the stop
falls mid-epoch, the resumed run crosses into the next, reshuffled, epoch) and whatever the image collator
(``ft.data.images.ImageBatches``) does per batch. The collator reads each batch's images from disk and runs the
processor on them; it draws no random numbers, so a resumed batch's pixels are the uninterrupted run's.

The stop is taken as tests/test_exact_resume.py takes it: a callback sends SIGTERM to its own process at the end of
step ``STOP_AT``, then holds the next step at its start until ft's stop watch (the SIGTERM handler's owner) is due,
``jit_kill_wait`` seconds after the signal, read from the watch itself. ft then stops at the end of that next step with
a regular checkpoint, ``checkpoint-<STOP_AT + 1>``, however fast or loaded the machine is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import assert_same_final_weights, run_ft
from test_vision import COLOURS, _square, build_tiny_llava

from ft.outputs.checkpoints import complete_checkpoints

pytestmark = pytest.mark.slow

# 3 steps an epoch: checkpoint-4 is one step into the second epoch; the resumed run ends it and starts the third
ROWS, BATCH, STEPS, STOP_AT = 12, 4, 7, 3

STOP_AFTER = """
import os
import signal
import time

from transformers import TrainerCallback

from ft.run.signals import jit_kill_wait


class StopAfter(TrainerCallback):
    \"\"\"SIGTERM to this process at the end of optimizer step `step`; the next step is then held at its start until
    ft's stop watch has waited its `jit_kill_wait` seconds since the signal, so ft stops at that next step's end.\"\"\"

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            watch = signal.getsignal(signal.SIGTERM).__self__  # ft.run.signals.StopWatch, which noted the signal
            assert watch.received == signal.SIGTERM, watch.received
            time.sleep(max(0.0, watch.received_at + jit_kill_wait() - time.monotonic()) + 0.05)
"""


@pytest.fixture(scope="module")
def llava_data(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny random LLaVA's folder and a chat file of ROWS questions about coloured squares of several sizes (the
    pictures beside it, read relative to it)."""
    root = tmp_path_factory.mktemp("vision-resume")
    model = build_tiny_llava(root / "llava")
    names = list(COLOURS)
    rows = []
    for i in range(ROWS):
        colour = names[i % len(names)]
        picture = _square(root / "data" / "images" / f"{i}.png", colour, (24 + 4 * (i % 3), 24 + 8 * (i % 2)))
        rows.append({"messages": [
            {"role": "user", "content": [{"type": "image", "image": picture.relative_to(root / "data").as_posix()},
                                         {"type": "text", "text": "What colour is the square?"}]},
            {"role": "assistant", "content": colour.capitalize()}]})
    data = root / "data" / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return model, data


def _recipe(model: Path, data: Path, out: Path, adapter: dict | None) -> dict:
    recipe = {"method": "sft", "model": {"name": str(model), "init": "random"},
              "data": {"train": [{"path": str(data), "format": "chat"}], "max_length": 64},
              "optimizer": {"lr": 1e-2},
              "train": {"output_dir": str(out), "max_steps": STEPS, "per_device_train_batch_size": BATCH,
                        "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0}}
    if adapter is not None:
        recipe["adapter"] = adapter
    return recipe


def _per_step(out: Path) -> dict[int, tuple[float, float]]:
    """(loss, grad_norm) of each logged training step, from the run's log_history.json."""
    history = json.loads((out / "log_history.json").read_text())
    return {entry["step"]: (entry["loss"], entry["grad_norm"]) for entry in history if "loss" in entry}


# A full fine-tune's checkpoint is read back under the model's own names: save_pretrained writes LLaVA's weights under
# the hub's original names (``language_model.model.*``, ``vision_tower.*``), and transformers 5.25's
# Trainer._load_from_checkpoint would load none of them (huggingface/transformers#43701): ft's trainer mixin renames
# them through the model's conversion mapping first (``ft.trainers.resume_weights``). Without that, the resumed run
# goes on from the weights it was built with, and from step STOP_AT + 2 on its losses are not the uninterrupted run's.
CASES = {
    "full": pytest.param(None, id="full"),
    "lora-dropout": pytest.param({"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.1, "target_modules": "all-linear"},
                                 id="lora-dropout"),
}


@pytest.mark.parametrize("adapter", CASES.values())
def test_a_vision_run_stopped_by_sigterm_resumes_to_the_uninterrupted_runs_weights_and_losses(tmp_path, llava_data,
                                                                                             adapter):
    model, data = llava_data
    (tmp_path / "stop_after.py").write_text(STOP_AFTER)
    out = tmp_path / "out"
    stopped = _recipe(model, data, out, adapter)
    stopped["callbacks"] = [{"cls": "stop_after:StopAfter", "kwargs": {"step": STOP_AT}}]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(stopped, sort_keys=False))
    args = ["train", str(path), "--resume", "auto"]

    first = run_ft(*args)
    assert first.returncode == 143, first.stderr[-3000:]
    (checkpoint,) = complete_checkpoints(out)
    assert checkpoint.name == f"checkpoint-{STOP_AT + 1}", first.stderr[-2000:]
    assert not (out / "final").exists()
    resumed = run_ft(*args)
    assert resumed.returncode == 0 and f"resuming from {checkpoint}" in resumed.stderr, resumed.stderr[-3000:]

    reference_path = tmp_path / "uninterrupted.yaml"
    reference_path.write_text(yaml.safe_dump(_recipe(model, data, tmp_path / "uninterrupted", adapter)))
    reference = run_ft("train", str(reference_path))
    assert reference.returncode == 0, reference.stderr[-3000:]

    assert_same_final_weights(out, tmp_path / "uninterrupted")
    ours, theirs = _per_step(out), _per_step(tmp_path / "uninterrupted")
    assert list(theirs) == list(range(1, STEPS + 1))
    assert ours == theirs  # each step's loss and gradient norm as logged (the stopped run's from its checkpoint)
