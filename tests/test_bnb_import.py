"""bitsandbytes without its import-time compiler set-up for runs that use none of it (ft.model.bnb_import)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, tiny_sft

from ft.model.bnb_import import uses_bitsandbytes
from ft.recipe import load_recipe

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model

pytest.importorskip("bitsandbytes")

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
        # and torch.compile compiles again after ft's import (the switch was for that import alone)
        "compiled = torch.compile(lambda t: t * 2)\n"
        "print(json.dumps({'first': first, 'compiler': compiler, 'restored': restored, 'error': error,\n"
        "                  'compiles': compiled(torch.ones(2)).tolist() == [2.0, 2.0] and "
        f"{COMPILER!r} in sys.modules}}))")
    assert ours == {"first": True, "compiler": False, "restored": True, "error": ours["error"], "compiles": True}
    assert ours["error"] < 0.02


def test_a_user_setting_of_the_switch_is_left_as_it_was():
    code = ("import os, json\nos.environ['TORCHDYNAMO_DISABLE'] = '0'\n"
            "from ft.model.bnb_import import import_bitsandbytes\nimport_bitsandbytes(uses_it=False)\n"
            "print(json.dumps(os.environ.get('TORCHDYNAMO_DISABLE')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == "0"


def test_ft_train_of_a_run_without_bitsandbytes_never_imports_torchs_compiler(write_recipe, tmp_path):
    path = write_recipe(tiny_sft(tmp_path / "out", max_steps=1, eval_strategy="no"))
    done = _python(
        "import sys, json\nfrom ft.cli import main\n"
        f"sys.argv = ['ft', 'train', {str(path)!r}, '--resume', 'never']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        f"print(json.dumps({{'code': code, 'compiler': {COMPILER!r} in sys.modules, "
        "'bitsandbytes': 'bitsandbytes' in sys.modules}))")
    assert done == {"code": 0, "compiler": False, "bitsandbytes": True}


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
