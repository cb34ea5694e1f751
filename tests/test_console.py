"""What ``ft train`` shows while it trains: one readable line per log event on stderr (ft.trainers.console), and
library notices that do not concern the user hidden (ft.run.notices) unless FT_DEBUG=1 or train.log_level asks."""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
from pathlib import Path

import pytest
from conftest import DATA, run_ft, tiny_sft
from test_grpo import tiny_grpo

from ft.run import notices
from ft.trainers.console import ConsoleCallback, format_log, install, wants_bar

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model

STEPS, EVAL_STEPS = 4, 2
TRAIN_LINE = re.compile(r"^step +(\d+)/(\d+)  loss (\S+)  lr (\S+)  grad (\S+)  acc (\S+)  tok/s (\S+)$")
EVAL_LINE = re.compile(r"^step +(\d+)/(\d+)  eval  loss (\S+)  acc (\S+)$")
SUMMARY_LINE = re.compile(r"^trained (\d+) steps in ([\d.]+) s, mean loss ([\d.]+)$")
# transformers' deprecated property, a notice ft hides: PEFT before 0.22 read it on every LoRA run, TRL reads it each
# time GRPO generates (ft.run.notices)
DEPRECATED_PROPERTY = "`is_gradient_checkpointing` is deprecated"


def lora_recipe(output_dir: Path, eval_file: Path | None, **train) -> dict:
    """The tiny SFT recipe with a LoRA adapter, reporting to ft's default tracker (report_to left unset)."""
    recipe = tiny_sft(output_dir, **train)
    del recipe["train"]["report_to"]
    recipe["adapter"] = {"kind": "lora", "r": 4}
    if eval_file is None:
        del recipe["data"]["eval"]
    else:
        recipe["data"]["eval"] = [{"path": str(eval_file), "format": "chat"}]
    return recipe


def default_run(base: Path) -> Path:
    """One short real run shared by this module and tests/test_trackers.py (run once per session, under ``base``):
    LoRA, evaluation every 2 of 4 steps on 16 rows, a log line every step, the default tracker, a checkpoint at the
    end. Returns its output directory; ``stdout.txt``/``stderr.txt`` beside it hold what ft printed."""
    import yaml

    root = base / "default-run"
    out = root / "out"
    if (root / "stderr.txt").exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    eval_file = root / "eval.jsonl"
    eval_file.write_text("".join((DATA / "eval.jsonl").read_text().splitlines(keepends=True)[:16]))
    recipe = lora_recipe(out, eval_file, max_steps=STEPS, logging_steps=1, eval_strategy="steps",
                         eval_steps=EVAL_STEPS, per_device_eval_batch_size=16, save_strategy="steps",
                         save_steps=STEPS)
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    result = run_ft("train", str(path), env={"FT_DEBUG": None})
    assert result.returncode == 0, result.stderr[-3000:]
    (root / "stdout.txt").write_text(result.stdout)
    (root / "stderr.txt").write_text(result.stderr)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = default_run(tmp_path_factory.getbasetemp())
    return out, (out.parent / "stdout.txt").read_text(), (out.parent / "stderr.txt").read_text()


