"""How the cost of ft's chat loss masks grows with the number of turns: 200 turns against 20, measured side by side.

ft renders a conversation once and finds every assistant span in one pass over the text, so ten times the turns
should cost about ten times the time (target: ratio < 20; one prefix render per answer, the quadratic fallback,
would be ~100). For contrast the same chats are also masked with a template that rewrites contents, which sends
every row down that fallback. Each size is timed ``--repeats`` times on the shipped tiny tokenizer and the best
time kept. (tests/test_tokenize.py checks the same property by counting renders, without a clock.)

    python benchmarks/chat_mask_scaling.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets" / "tiny-llama"


def conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "Answer briefly."}]
    for i in range(turns):
        messages += [{"role": "user", "content": f"What is {i} + 1?"},
                     {"role": "assistant", "content": f"{i + 1}"}]
    return messages


def best_time(tokenizer, settings, turns: int, repeats: int) -> float:
    from ft.data.tokenize import tokenize_batch

    batch = {"messages": [conversation(turns)]}
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        tokenize_batch(batch, tokenizer, settings)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats

    from transformers import AutoTokenizer

    from ft.data.templates import BUILTIN_TEMPLATES
    from ft.data.tokenize import TokenizeSettings

    tokenizer = AutoTokenizer.from_pretrained(ASSETS)
    chatml = BUILTIN_TEMPLATES["chatml"]
    templates = {"ft's linear mask (chatml)": (chatml, " (target < 20)"),
                 "prefix-render fallback": (chatml.replace("message['content']", "(message['content'] | upper)"), "")}
    for name, (template, target) in templates.items():
        settings = TokenizeSettings(template=template, max_length=10**6, truncation="truncate", train_on="assistant")
        best_time(tokenizer, settings, 5, 1)  # warm-up: template compilation
        small, large = (best_time(tokenizer, settings, turns, repeats) for turns in (20, 200))
        print(f"{name:28} 20 turns {small * 1e3:8.2f} ms   200 turns {large * 1e3:9.2f} ms   "
              f"ratio {large / small:6.1f}{target}")


if __name__ == "__main__":
    main()
