"""What a run shows: the exact match on held-out prompts (``data.eval_exact_match``: greedy answers compared with
the expected ones) and each method's headline figures in summary.json; end to end, the quickstart's tiny model
really learns the sums, and GRPO from its model answers more of them."""

from __future__ import annotations

import json
import re

import pytest
from conftest import ASSETS, DATA, ROOT, run_ft, tiny_sft
from stand_in import Writer

from ft.data import DataError
from ft.inference.exact_match import HeldOut, answer_tokens, exact_match, held_out_rows, report_line
from ft.outputs.summary import headline
from ft.recipe import RecipeError, load_recipe

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model

# Measured on 2 CPU cores (2026-12-03). conftest's sft_model (the quickstart stopped at 700 of 1200 steps, seed 0)
# answers 0.53-0.64 of the 200 held-out sums by machine (the CPU's kernels change the 700 steps' sums); 700 steps
# sit on the steep part of the curve, so the threshold keeps a wide margin. The quickstart GRPO recipe from that
# model (seeds 0-2, learning rates 1e-4 to 3e-4): the numeric-match reward of the sampled answers, averaged over the
# last 50 steps, beats the first 50 steps' by 0.05 to 0.16; greedy exact match moves by -0.015 to +0.04 at the
# recipe's rate (higher rates lose up to 0.08). The test asks for a reward gain of more than 0.02 and a greedy
# exact match no more than 0.05 below the start's.
SFT_AT_LEAST = 0.3
GRPO_REWARD_GAIN_AT_LEAST = 0.02
GRPO_EXACT_MATCH_KEPT_WITHIN = 0.05

# --- the metric, on a stand-in model -----------------------------------------------------------------------------


class Adder(Writer):
    """Answers ``What is A + B?`` from the (left-padded) prompt: right when A is even, off by one when odd; then
    its end of turn and a stray digit (which must not count)."""

    def written(self, prompt: str) -> list[int]:
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1])
        text = str(a + b if a % 2 == 0 else a + b + 1)
        return (self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
                + self.tokenizer.encode("7", add_special_tokens=False))


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ASSETS)


def test_exact_match_counts_the_greedy_answers_that_equal_the_expected_ones():
    tokenizer = _tokenizer()
    system = {"role": "system", "content": "You are a calculator."}
    rows = [HeldOut([system, {"role": "user", "content": f"What is {a} + {b}?"}], str(a + b))
            for a, b in [(2, 3), (41, 7), (88, 9), (5, 5), (60, 0)]]
    rows.append({"prompt": "What is 7 + 1?", "answer": " 8 "})  # a text prompt; the answer is compared stripped
    result = exact_match(Adder(tokenizer), tokenizer, rows, max_new_tokens=6, batch_size=4)
    assert result["n"] == 6 and result["ended_turn"] == 1.0  # each answer ends with the end-of-sequence token
    assert result["exact_match"] == round(3 / 6, 4)  # 2+3, 88+9, 60+0 right; 41+7, 5+5, 7+1 off by one
    assert result["examples"][:2] == [{"prompt": "What is 2 + 3?", "expected": "5", "got": "5"},
                                      {"prompt": "What is 41 + 7?", "expected": "48", "got": "49"}]
    assert tokenizer.padding_side == "right"  # put back as it was
    cut = exact_match(Adder(tokenizer), tokenizer, rows, max_new_tokens=1, batch_size=4)
    assert cut["ended_turn"] == 0.0  # a one-token budget cuts every answer before its end-of-sequence token
    assert report_line(result) == "ft: exact match on 6 held-out prompts: 0.5 (3 right) (e.g. 'What is 2 + 3?' → '5')"
    # one figure everywhere: 197 of 200 is 0.985 on the console as in summary.json (it once printed 0.98)
    assert ": 0.985 (197 right)" in report_line({**result, "exact_match": round(197 / 200, 4), "n": 200})