def test_one_readable_line_per_logging_step_and_evaluation(run):
    """Each line's values are the run's own (log_history.json, as the trackers get them), rounded as shown."""
    out, _, stderr = run
    lines = stderr.splitlines()
    history = json.loads((out / "log_history.json").read_text())
    logged = {row["step"]: row for row in history if "loss" in row}
    evaluated = {row["step"]: row for row in history if "eval_loss" in row}
    train = [TRAIN_LINE.match(line) for line in lines if TRAIN_LINE.match(line)]
    assert [int(m[1]) for m in train] == list(range(1, STEPS + 1)), stderr[-3000:]
    assert all(int(m[2]) == STEPS for m in train)
    for m in train:
        row = logged[int(m[1])]
        assert (m[3], m[4], m[5], m[6]) == (f"{row['loss']:.3f}", f"{row['learning_rate']:.1e}",
                                             f"{row['grad_norm']:.3g}", f"{row['mean_token_accuracy']:.3f}"), m[0]
        assert re.fullmatch(r"\d+(\.\d+)?[kM]?", m[7])  # tokens/s: 372, 21.5k
    evals = [EVAL_LINE.match(line) for line in lines if EVAL_LINE.match(line)]
    # every eval_steps; the one at the last step serves as the final evaluation (no second, identical one)
    assert [int(m[1]) for m in evals] == [EVAL_STEPS, STEPS]
    for m in evals:
        row = evaluated[int(m[1])]
        assert (m[3], m[4]) == (f"{row['eval_loss']:.3f}", f"{row['eval_mean_token_accuracy']:.3f}"), m[0]
    (summary,) = [SUMMARY_LINE.match(line) for line in lines if SUMMARY_LINE.match(line)]
    assert int(summary[1]) == STEPS and float(summary[2]) > 0


def test_no_raw_dicts_nor_noise(run):
    _, stdout, stderr = run
    for text in (stdout, stderr):
        assert "{'loss'" not in text and "{'eval_loss'" not in text and "{'train_runtime'" not in text
        assert "eval_num_tokens" not in text and "eval_runtime" not in text
    assert not stdout.strip()  # ft's messages and lines go to stderr
    assert "kernels" not in stderr  # bitsandbytes' notice (raised where the CPU has AVX512-BF16)
    assert DEPRECATED_PROPERTY not in stderr and "Warning" not in stderr, stderr[-3000:]


@pytest.mark.parametrize("debug", [None, "1"], ids=["hidden", "FT_DEBUG=1"])
def test_ft_debug_shows_the_notices_again(tmp_path, debug):
    """FT_DEBUG=1 brings every library notice back: one GRPO step, whose generation always raises one (TRL reads
    transformers' deprecated property), hidden without it."""
    import yaml

    path = tmp_path / "recipe.yaml"
    recipe = tiny_grpo(tmp_path / "out", [{"name": "numeric_match"}], grpo={"num_generations": 4,
                       "max_completion_length": 4}, max_steps=1, per_device_train_batch_size=4)
    path.write_text(yaml.safe_dump(recipe))
    result = run_ft("train", str(path), env={"FT_DEBUG": debug})
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"FutureWarning: {DEPRECATED_PROPERTY}" in result.stderr) == (debug == "1"), result.stderr[-3000:]
    assert re.search(r"^step 1/1  loss ", result.stderr, re.M)  # the console lines are the same either way
    assert re.search(r"^trained 1 step in ", result.stderr, re.M)


