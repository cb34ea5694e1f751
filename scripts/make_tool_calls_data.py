"""Generate the tool-calling datasets in ``data/tool-calls/``: a real model learns to call a tool.

Every question is one only a tool answers (a unit conversion, a shop price), and the assistant answers it with exactly
one call, in ft's ``chat`` format (OpenAI's layout: ``tool_calls`` with the arguments as an object, and no text). The
model must pick the right function of the two in ``tools.json`` and copy its arguments out of the question: a number
and two unit names, or an item and a count, which vary from row to row. A quarter of the rows go on after the call: the
tool's result (a ``tool`` message with its ``tool_call_id`` and ``name``, JSON text), then the assistant's answer in
words, which copies figures out of the result, so a recipe trains that turn too. Two small tools, not more: every row's
prompt holds their schemas, and on a CPU each of those tokens costs in every training step and every scored answer.

Deterministic (a fixed seed); no call of ``eval.jsonl`` (a function and its arguments) occurs in ``train.jsonl``, so
held-out questions are never seen in training: 600 training rows, 200 held out.

Usage: python scripts/make_tool_calls_data.py [--out data/tool-calls]
"""

import argparse
import json
import random
from pathlib import Path

SEED = 2026
TRAIN_ROWS, EVAL_ROWS = 600, 200
ANSWERED = 0.25  # the share of rows that go on after the call: the tool's result, then the answer in words

TOOLS = [
    {"type": "function", "function": {
        "name": "convert_units", "description": "Convert a value between units.",
        "parameters": {"type": "object", "properties": {"value": {"type": "number"}, "from_unit": {"type": "string"},
                                                        "to_unit": {"type": "string"}},
                       "required": ["value", "from_unit", "to_unit"]}}},
    {"type": "function", "function": {
        "name": "lookup_price", "description": "The price of a quantity of an item.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}, "quantity": {"type": "integer"}},
                       "required": ["item", "quantity"]}}},
]

# unit -> its size in the group's base unit (metres, kilograms, litres); temperatures convert by formula
UNITS = {
    "length": {"meters": 1.0, "feet": 0.3048, "inches": 0.0254, "centimeters": 0.01, "kilometers": 1000.0,
               "miles": 1609.344, "yards": 0.9144},
    "mass": {"kilograms": 1.0, "pounds": 0.45359237, "grams": 0.001, "ounces": 0.028349523125},
    "volume": {"liters": 1.0, "gallons": 3.785411784, "milliliters": 0.001, "cups": 0.2365882365},
    "temperature": {"celsius": None, "fahrenheit": None, "kelvin": None},
}
ITEMS = ["notebooks", "coffee mugs", "AA batteries", "tennis balls", "candles", "paintbrushes", "sticky notes",
         "water bottles", "light bulbs", "phone chargers", "pencils", "dish sponges", "bath towels", "socks",
         "lemons", "avocados", "bagels", "tea bags", "envelopes", "flower pots", "garden gloves", "rubber ducks",
         "USB cables", "picture frames", "yoga mats", "umbrellas", "cereal boxes", "soap bars", "marker pens",
         "bike lights", "pillowcases", "jam jars", "hair ties", "mouse pads", "coat hangers"]

PHRASES = {
    "convert_units": ["Convert {value} {from_unit} to {to_unit}.", "How many {to_unit} are in {value} {from_unit}?",
                      "What is {value} {from_unit} in {to_unit}?",
                      "I have {value} {from_unit}. How much is that in {to_unit}?"],
    "lookup_price": ["How much do {quantity} {item} cost?", "What is the price of {quantity} {item}?",
                     "Look up the price of {quantity} {item} for me.",
                     "I need {quantity} {item}. What will that cost?"],
}


def convert_call(rng):
    units = UNITS[rng.choice(list(UNITS))]
    from_unit, to_unit = rng.sample(list(units), 2)
    value = rng.choice([rng.randint(2, 500), rng.randint(2, 200) + rng.choice([0.5, 0.25, 0.75])])
    return {"value": value, "from_unit": from_unit, "to_unit": to_unit}


def price_call(rng):
    return {"item": rng.choice(ITEMS), "quantity": rng.randint(2, 24)}


CALLS = {"convert_units": convert_call, "lookup_price": price_call}


