"""Generate the tiny arithmetic datasets in ``data/arithmetic/``.

Small, deterministic (fixed seed) datasets in every shape the ``ft`` recipes consume:
chat SFT (``messages``), preference pairs (DPO/KTO/ORPO), prompts with checkable answers (GRPO),
instruction/input/output (Alpaca-style) and plain ``text``. Every question adds a one-digit number to a
number below 100 (``What is 47 + 5?``): 1,000 questions, small enough that the quickstart's tiny model
(~150k parameters) really learns them on a CPU in about a minute, carries included, and
checkable exactly. 200 questions are held out: no question in an ``*eval*`` file occurs in a training file,
and every eval file asks each of them once.

Preference pairs are conversations (the SFT chats' system and user turns, then one assistant answer), so the
trainers render them with the chat template the SFT model learned. ``rejected`` is a wrong answer of the
kind the SFT model itself gets wrong: the carry missed or added (off by 10) or the last digit off by 1-3.

Usage: python scripts/make_arithmetic_data.py [--out data/arithmetic]
"""

import argparse
import json
import random
from pathlib import Path

SEED = 1234
SYSTEM = "You are a calculator."
INSTRUCTION = "Add the two numbers."
QUESTIONS = [(a, b) for a in range(100) for b in range(10)]  # a + b: a below 100, b one digit
EVAL_QUESTIONS = 200  # held out for all eval files


def answer(q):
    return str(q[0] + q[1])


def question(q):
    return f"What is {q[0]} + {q[1]}?"


class Sampler:
    """Draws questions from a pool, cycling through it in a fresh random order each time."""

    def __init__(self, pool, rng):
        self.pool, self.rng, self.queue = pool, rng, []

    def __call__(self):
        if not self.queue:
            self.queue = self.rng.sample(self.pool, len(self.pool))
        return self.queue.pop()


def chat_row(draw, rng, multi_turn_rate=0.1):
    messages = [{"role": "system", "content": SYSTEM}]
    for _ in range(2 if rng.random() < multi_turn_rate else 1):
        q = draw()
        messages += [{"role": "user", "content": question(q)},
                     {"role": "assistant", "content": answer(q)}]
    return {"messages": messages}


def wrong_answer(q, rng):
    """A near miss: the carry missed or added (±10), or the last digit off by 1-3; never negative."""
    right = int(answer(q))
    offsets = [-10, 10] if rng.random() < 0.5 else [-3, -2, -1, 1, 2, 3]
    return str(right + rng.choice([d for d in offsets if right + d >= 0]))


def preference_row(draw, rng, wrong=wrong_answer):
    q = draw()
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question(q)}],
            "chosen": [{"role": "assistant", "content": answer(q)}],
            "rejected": [{"role": "assistant", "content": wrong(q, rng)}]}


def wrong_last_digit(q, rng):
    """A near miss in the last digit alone (off by 1-3; never negative): the kind a reward model finds hardest."""
    right = int(answer(q))
    return str(right + rng.choice([d for d in (-3, -2, -1, 1, 2, 3) if right + d >= 0]))


def last_digit_row(draw, rng):
    return preference_row(draw, rng, wrong_last_digit)


def prompt_row(draw, rng):
    """A conversational prompt (the SFT chats' system and user turns), so GRPO renders it with the chat
    template the SFT model learned, and the answer its rewards check."""
    q = draw()
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question(q)}],
            "answer": answer(q)}


def choice_row(draw, rng):
    """A multiple-choice question (an lm-eval task scored by log-likelihood: tasks/arithmetic/choice.yaml): the right
    sum among three near misses (the last digit off by one, the carry missed or added), in a shuffled order."""
    q = draw()
    right = int(answer(q))
    misses = [m for m in (right + 1, right - 1, right + 10, right - 10, right + 2) if m >= 0][:3]
    choices = [str(right), *map(str, misses)]
    rng.shuffle(choices)
    return {"question": question(q), "choices": choices, "label": choices.index(str(right))}


def instruction_row(draw, rng):
    q = draw()
    return {"instruction": INSTRUCTION, "input": f"{q[0]} and {q[1]}", "output": answer(q)}


def text_row(draw, rng):
    q = draw()
    return {"text": f"{q[0]} + {q[1]} = {answer(q)}"}


def write_jsonl(path: Path, rows) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(rows)} rows, {path.stat().st_size:,} bytes)")


def user_turns(messages):
    return [m["content"] for m in messages if m["role"] == "user"]


def questions_in(row):
    """The questions in a row, as "a + b" (for the disjointness check)."""
    if "messages" in row:
        texts = user_turns(row["messages"])
    elif "prompt" in row:
        texts = user_turns(row["prompt"])
    elif "question" in row:
        texts = [row["question"]]
    elif "instruction" in row:
        return {row["input"].replace(" and ", " + ")}
    else:
        return {row["text"].split(" = ")[0]}
    return {text.removeprefix("What is ").removesuffix("?") for text in texts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "data/arithmetic")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)

    held_out = rng.sample(QUESTIONS, EVAL_QUESTIONS)
    train_pool = [q for q in QUESTIONS if q not in set(held_out)]

    files = {  # name: (row maker, question pool, number of rows); each file cycles through its pool on its own
        "train.jsonl": (chat_row, train_pool, 3000), "eval.jsonl": (chat_row, held_out, 200),
        "preference.jsonl": (preference_row, train_pool, 1000),
        "preference-eval.jsonl": (preference_row, held_out, 200),
        "prompts.jsonl": (prompt_row, train_pool, 1000), "prompts-eval.jsonl": (prompt_row, held_out, 200),
        "instruction.jsonl": (instruction_row, train_pool, 200), "text.jsonl": (text_row, train_pool, 200),
        "preference-digits.jsonl": (last_digit_row, train_pool, 3000),  # later: the files above stay as they were
        "choice-eval.jsonl": (choice_row, held_out, 200),
    }
    written = {}
    for name, (make, pool, n) in files.items():
        draw = Sampler(pool, rng)
        written[name] = [make(draw, rng) for _ in range(n)]
        write_jsonl(out / name, written[name])

    # Self-checks: eval questions never appear in training files; answers are right; one-turn eval files ask
    # every held-out question once.
    train_q = set().union(*(questions_in(r) for k, rows in written.items() if "eval" not in k
                            for r in rows))
    eval_q = set().union(*(questions_in(r) for k, rows in written.items() if "eval" in k
                           for r in rows))
    assert not train_q & eval_q, "eval questions leak into training files"
    for name in ("preference.jsonl", "preference-eval.jsonl", "preference-digits.jsonl"):
        for r in written[name]:
            (q,) = questions_in(r)
            assert r["chosen"][0]["content"] == str(eval(q)) != r["rejected"][0]["content"]
    for r in written["choice-eval.jsonl"]:
        (q,) = questions_in(r)
        assert r["choices"][r["label"]] == str(eval(q)) and len(set(r["choices"])) == 4
    for name in ("preference-eval.jsonl", "prompts-eval.jsonl", "choice-eval.jsonl"):
        assert len(set().union(*map(questions_in, written[name]))) == EVAL_QUESTIONS
    for r in written["prompts.jsonl"] + written["prompts-eval.jsonl"]:
        (q,) = questions_in(r)
        assert r["answer"] == str(eval(q))
    multi = sum(len(r["messages"]) == 5 for r in written["train.jsonl"])
    total = sum((out / name).stat().st_size for name in files)
    assert total < 3_000_000, total
    print(f"multi-turn train rows: {multi}/3000; total size {total:,} bytes; self-check OK")


if __name__ == "__main__":
    main()
