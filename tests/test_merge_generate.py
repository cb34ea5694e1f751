"""`ft merge` and `ft generate` on real runs of the tiny model: a merged adapter computes what base + adapter
computed (logits, greedy text, and the run's own final eval loss), a random-init base is rebuilt exactly from the
run's recipe and seed, and every misuse is one paragraph with exit code 2.

Three short runs are shared by the module: a full fine-tune (a model with weights on disk), a LoRA run on top of
it (`init: pretrained`), and a LoRA run on the random-init base (`init: random`, rebuilt by merge from the seed)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from conftest import ASSETS, built_trainer, run_ft
from safetensors.torch import load_file

from ft.inference.generate import InferenceError, Sampling, generate, prompt_text
from ft.inference.merge import merge
from ft.model.locate import LocateError, locate

TOKENS = "8"  # --max-new-tokens: enough to compare texts, cheap on a CPU
PROMPT = "What is 12 + 7?"


def _batch(tokenizer) -> dict:
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                           add_generation_prompt=True), "12 + 7 = 19, and 3 * 4 = 12."]
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def test_merged_model_computes_what_base_plus_adapter_computes(full_run, lora_run, lora_merged):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(full_run / "final", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(lora_run / "final")
    batch = _batch(tokenizer)
    with torch.no_grad():
        base_logits = base(**batch).logits
        adapted = PeftModel.from_pretrained(base, str(lora_run / "final")).eval()
        adapter_logits = adapted(**batch).logits
        merged = AutoModelForCausalLM.from_pretrained(lora_merged).eval()
        merged_logits = merged(**batch).logits
    mask = batch["attention_mask"].bool()
    assert (adapter_logits - base_logits)[mask].abs().max() > 1e-2  # the adapter moved: the comparison means something
    assert (merged_logits - adapter_logits)[mask].abs().max() < 1e-4
    assert merged.dtype == torch.float32


def test_merged_dir_is_a_plain_model_with_the_runs_tokenizer(lora_run, lora_merged):
    from transformers import AutoTokenizer

    names = {path.name for path in lora_merged.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    assert not {name for name in names if name.startswith("adapter_")}
    saved, merged = AutoTokenizer.from_pretrained(lora_run / "final"), AutoTokenizer.from_pretrained(lora_merged)
    assert merged.chat_template and merged.chat_template == saved.chat_template
    assert merged.get_vocab() == saved.get_vocab()


@pytest.mark.slow
def test_merge_rebuilds_a_random_init_base_exactly(random_lora_run, tmp_path):
    """The base of an `init: random` run has no weights on disk; merge rebuilds it from recipe.yaml's model section and
    seed. Proof it is the base the run trained on: the merged model scores the run's own final eval loss."""
    said = []
    merge(random_lora_run, tmp_path / "merged", say=said.append)
    assert any("random init with seed 7" in line for line in said), said
    recipe = yaml.safe_load((random_lora_run / "recipe.yaml").read_text())
    recipe.pop("adapter")
    recipe["model"] = {"name": str(tmp_path / "merged"), "init": "pretrained"}
    recipe["train"] = {**recipe["train"], "output_dir": str(tmp_path / "eval")}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    trainer, _ = built_trainer(path)
    expected = json.loads((random_lora_run / "summary.json").read_text())["eval_loss"]
    assert trainer.evaluate()["eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_merge_reads_the_base_from_summary_json_without_recipe_yaml(full_run, lora_run, lora_merged, tmp_path):
    """summary.json's `base_model` entry is enough for a pretrained base (here naming it under a new path)."""
    run = tmp_path / "run"
    shutil.copytree(lora_run / "final", run / "final")
    moved = shutil.copytree(full_run / "final", tmp_path / "base")
    (run / "summary.json").write_text(json.dumps({"base_model": {"name": str(moved), "revision": None,
                                                                 "init": "pretrained", "dtype": "auto"}}))
    said = []
    merge(run, tmp_path / "merged", say=said.append)
    assert any(str(run / "summary.json") in line for line in said), said
    expected = load_file(lora_merged / "model.safetensors")
    for name, tensor in load_file(tmp_path / "merged" / "model.safetensors").items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


def test_merge_in_another_dtype(random_lora_run, tmp_path):
    merge(random_lora_run, tmp_path / "bf16", "bfloat16", say=lambda _: None)
    tensors = load_file(tmp_path / "bf16" / "model.safetensors")
    assert {tensor.dtype for tensor in tensors.values()} == {torch.bfloat16}


SUMS = [f"What is {a} + {b}?" for a, b in [(12, 7), (40, 9), (3, 5), (77, 8), (25, 6), (61, 2), (90, 4), (8, 8)]]


@pytest.mark.slow
def test_generate_adapter_run_and_its_merge_write_the_same_greedy_text(full_run, lora_run, lora_merged, tmp_path):
    """The adapter run through `ft generate` (base + adapter through PEFT), the merged folder and the base (the full
    run the adapter trained on) through the same code in this process. The adapter changed the answers: a generate
    that ignored the adapter would write the base's text, and fail."""
    prompts = tmp_path / "sums.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in SUMS))
    result = run_ft("generate", str(lora_run), "--file", str(prompts), "--max-new-tokens", TOKENS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "base " in result.stderr and "final" in result.stderr  # messages go to stderr, the text alone to stdout
    adapter = [json.loads(line)["completion"] for line in result.stdout.splitlines()]
    items = [(f"line {i + 1}", {"prompt": text}) for i, text in enumerate(SUMS)]
    sampling = Sampling(max_new_tokens=int(TOKENS))
    merged = list(generate(lora_merged, items, sampling, say=lambda _: None))
    base = list(generate(full_run, items, sampling, say=lambda _: None))
    assert adapter == merged and all(text.strip() for text in adapter)
    changed = sum(ours != theirs for ours, theirs in zip(adapter, base, strict=True))
    assert changed >= len(SUMS) // 2, list(zip(adapter, base, strict=True))


@pytest.mark.slow
def test_every_prompt_given_is_answered_in_order(full_run):
    """`--prompt A --prompt B` once printed only B's completion: each is answered, in order, as alone."""
    pair = [SUMS[0], SUMS[2]]  # answered differently by this model: the order shows
    both = run_ft("generate", str(full_run), "--prompt", pair[0], "--prompt", pair[1], "--max-new-tokens", TOKENS)
    assert both.returncode == 0, both.stderr[-3000:]
    alone = [run_ft("generate", str(full_run), "--prompt", text, "--max-new-tokens", TOKENS).stdout for text in pair]
    assert both.stdout == "".join(alone) and alone[0] != alone[1]
    assert "gemm_4bit_forward" not in both.stderr and "FutureWarning" not in both.stderr  # ft train's hygiene


@pytest.mark.slow
def test_generate_from_a_full_run_prompt_and_file(full_run, tmp_path):
    single = run_ft("generate", str(full_run), "--prompt", PROMPT, "--max-new-tokens", TOKENS)
    assert single.returncode == 0, single.stderr[-3000:]
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"prompt": PROMPT, "id": 1}, {"messages": [{"role": "system", "content": "Answer briefly."},
                                                      {"role": "user", "content": "What is 3 * 4?"}]}]
    prompts.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    batch = run_ft("generate", str(full_run / "final"), "--file", str(prompts), "--max-new-tokens", TOKENS)
    assert batch.returncode == 0, batch.stderr[-3000:]
    lines = [json.loads(line) for line in batch.stdout.splitlines()]
    assert [{k: v for k, v in line.items() if k != "completion"} for line in lines] == rows
    assert lines[0]["completion"] + "\n" == single.stdout  # greedy: the same text as --prompt gives
    assert all(isinstance(line["completion"], str) for line in lines)


