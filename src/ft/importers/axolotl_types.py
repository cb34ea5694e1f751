"""Axolotl dataset ``type:`` values → the ft data format that reads the same rows.

Axolotl turns rows into text with a *prompt strategy* named by ``type:``; ft reads rows in one of five formats
(``docs/data.md``) and renders them with the chat template. Each registry below maps the strategies of one family of
methods (Axolotl picks the family from ``rl:``) to a ``Reading``: the ft format, the column renames (``fields:``)
that make the strategy's columns ft's, and either a note on what renders differently (carried) or why ft has no
equivalent (not carried; ``format`` is then the nearest ft format, so the source stays in the recipe).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..recipe.methods import METHODS


@dataclass(frozen=True)
class Reading:
    format: str
    fields: dict[str, str] = field(default_factory=dict)
    note: str = ""  # carried: what renders differently
    missing: str = ""  # not carried: why (``format`` is the nearest ft format)


_ALPACA_TEXT = ("ft renders instruction (+ input) as the user turn and output as the assistant turn through the chat "
                "template, not with Axolotl's Alpaca prompt text")


def _instruction(**fields: str) -> Reading:
    return Reading("instruction", dict(fields), _ALPACA_TEXT)


def _missing(fmt: str, why: str) -> Reading:
    return Reading(fmt, missing=why)


# supervised fine-tuning (no `rl:`): axolotl.prompt_strategies and utils/data/wrappers.py's DATASET_HANDLERS
SFT: dict[str, Reading] = {
    "chat_template": Reading("chat"),
    "chat_template.default": Reading("chat"),
    "alpaca": _instruction(),
    "alpaca_chat": _instruction(),
    "alpaca_instruct": _instruction(),
    "alpaca_chat.load_concise": _instruction(),
    "alpaca_instruct.load_no_prompt": _instruction(),
    "alpaca_chat.load_no_prompt": _instruction(),
    "alpaca_chat.load_qa": _instruction(instruction="question", output="answer"),
    "alpaca_chat.load_camel_ai": _instruction(instruction="message_1", output="message_2"),
    "gpteacher": _instruction(output="response"),
    "oasst": _instruction(instruction="INSTRUCTION", output="RESPONSE"),
    "summarizetldr": _instruction(instruction="article", output="summary"),
    "jeopardy": Reading("instruction", {"instruction": "question", "input": "category", "output": "answer"},
                        _ALPACA_TEXT + "; Axolotl also prefixes each answer with 'what is '"),
    "completion": Reading("text"),
    "pretrain": Reading("text"),
    "alpaca_w_system.load_open_orca": _missing("instruction", "its rows carry a system prompt per row (system_prompt), "
                                               "which ft's instruction format has no field for"),
    "input_output": _missing("text", "its rows are segments each marked trained or not; ft's text format trains a "
                             "completion after an untrained prompt (prompt/completion)"),
    "explainchoice": _missing("instruction", "it builds the input from a list of choices; ft reads the fields as "
                              "written"),
    "concisechoice": _missing("instruction", "it builds the input from a list of choices; ft reads the fields as "
                              "written"),
    "reflection": _missing("instruction", "its reflection/corrected fields have no ft equivalent"),
    "bradley_terry": _missing("preference", "a reward-model (Bradley-Terry) strategy, which the importer does not "
                                            "map yet (ft's `method: reward` trains on `preference` rows)"),
    "stepwise_supervised": _missing("text", "a process-reward-model strategy; ft trains no reward models"),
}

_PAIRS_TEXT = ("Axolotl wraps prompt/chosen/rejected in the template's markup; ft passes text rows to TRL as written "
               "(give them as message lists to have the chat template applied)")
_PREFERENCE_CHAT = "ft reads prompt, chosen and rejected as all message lists or all text (Axolotl also takes one dict)"

# DPO and IPO: axolotl.prompt_strategies.dpo (`module.function`; a bare module means `module.default`)
DPO: dict[str, Reading] = {
    "chat_template": Reading("preference", note=_PREFERENCE_CHAT),
    "chat_template.default": Reading("preference", note=_PREFERENCE_CHAT),
    "passthrough": Reading("preference"),
    "user_defined": Reading("preference"),
    **{f"{family}.{name}": Reading("preference", dict(fields), _PAIRS_TEXT)
       for family in ("chatml", "llama3")
       for name, fields in (("prompt_pairs", {}), ("icr", {"prompt": "input"}), ("intel", {"prompt": "question"}))},
}
for _family in ("chatml", "llama3", "chat_template"):
    for _name in ("argilla_chat", "ultra", "default") if _family != "chat_template" else ("argilla_chat",):
        DPO.setdefault(f"{_family}.{_name}", _missing(
            "preference", "it takes the prompt out of the chosen conversation (or picks one of several prompt "
            "columns); ft reads prompt, chosen and rejected from columns of their own (map them with `fields:`)"))
DPO.setdefault("chatml", DPO["chatml.default"])
DPO.setdefault("llama3", DPO["llama3.default"])

_UNPAIRED = ("Axolotl's KTO rows are unpaired (prompt, completion, label); ft's KTO reads preference pairs (prompt, "
             "chosen, rejected)")
KTO: dict[str, Reading] = {}  # every KTO strategy reads unpaired rows: `kto_family` below
ORPO: dict[str, Reading] = {
    "chat_template.argilla": _missing("preference", "it takes the prompt out of the chosen conversation; ft reads "
                                      "prompt, chosen and rejected from columns of their own"),
}
GRPO: dict[str, Reading] = {}  # Axolotl's GRPO types are the user's own transform functions

# Axolotl's prompt strategies by its trainer family (its own `rl:` names: ``Ctx.family``; "": no `rl:`)
STRATEGIES = {"": SFT, "dpo": DPO, "kto": KTO, "orpo": ORPO, "grpo": GRPO}


def family_of(method: str) -> str:
    """Axolotl's own name for the ft ``method`` (``Method.axolotl``: its trainer family, whose prompt strategies and
    settings apply); "" for the method Axolotl trains without ``rl:`` (SFT)."""
    return next(iter(METHODS[method].axolotl), "")


def nearest(method: str) -> str:
    """The ft format a source of ``method`` is kept in when its Axolotl type has no equivalent: the method's usual
    one."""
    return METHODS[method].formats[0]


def reading(name: str, method: str) -> Reading:
    """How ft reads rows of Axolotl ``type: name`` for the ft ``method`` (read by the prompt strategies of its Axolotl
    family)."""
    family = family_of(method)
    table = STRATEGIES.get(family, {})
    base = name.split(":")[0]  # `alpaca:chat`: a prompt style of alpaca
    for candidate in (name, base, base.split(".")[0]):
        if candidate in table:
            found = table[candidate]
            if candidate == base and name != base and found.format == "instruction":
                return Reading(found.format, found.fields, found.note + f" (nor the `{name.split(':')[1]}` prompt "
                               "style)", found.missing)
            return found
    if family == "kto":
        return _missing("preference", _UNPAIRED)
    if family == "grpo":
        return _missing("prompt", f"`{name}` is a transform function of your own; ft reads prompt rows as they are "
                        "(a prompt field, an answer and any other fields your rewards read; rename with `fields:`)")
    return _missing(nearest(method), f"`{name}` is an Axolotl prompt strategy ft has no equivalent for")