def test_each_filter_hides_its_notice_from_its_source_only():
    """Every NOTICES entry matches its own message where it is raised, and nothing from elsewhere (user code)."""
    samples = {
        r"Failed to load CPU gemm_4bit_forward from kernels-community": "Failed to load CPU gemm_4bit_forward from "
        "kernels-community: No module named 'kernels'. Please make sure you already `pip install kernels` and the "
        "kernels >= 0.11.1",
        r"Skipping publisher trust check for 'kernels-community/": "Skipping publisher trust check for "
        "'kernels-community/quantization-bitsandbytes' because Hugging Face Hub is in offline mode.",
        r"Could not find a config file in .* will assume that the vocabulary was not modified": "Could not find a "
        "config file in assets/smollm2 - will assume that the vocabulary was not modified.",
        r"`is_gradient_checkpointing` is deprecated": "`is_gradient_checkpointing` is deprecated and will be removed "
        "in v6. Use `is_activation_checkpointing` instead.",
        r"You are importing from 'trl\.experimental'": "You are importing from 'trl.experimental'. APIs here are "
        "unstable and may change or be removed without notice.",
        r"OMP_NUM_THREADS/MKL_NUM_THREADS unset, we set it at": "OMP_NUM_THREADS/MKL_NUM_THREADS unset, we set it at "
        "8 to improve oob performance.",
        r"Unknown ((leading|trailing) special token|(second )?separator token|(second )?middle sequence|sequence) "
        r"|TemplateProcessing<single> leading/trailing": "Unknown separator token '<|begin_of_text|>' in "
        "TemplateProcessing<pair>",
        r"There were missing keys in the checkpoint model loaded: \['lm_head\.weight'\]\.$": "There were missing "
        "keys in the checkpoint model loaded: ['lm_head.weight'].",
    }
    assert set(samples) == {notice.message for notice in notices.NOTICES}
    sources = {r"transformers\.modeling_utils": "transformers.modeling_utils",
               r"peft\.utils\.save_and_load": "peft.utils.save_and_load", r"ft\..*": "ft.trainers.orpo",
               r"accelerate\.state": "accelerate.state"}
    with warnings.catch_warnings(record=True) as shown, _captured_logs() as logged:
        warnings.simplefilter("always")
        assert notices.install({})
        for notice in notices.NOTICES:
            text = samples[notice.message]
            if notice.category == "log":
                logging.getLogger(notice.source).warning(text)
                logging.getLogger("bitsandbytes.other").warning(text)  # another logger: shown
            else:
                category = notices._category(notice.warning)
                warnings.warn_explicit(text, category, "lib.py", 1, module=sources[notice.source])
                warnings.warn_explicit(text, category, "mine.py", 1, module="my_callbacks")  # user code: shown
                warnings.warn_explicit("something else", category, "lib.py", 2, module=sources[notice.source])
        _remove_log_filters()
    warned = [str(w.message) for w in shown]
    expected = [samples[n.message] for n in notices.NOTICES if n.category == "warning"]
    assert warned == [text for message in expected for text in (message, "something else")]
    assert logged == [samples[n.message] for n in notices.NOTICES if n.category == "log"]


@pytest.mark.parametrize("train_args, env, hidden", [({}, None, True), ({"log_level": "info"}, None, False),
                                                     ({"log_level": "passive"}, None, False), ({}, "1", False)])
def test_filters_are_off_with_ft_debug_or_an_explicit_log_level(monkeypatch, train_args, env, hidden):
    if env is None:
        monkeypatch.delenv("FT_DEBUG", raising=False)
    else:
        monkeypatch.setenv("FT_DEBUG", env)
    assert notices.wanted(train_args) is hidden


def test_the_line_format():
    line = format_log({"loss": 1.2344, "grad_norm": 1.0812, "learning_rate": 2.7e-3, "tokens_per_second": 21512.3,
                       "mean_token_accuracy": 0.41, "entropy": 6.2, "num_tokens": 3000.0, "epoch": 0.1}, 120, 600,
                      method="sft")
    assert line == "step 120/600  loss 1.234  lr 2.7e-03  grad 1.08  acc 0.410  tok/s 21.5k"
    line = format_log({"eval_loss": 1.1, "eval_mean_token_accuracy": 0.62, "eval_num_tokens": 0.0,
                       "eval_runtime": 3.2, "eval_samples_per_second": 50.0, "eval_steps_per_second": 1.0,
                       "eval_entropy": 6.2, "eval_perplexity": 3.004, "epoch": 0.1}, 7, 600, method="sft")
    assert line == "step   7/600  eval  loss 1.100  acc 0.620  perplexity 3.004"
    dpo = {"loss": 0.69, "learning_rate": 5e-4, "grad_norm": 0.3, "mean_token_accuracy": 0.0,
           "rewards/accuracies": 0.625, "rewards/margins": 0.014, "logps/chosen": -18.0}
    line = format_log(dpo, 2, 10, method="dpo")
    assert line == "step  2/10  loss 0.690  lr 5.0e-04  grad 0.3  acc 0.625  margin 0.014"
    assert format_log({"train_runtime": 61.04, "train_loss": 0.8567, "train_samples_per_second": 3.0}, 400, 400,
                      start_step=200) == "trained 200 steps (steps 201-400) in 61.0 s, mean loss 0.857"