def converted(value, from_unit, to_unit):
    """``value`` in ``to_unit``, rounded to 2 decimals."""
    kelvin = {"celsius": lambda v: v + 273.15, "fahrenheit": lambda v: (v - 32) * 5 / 9 + 273.15,
              "kelvin": lambda v: v}
    if from_unit in kelvin:
        k = kelvin[from_unit](value)
        back = {"celsius": k - 273.15, "fahrenheit": (k - 273.15) * 9 / 5 + 32, "kelvin": k}
        return round(back[to_unit], 2)
    sizes = next(group for group in UNITS.values() if from_unit in group)
    return round(value * sizes[from_unit] / sizes[to_unit], 2)


def result_and_answer(name, arguments, rng):
    """The tool's result (JSON text) and the assistant's answer in words, which copies its figures."""
    if name == "convert_units":
        result = converted(**arguments)
        return (json.dumps({"value": result, "unit": arguments["to_unit"]}),
                f"{arguments['value']} {arguments['from_unit']} is {result} {arguments['to_unit']}.")
    total = round(arguments["quantity"] * rng.randint(49, 2999) / 100, 2)
    return (json.dumps({"item": arguments["item"], "quantity": arguments["quantity"], "total": total,
                        "currency": "EUR"}),
            f"{arguments['quantity']} {arguments['item']} cost {total} EUR.")  # the total as the result writes it


def key(name, arguments):
    """A call as comparable text: its function and arguments."""
    return json.dumps([name, arguments], sort_keys=True)


def draw_calls(rng, count, taken):
    """``count`` distinct calls, none of them in ``taken`` (added to it), the functions in turn."""
    names, calls = list(CALLS), []
    while len(calls) < count:
        name = names[len(calls) % len(names)]
        arguments = CALLS[name](rng)
        if key(name, arguments) not in taken:
            taken.add(key(name, arguments))
            calls.append((name, arguments))
    rng.shuffle(calls)
    return calls


def row(name, arguments, number, rng):
    """One chat: the question, the call; for a share of rows, the result and the answer after it."""
    call_id = f"call{number:05d}"
    messages = [{"role": "user", "content": rng.choice(PHRASES[name]).format(**arguments)},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}]
    if rng.random() < ANSWERED:
        result, answer = result_and_answer(name, arguments, rng)
        messages += [{"role": "tool", "tool_call_id": call_id, "name": name, "content": result},
                     {"role": "assistant", "content": answer}]
    return {"messages": messages}


def rows(rng):
    """(train rows, eval rows): the held-out calls are drawn first, then training calls that differ from them."""
    taken = set()
    held_out = draw_calls(rng, EVAL_ROWS, taken)
    train = draw_calls(rng, TRAIN_ROWS, taken)
    return ([row(*call, i, rng) for i, call in enumerate(train)],
            [row(*call, TRAIN_ROWS + i, rng) for i, call in enumerate(held_out)])


def write_json(path: Path, value, lines: bool = False) -> None:
    text = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in value) if lines else \
        json.dumps(value, indent=2) + "\n"
    path.write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {path} ({len(value)} {'rows' if lines else 'tools'}, {path.stat().st_size:,} bytes)")


def calls_of(chat):
    return {key(c["function"]["name"], c["function"]["arguments"])
            for m in chat["messages"] for c in m.get("tool_calls") or ()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "data/tool-calls")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = rows(random.Random(SEED))
    write_json(out / "tools.json", TOOLS)
    write_json(out / "train.jsonl", train, lines=True)
    write_json(out / "eval.jsonl", held_out, lines=True)

    # self-checks: no held-out call or question in training; every question's arguments are in its text
    assert not set().union(*map(calls_of, train)) & set().union(*map(calls_of, held_out)), "held-out calls leak"
    assert not {r["messages"][0]["content"] for r in train} & {r["messages"][0]["content"] for r in held_out}
    for chat in train + held_out:
        question, call = chat["messages"][0]["content"], chat["messages"][1]["tool_calls"][0]["function"]
        assert all(str(value) in question for value in call["arguments"].values()), chat
    answered = [sum(len(r["messages"]) == 4 for r in rows) for rows in (train, held_out)]
    print(f"rows that go on to the answer: {answered[0]}/{len(train)} train, {answered[1]}/{len(held_out)} held out; "
          "self-check OK")


if __name__ == "__main__":
    main()
