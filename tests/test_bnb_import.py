"""How ``ft train`` imports its libraries: bitsandbytes without its import-time compiler set-up for runs that use none
of it (ft.model.bnb_import), and the rest with collections paused, then frozen (ft.run.stack)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import ROOT, tiny_sft

from ft.model.bnb_import import uses_bitsandbytes
from ft.recipe import load_recipe

pytestmark = [pytest.mark.slow,  # every test here trains, or reads the real model
              # found, not imported: importing it at collection cost every test process 2 s, in the quick lane too
              pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")]

COMPILER = "torch._inductor.compile_fx"


def _python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (imports are per process); it prints one JSON line last."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# the trainer stack with a LoRA adapter on the tiny model: PEFT imports bitsandbytes at its own import before 0.22, and
# from 0.22 as it wraps the layers
LORA_RUN = ("import transformers.trainer\n"
            "from transformers import AutoConfig, AutoModelForCausalLM\n"
            "from peft import LoraConfig, get_peft_model\n"
            "config = AutoConfig.from_pretrained('assets/tiny-llama')\n"
            "get_peft_model(AutoModelForCausalLM.from_config(config), LoraConfig(r=4, target_modules=['q_proj']))\n")


def test_the_trainer_stack_imports_torchs_compiler_through_bitsandbytes_unless_ft_imports_it_first():
    # the control: what a LoRA run costs as it is (PEFT imports bitsandbytes, which wraps kernels in torch.compile); if
    # a bitsandbytes or PEFT release stops doing that, this fails and ft.bnb_import can go
    plain = _python(f"import sys, json\n{LORA_RUN}print(json.dumps({{'compiler': {COMPILER!r} in sys.modules}}))")
    assert plain["compiler"]
    ours = _python(
        "import os, sys, json\n"
        "from ft.model.bnb_import import import_bitsandbytes\n"
        "first = import_bitsandbytes(uses_it=False)\n"
        f"{LORA_RUN}"
        "import bitsandbytes.functional as F, torch\n"
        f"compiler = {COMPILER!r} in sys.modules\n"
        "restored = 'TORCHDYNAMO_DISABLE' not in os.environ\n"
        # the uncompiled fallback kernels still compute: an 8-bit blockwise round trip on the CPU
        "x = torch.linspace(-1, 1, 4096)\n"
        "q, state = F.quantize_blockwise(x)\n"
        "error = (F.dequantize_blockwise(q, state) - x).abs().max().item()\n"
        # and torch.compile compiles again after ft's import (the switch was for that import alone): dynamo traces the
        # function and hands its graph to the backend (one that records it: inductor's code generation would add
        # seconds and prove nothing more; with the switch left set, the function runs uncompiled and none is handed)
        "graphs = []\n"
        "compiled = torch.compile(lambda t: t * 2, backend=lambda gm, inputs: graphs.append(gm) or gm.forward)\n"
        "print(json.dumps({'first': first, 'compiler': compiler, 'restored': restored, 'error': error,\n"
        "                  'compiles': compiled(torch.ones(2)).tolist() == [2.0, 2.0] and len(graphs) == 1}))")
    assert ours == {"first": True, "compiler": False, "restored": True, "error": ours["error"], "compiles": True}
    assert ours["error"] < 0.02


def test_a_user_setting_of_the_switch_is_left_as_it_was():
    code = ("import os, json\nos.environ['TORCHDYNAMO_DISABLE'] = '0'\n"
            "from ft.model.bnb_import import import_bitsandbytes\nimport_bitsandbytes(uses_it=False)\n"
            "print(json.dumps(os.environ.get('TORCHDYNAMO_DISABLE')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == "0"


def test_ft_train_imports_the_stack_without_torchs_compiler_or_collections_that_walk_it(write_recipe, tmp_path):
    """A fresh ``ft train`` of a run without bitsandbytes code: bitsandbytes imported without torch's compiler; and the
    libraries imported with collections paused, then frozen (ft.run.stack): every full collection once transformers
    is imported finds them frozen (without that, three walked them all during the imports, on this run)."""
    path = write_recipe(tiny_sft(tmp_path / "out", max_steps=1, eval_strategy="no"))
    done = _python(
        "import gc, sys, json\nfrom ft.cli import main\n"
        "frozen = []\n"
        "def seen(phase, info):\n"
        "    if phase == 'start' and info['generation'] == 2 and 'transformers' in sys.modules:\n"
        "        frozen.append(gc.get_freeze_count())\n"
        "gc.callbacks.append(seen)\n"
        f"sys.argv = ['ft', 'train', {str(path)!r}, '--resume', 'never']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        f"print(json.dumps({{'code': code, 'compiler': {COMPILER!r} in sys.modules, "
        "'bitsandbytes': 'bitsandbytes' in sys.modules, 'frozen': frozen}))")
    assert {key: done[key] for key in ("code", "compiler", "bitsandbytes")} == {
        "code": 0, "compiler": False, "bitsandbytes": True}
    assert all(count > 500_000 for count in done["frozen"]), done["frozen"]


def test_the_stack_is_imported_with_the_collector_as_the_caller_left_it():
    """A caller that paused collections itself (as a fork server does before it freezes) finds them paused and nothing
    frozen; otherwise they are back on, with what the imports made frozen."""
    code = ("import gc, json\nfrom ft.run.stack import import_stack\n"
            "gc.disable()\nimport_stack(('tomllib',))\npaused = (gc.isenabled(), gc.get_freeze_count())\n"
            "gc.enable()\nimport_stack(('csv',))\n"
            "print(json.dumps({'paused': paused, 'enabled': gc.isenabled(), 'frozen': gc.get_freeze_count()}))")
    done = _python(code)
    assert done["paused"] == [False, 0] and done["enabled"] and done["frozen"] > 10_000


@pytest.mark.parametrize(("changes", "uses"), [
    ({}, False),
    ({"optimizer": {"name": "adamw_torch"}}, False),
    ({"optimizer": {"name": "adamw_bnb_8bit"}}, True),
    ({"optimizer": {"name": "paged_adamw_32bit"}}, True),
    ({"optimizer": {"name": "galore_adamw_8bit", "target_modules": ["attn"]}}, True),
    ({"optimizer": {"class": "bitsandbytes.optim.AdamW8bit"}}, True),
    ({"optimizer": {"class": "torch.optim.SGD", "kwargs": {"momentum": 0.9}}}, False),
    ({"model": {"quantization": {"bits": 4}}, "adapter": {"r": 8}}, True),
])
def test_which_runs_use_bitsandbytes(write_recipe, tmp_path, changes, uses):
    recipe = tiny_sft(tmp_path / "out")
    for section, values in changes.items():
        recipe[section] = {**recipe.get(section, {}), **values}
    assert uses_bitsandbytes(load_recipe(write_recipe(recipe)).recipe) is uses
