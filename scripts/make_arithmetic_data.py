"""Generate the tiny arithmetic datasets in ``data/arithmetic/``.

Small, deterministic (fixed seed) datasets in every shape the ``ft`` recipes consume:
chat SFT (``messages``), preference pairs (DPO), prompts with checkable answers (GRPO),
instruction/input/output (Alpaca-style) and plain ``text``. Questions are mostly addition
and subtraction of 0-99 (non-negative results) plus some 1-digit multiplication. Every
eval question is held out: no question in an ``*eval*`` file occurs in a training file.

Usage: python scripts/make_arithmetic_data.py [--out data/arithmetic]
"""

import argparse
import json
import random
from pathlib import Path

SEED = 1234
SYSTEM = "You are a calculator."
OPS, WEIGHTS = ["+", "-", "*"], [45, 45, 10]
INSTRUCTIONS = {"+": "Add the two numbers.", "-": "Subtract the second number from the first.",
                "*": "Multiply the two numbers."}
EVAL_RESERVE = {"+": 250, "-": 250, "*": 25}  # questions held out for all eval files


def answer(q):
    a, op, b = q
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


def question(q):
    return f"What is {q[0]} {q[1]} {q[2]}?"


class Sampler:
    """Draws questions with the op mix above, cycling each op's pool without replacement."""

    def __init__(self, pools, rng):
        self.pools, self.rng, self.queues = pools, rng, {op: [] for op in OPS}

    def __call__(self):
        op = self.rng.choices(OPS, WEIGHTS)[0]
        if not self.queues[op]:
            self.queues[op] = self.rng.sample(self.pools[op], len(self.pools[op]))
        return self.queues[op].pop()


def chat_row(draw, rng, multi_turn_rate=0.1):
    messages = [{"role": "system", "content": SYSTEM}]
    for _ in range(2 if rng.random() < multi_turn_rate else 1):
        q = draw()
        messages += [{"role": "user", "content": question(q)},
                     {"role": "assistant", "content": answer(q)}]
    return {"messages": messages}


def preference_row(draw, rng):
    q = draw()
    right = int(answer(q))
    offset = rng.choice([d for d in range(-10, 11) if d != 0])
    wrong = right + offset if right + offset >= 0 else right + abs(offset)
    return {"prompt": question(q), "chosen": str(right), "rejected": str(wrong)}


def prompt_row(draw, rng):
    """A conversational prompt (the SFT chats' system and user turns), so GRPO renders it with the chat
    template the SFT model learned, and the answer its rewards check."""
    q = draw()
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question(q)}],
            "answer": answer(q)}


def instruction_row(draw, rng):
    q = draw()
    return {"instruction": INSTRUCTIONS[q[1]], "input": f"{q[0]} and {q[2]}", "output": answer(q)}


def text_row(draw, rng):
    q = draw()
    return {"text": f"{q[0]} {q[1]} {q[2]} = {answer(q)}"}


def write_jsonl(path: Path, rows) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(rows)} rows, {path.stat().st_size:,} bytes)")


def questions_in(row):
    """The questions in a row, normalised to "a op b" (for the disjointness check)."""
    if "messages" in row:
        return {m["content"][8:-1] for m in row["messages"] if m["role"] == "user"}
    if "prompt" in row and isinstance(row["prompt"], list):
        return {m["content"][8:-1] for m in row["prompt"] if m["role"] == "user"}
    if "prompt" in row:
        return {row["prompt"][8:-1]}  # strip "What is " and "?"
    if "instruction" in row:
        op = next(k for k, v in INSTRUCTIONS.items() if v == row["instruction"])
        return {row["input"].replace(" and ", f" {op} ")}
    return {row["text"].split(" = ")[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "data/arithmetic")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)

    pools = {"+": [(a, "+", b) for a in range(100) for b in range(100)],
             "-": [(a, "-", b) for a in range(100) for b in range(a + 1)],
             "*": [(a, "*", b) for a in range(10) for b in range(10)]}
    eval_pools = {op: rng.sample(pools[op], n) for op, n in EVAL_RESERVE.items()}
    train_pools = {op: [q for q in pools[op] if q not in set(eval_pools[op])] for op in OPS}
    train, held_out = Sampler(train_pools, rng), Sampler(eval_pools, rng)

    files = {  # name: (row maker, sampler, number of rows)
        "train.jsonl": (chat_row, train, 3000), "eval.jsonl": (chat_row, held_out, 200),
        "preference.jsonl": (preference_row, train, 1000),
        "preference-eval.jsonl": (preference_row, held_out, 100),
        "prompts.jsonl": (prompt_row, train, 1000), "prompts-eval.jsonl": (prompt_row, held_out, 100),
        "instruction.jsonl": (instruction_row, train, 200), "text.jsonl": (text_row, train, 200),
    }
    written = {}
    for name, (make, draw, n) in files.items():
        written[name] = [make(draw, rng) for _ in range(n)]
        write_jsonl(out / name, written[name])

    # Self-checks: eval questions never appear in training files; answers are right.
    train_q = set().union(*(questions_in(r) for k, rows in written.items() if "eval" not in k
                            for r in rows))
    eval_q = set().union(*(questions_in(r) for k, rows in written.items() if "eval" in k
                           for r in rows))
    assert not train_q & eval_q, "eval questions leak into training files"
    for r in written["preference.jsonl"]:
        assert r["chosen"] == str(eval(r["prompt"][8:-1])) != r["rejected"]
    multi = sum(len(r["messages"]) == 5 for r in written["train.jsonl"])
    total = sum((out / name).stat().st_size for name in files)
    assert total < 2_000_000, total
    print(f"multi-turn train rows: {multi}/3000; total size {total:,} bytes; self-check OK")


if __name__ == "__main__":
    main()
