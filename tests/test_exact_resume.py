"""A run stopped by SIGTERM and resumed ends bit for bit where the uninterrupted run ends, also when training draws
random numbers: LoRA dropout (also on streamed rows, and with lm-eval benchmarks scored at each checkpoint, which
reseed every generator), NEFTune's noise, KTO and a reward model on a LoRA adapter, GRPO's sampling with one step per
generation, also resumed in its third epoch (each epoch's order of the prompts; two processes:
tests/test_multiprocess.py; SFT and DPO with LoRA dropout, GRPO and RLOO with several steps per generation, stopped
at random moments: tests/test_signal_any_moment.py).

The signal is sent by a callback at the end of a chosen step, and the next step is held at its start for longer
than ft waits before it stops one process. transformers' own JIT checkpoint would therefore take its stop after that
step's forward and backward and before its optimizer step, holding the random state of a step it had not finished
(these tests fail with it); ft stops at the step's end, with the Trainer's regular checkpoint."""

from __future__ import annotations

import pytest
from conftest import ASSETS, DATA, ROOT, assert_same_final_weights, run_ft, tiny_sft

from ft.outputs.checkpoints import complete_checkpoints
from ft.run.signals import jit_kill_wait

pytestmark = pytest.mark.slow

SIGTERM_AT = """
import os
import signal
import time

from transformers import TrainerCallback


class SigtermAt(TrainerCallback):
    \"\"\"SIGTERM to this process at the end of optimizer step `step`; the next step then waits `hold` seconds at its
    start, so the stop falls inside that step.\"\"\"

    def __init__(self, step: int, hold: float):
        self.step, self.hold = step, hold

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            time.sleep(self.hold)
"""

LORA_WITH_DROPOUT = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.1}


def _sft(out):
    return tiny_sft(out, max_steps=10, logging_steps=1)


def _preference(method: str):
    def recipe(out):
        base = tiny_sft(out, max_steps=10, logging_steps=1)
        base["method"] = method
        base["data"] = {"train": [{"path": str(DATA / "preference.jsonl"), "format": "preference"}],
                        "max_length": 48}
        base["train"].update(eval_strategy="no", disable_dropout=False)  # TRL turns dropout off unless told
        return {**base, "adapter": LORA_WITH_DROPOUT}
    return recipe


def _grpo(steps_per_generation: int):
    def recipe(out):
        return {"method": "grpo", "model": {"name": str(ASSETS), "init": "random"},
                "data": {"train": [{"path": str(DATA / "prompts.jsonl"), "format": "prompt"}]},
                "optimizer": {"lr": 1.0e-3},
                "grpo": {"num_generations": 4, "max_completion_length": 6, "steps_per_generation": steps_per_generation,
                         "temperature": 1.0,  # a reward the random model's samples earn unequally: they train it
                         "rewards": [{"name": "length_penalty", "args": {"target": 2}}]},
                "train": {"output_dir": str(out), "max_steps": 10, "per_device_train_batch_size": 8,
                          "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0}}
    return recipe


def _grpo_third_epoch(out):
    """16 prompts, 2 a step: an epoch is 8 steps, so the stop (step 20) and the resume fall in the third epoch, whose
    order TRL's sampler draws from where the epochs before left its generator (ft seeds each epoch's order)."""
    recipe = _grpo(1)(out)
    prompts = out.parent / "prompts-16.jsonl"
    prompts.write_text("".join((DATA / "prompts.jsonl").read_text().splitlines(keepends=True)[:16]))
    recipe["data"]["train"][0]["path"] = str(prompts)
    recipe["train"]["max_steps"] = 28
    return recipe


def _sft_lora(out):
    return {**_sft(out), "adapter": LORA_WITH_DROPOUT}


def _sft_neftune(out):
    recipe = _sft(out)
    recipe["train"]["neftune_noise_alpha"] = 5.0
    return recipe


def _sft_streaming(out):
    recipe = _sft_lora(out)
    recipe["data"].update(streaming=True, eval=[])  # the stream's rows, in the order an uninterrupted run reads them
    return recipe


def _sft_benchmarks(out):
    """Scored by lm-eval (which seeds Python's, NumPy's and torch's generators) as each checkpoint is written: every
    other step, the stop's own checkpoint excepted; the LoRA dropout's masks show whether the generators were put
    back."""
    recipe = _sft_lora(out)
    recipe["train"].update(save_strategy="steps", save_steps=2, save_total_limit=1)
    tasks = ROOT / "tasks" / "arithmetic"
    recipe["benchmarks"] = {"tasks": [str(tasks / "sums.yaml"), str(tasks / "choice.yaml")], "when": ["each_save"],
                            "limit": 4}
    return recipe


# LoRA dropout alone is in the streaming and benchmark cases (each adds its own draws or reseeding to it); SFT and DPO
# with LoRA dropout, GRPO and RLOO with four steps per generation are stopped at random moments in
# tests/test_signal_any_moment.py
CASES = {
    "sft-streaming-lora-dropout": (_sft_streaming, 3),
    "sft-neftune": (_sft_neftune, 3),
    "sft-lora-dropout-benchmarks-each-save": (_sft_benchmarks, 3),
    "kto-lora-dropout": (_preference("kto"), 3),
    "reward-lora-dropout": (_preference("reward"), 3),  # the score head is trained whole beside the adapter
    "grpo-one-step-per-generation": (_grpo(1), 3),
    "grpo-resumed-in-its-third-epoch": (_grpo_third_epoch, 19),
}


@pytest.mark.parametrize("case", CASES)
def test_a_run_stopped_by_sigterm_resumes_to_the_uninterrupted_runs_weights(write_recipe, tmp_path, case):
    build, stop_step = CASES[case]
    (tmp_path / "sigterm_at.py").write_text(SIGTERM_AT)
    out = tmp_path / "out"
    stopped = build(out)
    hold = jit_kill_wait() + 0.5
    stopped["callbacks"] = [{"cls": "sigterm_at:SigtermAt", "kwargs": {"step": stop_step, "hold": hold}}]
    args = ["train", str(write_recipe(stopped))]

    first = run_ft(*args)
    assert first.returncode == 143, first.stderr[-3000:]
    (checkpoint,) = complete_checkpoints(out)
    step = int(checkpoint.name.split("-")[1])
    assert step == stop_step + 1, (step, first.stderr[-2000:])  # the end of the held step
    resumed = run_ft(*args)
    assert resumed.returncode == 0 and f"resuming from {checkpoint}" in resumed.stderr, resumed.stderr[-3000:]

    reference = run_ft("train", str(write_recipe(build(tmp_path / "uninterrupted"), name="uninterrupted.yaml")))
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert_same_final_weights(out, tmp_path / "uninterrupted")