def test_prompts_take_the_chat_template_unless_told_not_to():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ASSETS)
    text, templated = prompt_text(tokenizer, {"prompt": "hi"}, Sampling(), "--prompt")
    assert templated and text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    raw = Sampling(chat_template=False)
    assert prompt_text(tokenizer, {"prompt": "hi"}, raw, "--prompt") == ("hi", False)
    with pytest.raises(InferenceError, match="--no-chat-template"):
        prompt_text(tokenizer, {"messages": [{"role": "user", "content": "hi"}]}, raw, "--file p.jsonl:1")


def test_an_instruction_and_its_input_are_asked_as_training_wrote_them(full_run, tmp_path):
    """``--prompt INSTRUCTION --input INPUT`` and a --file line ``{"instruction", "input"}`` ask with the user turn the
    instruction format trains on (``instruction_text``: a blank line between), not a layout the user must guess."""
    from transformers import AutoTokenizer

    from ft.data.formats import FORMATS, Names

    tokenizer = AutoTokenizer.from_pretrained(ASSETS)
    row = {"instruction": "Add the two numbers.", "input": "12 and 30", "output": "42"}
    trained = FORMATS["instruction"].convert(row, Names({}, {}))["messages"][0]
    asked, _ = prompt_text(tokenizer, {"instruction": row["instruction"], "input": row["input"]}, Sampling(), "x")
    assert asked == prompt_text(tokenizer, {"messages": [trained]}, Sampling(), "x")[0]
    assert "Add the two numbers.\n\n12 and 30" in asked

    given = run_ft("generate", str(full_run), "--prompt", row["instruction"], "--input", row["input"],
                   "--max-new-tokens", TOKENS)
    joined = run_ft("generate", str(full_run), "--prompt", trained["content"], "--max-new-tokens", TOKENS)
    assert given.returncode == 0 and given.stdout == joined.stdout, given.stderr[-3000:]
    lines = tmp_path / "rows.jsonl"
    lines.write_text(json.dumps({"instruction": row["instruction"], "input": row["input"]}) + "\n")
    from_file = run_ft("generate", str(full_run), "--file", str(lines), "--max-new-tokens", TOKENS)
    assert from_file.returncode == 0, from_file.stderr[-3000:]
    assert json.loads(from_file.stdout)["completion"] + "\n" == joined.stdout
    assert "one each: 2 --input for 1 --prompt" in _refused("generate", str(full_run), "--prompt", "a", "--input",
                                                           "b", "--input", "c")