def test_the_answers_token_budget_is_the_longest_expected_answer_with_its_end_of_turn():
    """``answer_tokens``: the tokens the longest expected answer takes the model to write, its end of turn included.
    With that budget a model that writes every answer right scores them all, each seen ending its turn; one token
    less hides the longest answer's end, two cut its text."""
    tokenizer = _tokenizer()
    system = {"role": "system", "content": "You are a calculator."}
    rows = [HeldOut([system, {"role": "user", "content": f"What is {a} + {b}?"}], str(a + b))
            for a, b in [(2, 3), (4080, 9002), (88, 9)]]
    needed, index = answer_tokens(Adder(tokenizer), tokenizer, rows)
    assert index == 1 and needed == len(tokenizer.encode("13082", add_special_tokens=False)) + 1
    assert exact_match(Adder(tokenizer), tokenizer, rows, max_new_tokens=needed)["exact_match"] == 1.0
    unended = exact_match(Adder(tokenizer), tokenizer, rows, max_new_tokens=needed - 1)  # its end of turn cut
    assert unended["exact_match"] == 1.0 and unended["ended_turn"] == round(2 / 3, 4)
    cut = exact_match(Adder(tokenizer), tokenizer, rows, max_new_tokens=needed - 2)  # and its last digit
    assert cut["exact_match"] == round(2 / 3, 4)
    text = [HeldOut("What is 6 + 6? ", "12")]  # a text prompt: the answer, then the end-of-sequence token
    twelve = len(tokenizer.encode("12", add_special_tokens=False))
    assert answer_tokens(Adder(tokenizer), tokenizer, text)[0] == twelve + 1


def test_a_written_date_and_its_end_of_turn_take_smollm2_eleven_tokens(smollm2):
    """The case a new user met (issue 47): ISO dates as answers, SmolLM2's tokenizer and template. The old default of
    8 tokens cut every one of them; the budget counts the date's digits one by one and the end of turn."""
    from ft.model.loading import load_tokenizer
    from ft.recipe.schema import ModelSection

    tokenizer = load_tokenizer(ModelSection(name=str(smollm2.parent), gguf_file=smollm2.name))
    chat = [{"role": "user", "content": "Write 5 March 2024 as an ISO 8601 date."}]
    stand_in = Writer(tokenizer)
    needed, _ = answer_tokens(stand_in, tokenizer, [HeldOut(chat, "2024-03-05")])
    assert needed == 11 == len(tokenizer.encode("2024-03-05<|im_end|>", add_special_tokens=False))


def test_held_out_rows_by_format(write_recipe, tmp_path):
    # the quickstart's own source: GRPO's held-out prompts, with their `answer`
    rows = held_out_rows(load_recipe(ROOT / "recipes/quickstart.yaml").recipe)
    assert len(rows) == 200 and len({json.dumps(r.prompt) for r in rows}) == 200
    first = json.loads((DATA / "prompts-eval.jsonl").read_text().splitlines()[0])
    assert (rows[0].prompt, rows[0].answer) == (first["prompt"], first["answer"])
    # data.eval of chats: the conversation up to its last assistant turn, and that turn
    chats = held_out_rows(load_recipe(ROOT / "recipes/quickstart.yaml", ["data.eval_exact_match={n: 50}"]).recipe,
                          50)
    last = json.loads((DATA / "eval.jsonl").read_text().splitlines()[0])["messages"]
    assert len(chats) == 50 and (chats[0].prompt, chats[0].answer) == (last[:-1], last[-1]["content"])
    # preference pairs: the prompt and the chosen answer
    pairs = held_out_rows(load_recipe(ROOT / "recipes/quickstart-dpo.yaml", ["data.eval_exact_match={n: 3}"]).recipe,
                          3)
    pair = json.loads((DATA / "preference-eval.jsonl").read_text().splitlines()[0])
    assert (pairs[0].prompt, pairs[0].answer) == (pair["prompt"], pair["chosen"][0]["content"])


def test_exact_match_by_group_reads_the_field_from_the_rows_as_written(write_recipe, tmp_path):
    """``group_by``: a field of the held-out rows that their format does not keep (an instruction row's ``form``) is
    read from the file as written, and exact match is given per value of it; a row without it is named by line."""
    rows = [{"instruction": "Write the date in ISO 8601.", "input": text, "output": iso, "form": form}
            for text, iso, form in [("5 March 2024", "2024-03-05", "day month"), ("March 5, 2024", "2024-03-05",
                                    "month day"), ("7 June 2023", "2023-06-07", "day month")]]
    held = tmp_path / "dates.jsonl"
    held.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"]["eval_exact_match"] = {"source": {"path": str(held), "format": "instruction"},
                                          "group_by": "form"}
    found = held_out_rows(load_recipe(write_recipe(recipe)).recipe)
    assert [row.group for row in found] == ["day month", "month day", "day month"]
    assert found[1].prompt == [{"role": "user", "content": "Write the date in ISO 8601.\n\nMarch 5, 2024"}]

    tokenizer = _tokenizer()
    echo = [HeldOut(row.prompt, str(2 + 2 * (i != 1)), group=row.group) for i, row in enumerate(found)]

    class Fours(Writer):
        def written(self, prompt: str) -> list[int]:
            return self.tokenizer.encode("4", add_special_tokens=False) + [self.tokenizer.eos_token_id]

    result = exact_match(Fours(tokenizer), tokenizer, echo, max_new_tokens=4)
    assert result["groups"] == {"day month": {"exact_match": 1.0, "n": 2}, "month day": {"exact_match": 0.0, "n": 1}}

    run = tmp_path / "run"  # ft report: a row per group under the exact match
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"status": "completed", "steps": 1, "exact_match": result}))
    report = run_ft("report", str(run)).stdout
    assert re.search(r"\n  day month +1 \(n=2\)\n  month day +0 \(n=1\)", report), report

    held.write_text(held.read_text() + json.dumps({**rows[0], "form": None}) + "\n")
    with pytest.raises(DataError, match=rf"group_by: {held}:4 has no 'form' field"):
        held_out_rows(load_recipe(write_recipe(recipe)).recipe)


