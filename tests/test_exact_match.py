"""What a run shows: the exact match on held-out prompts (``data.eval_exact_match``: greedy answers compared with
the expected ones) and each method's headline figures in summary.json; end to end, the quickstart's tiny model
really learns the sums, and GRPO from its model answers more of them."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import ASSETS, DATA, ROOT, run_ft, tiny_sft

from ft.inference.exact_match import HeldOut, exact_match, held_out_rows, report_line
from ft.outputs.summary import headline
from ft.recipe import RecipeError, load_recipe

# Measured on 2 CPU cores (2026-12-02). conftest's sft_model (the quickstart stopped at 700 of 1200 steps, seed 0)
# answers 0.53 of the 200 held-out sums; 700 steps sit on the steep part of the curve (500 steps: 0.04-0.21 over
# seeds), so the threshold keeps a wide margin. The quickstart GRPO recipe from that model: 0.64, 0.65 and 0.59
# (seeds 0, 1, 2), a gain of 0.06-0.12; the test asks for more than 0.03.
SFT_AT_LEAST = 0.3
GRPO_GAIN_AT_LEAST = 0.03

# --- the metric, on a stand-in model -----------------------------------------------------------------------------


class Adder(torch.nn.Module):
    """Answers ``What is A + B?`` from the (left-padded) prompt: right when A is even, off by one when odd; then
    its end of turn and a stray digit (which must not count)."""

    def __init__(self, tokenizer):
        from transformers import GenerationConfig

        super().__init__()
        self.tokenizer = tokenizer
        self.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    @property
    def device(self):
        return self.anchor.device

    def generate(self, input_ids, attention_mask, generation_config):
        assert (attention_mask[:, -1] == 1).all()  # left padding: every prompt ends at the last column
        rows = []
        for ids in input_ids.tolist():
            a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", self.tokenizer.decode(ids))[-1])
            text = str(a + b if a % 2 == 0 else a + b + 1)
            rows.append(self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
                        + self.tokenizer.encode("7", add_special_tokens=False))
        width = generation_config.max_new_tokens
        new = [row[:width] + [generation_config.pad_token_id] * (width - len(row[:width])) for row in rows]
        return torch.cat([input_ids, torch.tensor(new)], dim=1)


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
    assert result["n"] == 6
    assert result["exact_match"] == round(3 / 6, 4)  # 2+3, 88+9, 60+0 right; 41+7, 5+5, 7+1 off by one
    assert result["examples"][:2] == [{"prompt": "What is 2 + 3?", "expected": "5", "got": "5"},
                                      {"prompt": "What is 41 + 7?", "expected": "48", "got": "49"}]
    assert tokenizer.padding_side == "right"  # put back as it was
    assert report_line(result) == "ft: exact match on 6 held-out prompts: 0.50 (e.g. 'What is 2 + 3?' → '5')"


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


def test_grpo_from_the_quickstart_model_answers_more_of_them(sft_model, tmp_path):
    """The quickstart GRPO recipe as shipped: the same 200 held-out prompts are answered right more often than by
    the SFT model it starts from, and its summary holds the reward's first and last figures (the logged reward is a mean
over 8 prompts, too noisy for a first-to-last comparison of one run; the held-out exact match is the claim)."""
    out = tmp_path / "grpo"
    result = run_ft("train", "recipes/quickstart-grpo.yaml", "--set", f"model.name={sft_model}",
                    "--set", f"train.output_dir={out}", "--set", "train.save_strategy='no'")
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = _summary(sft_model.parent)["exact_match"], _summary(out)["exact_match"]
    assert "ft: exact match on 200 held-out prompts" in result.stderr
    assert after["n"] == before["n"] == 200
    assert after["exact_match"] > before["exact_match"] + GRPO_GAIN_AT_LEAST, (before, after)
    figures = _summary(out)["headline"]
    assert figures["source"] == "train" and {"reward", "numeric_match", "format"} <= set(figures)
    assert figures["reward"]["last_step"] == 200