def _refused(*args: str) -> str:
    result = run_ft(*args)
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr
    return result.stderr


def test_merging_a_full_model_is_refused(full_run, tmp_path):
    message = _refused("merge", str(full_run), "--out", str(tmp_path / "out"))
    assert "RUN_OR_ADAPTER_DIR" in message and "needs no merge" in message
    assert not (tmp_path / "out").exists()


def test_missing_directories_and_bad_arguments_are_refused(lora_run, tmp_path):
    assert "does not exist" in _refused("merge", str(tmp_path / "nothing"), "--out", str(tmp_path / "out"))
    assert "does not exist" in _refused("generate", str(tmp_path / "nothing"), "--prompt", "hi")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    assert "--out" in _refused("merge", str(lora_run), "--out", str(busy))
    assert "give --prompt TEXT (one or more) or --file prompts.jsonl, not both" in _refused("generate", str(lora_run))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    assert f"{bad}:2" in _refused("generate", str(lora_run), "--file", str(bad))


@pytest.mark.slow
def test_a_bare_adapter_of_a_random_init_base_cannot_be_rebuilt(random_lora_run, tmp_path):
    adapter = tmp_path / "adapter"
    shutil.copytree(random_lora_run / "final", adapter)
    message = _refused("merge", str(adapter), "--out", str(tmp_path / "out"))
    assert "random" in message and "run directory" in message


def test_a_run_without_final_names_the_checkpoint_to_pass(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    (run / "recipe.yaml").write_text("method: sft\n")
    (run / "checkpoint-2" / "trainer_state.json").write_text("{}")
    with pytest.raises(LocateError, match="checkpoint-2"):
        locate(run, "RUN_OR_ADAPTER_DIR")