def test_exact_match_without_held_out_rows_is_a_recipe_error():
    with pytest.raises(RecipeError, match=r"data\.eval_exact_match: scores held-out prompts"):
        load_recipe(ROOT / "recipes/quickstart-grpo.yaml", ["data.eval_exact_match={n: 10}"])


def test_held_out_rows_without_answers_fail_before_training(write_recipe, tmp_path):
    # read before the first step: a source the metric cannot score must not cost a whole training run
    prompts = tmp_path / "no-answers.jsonl"
    prompts.write_text('{"prompt": "What is 1 + 2?"}\n{"prompt": "What is 3 + 4?"}\n')
    recipe = tiny_sft(tmp_path / "out", max_steps=10_000)
    recipe["data"]["eval_exact_match"] = {"source": {"path": str(prompts), "format": "prompt"}}
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "data.eval_exact_match: no row of data.eval_exact_match.source has both a prompt and an expected " \
           "answer" in result.stderr
    assert "step " not in result.stderr and not list((tmp_path / "out").glob("checkpoint-*"))


def test_the_model_as_loaded_is_scored_first_unless_the_run_resumes(write_recipe, tmp_path):
    import shutil

    recipe = tiny_sft(tmp_path / "out", save_strategy="steps", save_steps=2)
    recipe["data"]["eval_exact_match"] = {"n": 20}
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = _summary(tmp_path / "out")
    before = summary["exact_match_before"]  # a random model: no sum right
    assert before["n"] == 20 and before["exact_match"] == 0.0 and "ended_turn" in before
    lines = [line for line in result.stderr.splitlines() if line.startswith("ft: exact match on 20")]
    assert len(lines) == 2
    assert re.search(r"ft: exact match: answers may take \d+ tokens \(the longest expected answer", result.stderr)
    # both passes are phases of their own, in summary.json and in the console's total (they were in neither)
    phases = summary["phase_seconds"]
    assert phases["exact_match_before"] > 0 and phases["exact_match"] > 0
    assert sum(seconds for seconds in phases.values() if seconds is not None) <= summary["wall_seconds"]
    done = re.search(r"ft: done in ([\d.]+)s \((.*)\); model in", result.stderr)
    assert done and "exact_match_before" in done.group(2) and "exact_match " in done.group(2)
    assert float(done.group(1)) >= phases["exact_match_before"] + phases["train"] + phases["exact_match"]
    assert lines[0].startswith("ft: exact match on 20 held-out prompts before training: 0 (0 right)")
    card = (tmp_path / "out" / "README.md").read_text()  # written at the checkpoint saves: ft's card, not TRL's
    assert f"Fine-tuned from a model of `{ASSETS}`'s config with random weights" in card and "None" not in card
    answers = [json.loads(line) for line in (tmp_path / "out" / "exact_match.jsonl").read_text().splitlines()]
    assert len(answers) == 20 and {"prompt", "expected", "before", "after"} == set(answers[0])
    report = run_ft("report", str(tmp_path / "out"))
    row = next(line for line in report.stdout.splitlines() if line.startswith("exact match before"))
    assert re.search(r"  0 \(n=20, ended [\d.]+\)", row), report.stdout
    # resumed from checkpoint-2: the loaded weights are not the run's start, so there is no baseline to score
    for name in ("summary.json", "final", "checkpoint-4"):
        shutil.rmtree(tmp_path / "out" / name) if name != "summary.json" else (tmp_path / "out" / name).unlink()
    resumed = run_ft("train", str(write_recipe(recipe)))
    assert resumed.returncode == 0 and "resuming from" in resumed.stderr, resumed.stderr[-3000:]
    assert "before training" not in resumed.stderr and "exact_match_before" not in _summary(tmp_path / "out")
    recipe["data"]["eval_exact_match"]["before"] = False
    recipe["data"]["eval_exact_match"]["max_new_tokens"] = 1
    recipe["train"]["output_dir"] = str(tmp_path / "off")
    short = run_ft("train", str(write_recipe(recipe)))  # every sum and its end of turn take more than one token
    assert short.returncode == 2 and "data.eval_exact_match.max_new_tokens: is 1, and the expected answer of " \
        "held-out row" in short.stderr, short.stderr[-3000:]
    assert not (tmp_path / "off" / "checkpoint-2").exists() and "step" not in short.stderr.lower()
    del recipe["data"]["eval_exact_match"]["max_new_tokens"]
    off = run_ft("train", str(write_recipe(recipe)))
    assert off.returncode == 0 and "before training" not in off.stderr
    assert "exact_match_before" not in _summary(tmp_path / "off") and _summary(tmp_path / "off")["exact_match"]