def test_install_replaces_exactly_transformers_printing_callbacks():
    from types import SimpleNamespace

    from transformers import PrinterCallback, ProgressCallback, TrainerCallback
    from transformers.trainer_callback import CallbackHandler

    class MyProgress(ProgressCallback):  # a recipe's own subclass stays
        pass

    for printing in (ProgressCallback, PrinterCallback):  # transformers adds one, by train.disable_tqdm
        handler = CallbackHandler([MyProgress(), TrainerCallback()], None, None, None, None)
        handler.add_callback(printing)
        install(SimpleNamespace(callback_handler=handler, add_callback=handler.add_callback,
                                remove_callback=handler.remove_callback))
        assert [type(cb) for cb in handler.callbacks] == [MyProgress, TrainerCallback, ConsoleCallback]


class _Terminal:
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("disable_tqdm, env, bar", [(None, None, True), (False, "0", True), (True, None, False),
                                                    (None, "1", False), (None, "true", False)])
def test_a_bar_only_on_a_terminal_unless_tqdm_is_off(monkeypatch, disable_tqdm, env, bar):
    if env is None:
        monkeypatch.delenv("TQDM_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TQDM_DISABLE", env)
    assert wants_bar(disable_tqdm, _Terminal()) is bar
    with open(os.devnull, "w") as piped:
        assert wants_bar(disable_tqdm, piped) is False  # piped, or into a file: lines only


class _captured_logs:
    """Messages that reach the root logger's handlers (what the user would see), as a list."""

    def __enter__(self):
        self.messages: list[str] = []
        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.messages.append(record.getMessage())
        logging.getLogger().addHandler(self.handler)
        return self.messages

    def __exit__(self, *exc):
        logging.getLogger().removeHandler(self.handler)


def _remove_log_filters() -> None:
    for notice in notices.NOTICES:
        if notice.category == "log":
            logger = logging.getLogger(notice.source)
            for existing in list(logger.filters):
                if isinstance(existing, notices._MessageFilter):
                    logger.removeFilter(existing)


def test_a_heartbeat_after_the_first_step_and_every_minute_without_a_line(tmp_path):
    """Logging every 10 steps at 30 s a step, a run once said nothing for five minutes (issue 47, item 5): a line
    after the first step, then one whenever a minute passes without a line, each with the time per step and the time
    left; none where a log line follows the step anyway. (Clock and steps are the callback's inputs here: the
    trainer calls it the same way at each step's end.)"""
    import io

    from transformers import TrainerControl, TrainerState, TrainingArguments

    now = [0.0]
    out = io.StringIO()
    console = ConsoleCallback(stream=out, clock=lambda: now[0])
    args = TrainingArguments(output_dir=str(tmp_path), logging_steps=10, report_to=[], disable_tqdm=True)
    state, control = TrainerState(max_steps=400, logging_steps=10), TrainerControl()
    console.on_train_begin(args, state, control)
    for step in range(1, 13):
        now[0] += 30.0
        state.global_step = step
        console.on_step_end(args, state, control)
        if step == 10:
            console.on_log(args, state, control, logs={"loss": 1.0, "learning_rate": 1e-3})
    lines = out.getvalue().splitlines()
    assert lines == ["step   1/400  30.0 s/step  left 3h19m", "step   3/400  30.0 s/step  left 3h18m",
                     "step   5/400  30.0 s/step  left 3h17m",
                     "step   7/400  30.0 s/step  left 3h16m", "step   9/400  30.0 s/step  left 3h15m",
                     "step  10/400  loss 1.000  lr 1.0e-03", "step  12/400  30.0 s/step  left 3h14m"]