# --- headline figures --------------------------------------------------------------------------------------------


def test_headline_of_each_method():
    dpo = [{"eval_rewards/accuracies": 0.5, "eval_rewards/margins": 0.0, "step": 0},
           {"loss": 0.6, "rewards/accuracies": 0.7, "rewards/margins": 0.2, "step": 10},
           {"eval_rewards/accuracies": 0.93, "eval_rewards/margins": 1.5, "step": 20}]
    assert headline("dpo", dpo) == {
        "source": "eval",
        "reward_accuracy": {"first": 0.5, "last": 0.93, "first_step": 0, "last_step": 20},
        "reward_margin": {"first": 0.0, "last": 1.5, "first_step": 0, "last_step": 20}}
    assert headline("orpo", dpo[1:2])["source"] == "train"  # no evaluation: the training log's
    grpo = [{"reward": 0.4, "rewards/numeric_match/mean": 0.3, "rewards/format/mean": 0.5, "step": 1},
            {"reward": 0.9, "rewards/numeric_match/mean": 0.8, "rewards/format/mean": 0.5, "step": 2}]
    figures = headline("grpo", grpo)
    assert figures["source"] == "train" and figures["reward"]["first"] == 0.4 and figures["reward"]["last"] == 0.9
    assert figures["numeric_match"] == {"first": 0.3, "last": 0.8, "first_step": 1, "last_step": 2}
    assert headline("kto", [{"loss": 1.0, "step": 1}]) == {}


# --- end to end: the quickstart chain ------------------------------------------------------------------------------


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_the_quickstart_model_learns_the_sums(sft_model):
    summary = _summary(sft_model.parent)
    result = summary["exact_match"]
    assert result["n"] == 200 and result["exact_match"] > SFT_AT_LEAST, result
    figures = summary["headline"]
    assert figures["source"] == "eval" and figures["token_accuracy"]["last"] > 0.6, figures
    # eval_strategy 'no': the final evaluation ran after training, timed as its own phase
    assert summary["phase_seconds"]["evaluate"] > 0 and "eval_loss" in summary["final_eval"]


@pytest.mark.full  # the full check (conftest.FULL_CHECK): 200 GRPO steps
def test_grpo_from_the_quickstart_model_samples_more_right_answers(sft_model, tmp_path):
    """The quickstart GRPO recipe as shipped, from the SFT model stopped half way: the sampled answers earn the
    numeric-match reward more often over the last 50 steps than over the first 50 (what GRPO optimizes: the reward
    of the policy's samples), while greedy exact match on the 200 held-out prompts, scored by the run itself before
    and after training, holds. The summary keeps both scores and the reward's first and last figures."""
    out = tmp_path / "grpo"
    result = run_ft("train", "recipes/quickstart-grpo.yaml", "--set", f"model.name={sft_model}",
                    "--set", f"train.output_dir={out}", "--set", "train.save_strategy='no'")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = _summary(out)
    before, after = summary["exact_match_before"], summary["exact_match"]
    assert "ft: exact match on 200 held-out prompts before training" in result.stderr
    assert before == _summary(sft_model.parent)["exact_match"]  # the same code, rows and model: the same answers
    assert after["n"] == 200 and after["exact_match"] >= before["exact_match"] - GRPO_EXACT_MATCH_KEPT_WITHIN, (
        before, after)
    sampled = [entry["rewards/numeric_match/mean"] for entry in json.loads((out / "log_history.json").read_text())
               if "rewards/numeric_match/mean" in entry]
    assert len(sampled) == 20  # logging_steps 10 over 200 steps
    gain = sum(sampled[-5:]) / 5 - sum(sampled[:5]) / 5
    assert gain > GRPO_REWARD_GAIN_AT_LEAST, sampled
    figures = summary["headline"]
    assert figures["source"] == "train" and {"reward", "numeric_match", "format"} <= set(figures)
    assert figures["reward"]["last_step"] == 200
