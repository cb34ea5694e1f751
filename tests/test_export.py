"""`ft export` to GGUF, proven by reading every file back with transformers' own GGUF reader (the gguf package
underneath): the same logits (exactly in f32), the same greedy answers, the same token ids and chat template; an
adapter run gives the same bytes as its `ft merge` output; every refusal exits 2 and leaves nothing behind; each
--quant writes its tensor types, and a large export reports its progress and leaves the old file on Ctrl-C.

Models: the quickstart model trained half way (conftest's ``sft_model``: it answers about half the sums, so greedy
answers are real text), and random-init models of the other shipped families (Llama 3 with its RoPE scaling, Mistral,
Qwen2) saved as plain model directories."""

from __future__ import annotations

import json
import math
import resource
import shutil
import signal
from pathlib import Path

import pytest
import torch
from conftest import ASSETS, DATA, ROOT, run_ft, start_ft, without_module

from ft.errors import FtError
from ft.export.errors import ExportError
from ft.export.gguf import PROGRESS_FROM, export

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
pytest.importorskip("gguf")
FAMILIES = ROOT / "src" / "ft" / "smoke" / "assets"
ROWS = [json.loads(line) for line in (DATA / "train.jsonl").read_text().splitlines()[:40]]
PROMPTS = [json.loads(line)["prompt"] for line in (DATA / "prompts-eval.jsonl").read_text().splitlines()[:20]]
# logits of the trained quickstart model read back from each type against the source's: the largest difference,
# relative to the largest logit (10.8 on these rows). Measured 2026-12-03 and again 2026-12-07, the same to every digit
# shown (the fixture is trained deterministically): f16 0.001012, bf16 0.005477, q8_0 0.006169 (absolute 0.011, 0.059,
# 0.067). Each type's difference must lie within a factor 2 of its own, either way: a file whose weights were written
# in another type falls outside (f32, an export that ignored --quant: 0; bf16 for f16, or f16 for bf16). q8_0's error
# follows each block's largest weight, which the fixture's training moves: a CI run on 2 busy cores trained a fixture
# whose q8_0 difference was 0.01323 (2.1x), so its upper bound is 4x; the tensor types below tell it from bf16.
BOUNDS = {"f32": (0.0, 0.0), "f16": (0.0005, 0.002), "bf16": (0.0027, 0.011), "q8_0": (0.003, 0.025)}
# the tensor type of each weight matrix and the file type (general.file_type) of each --quant, as gguf names them
MATRIX_TYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}
FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}


def _quiet(_: str) -> None:
    pass


def _read_back(path: Path, config=None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {"config": config} if config is not None else {}
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **extra).eval()
    return model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _source(folder: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def _batch(tokenizer) -> torch.Tensor:
    """Eight training rows rendered with the chat template, padded to one length."""
    texts = [tokenizer.apply_chat_template(row["messages"], tokenize=False) for row in ROWS[:8]]
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    return tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")


def _logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def _greedy(model, tokenizer) -> list[str]:
    answers = []
    for messages in PROMPTS:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        encoded = tokenizer(text, add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**encoded, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        answers.append(tokenizer.decode(out[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True))
    return answers


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, Path]:
    """Random-init models of the shipped families, saved as plain model directories."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folders = {}
    for name in ("tiny-llama3", "tiny-mistral", "tiny-qwen2", "tiny-gemma"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(FAMILIES / name))
        folders[name] = tmp_path_factory.mktemp(name) / "model"
        model.save_pretrained(folders[name])
        AutoTokenizer.from_pretrained(FAMILIES / name).save_pretrained(folders[name])
    return folders


@pytest.fixture(scope="module")
def sentencepiece_style(tmp_path_factory) -> Path:
    """A Mistral-family model whose tokenizer is SentencePiece-style BPE with byte fallback (Llama 2's and
    Mistral 7B's kind: ``▁`` for spaces, ``<0x..>`` byte tokens) learned on the arithmetic chats, with Mistral's chat
    template: llama.cpp's ``llama`` tokenizer model, where the shipped tiny families are all byte-level."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaTokenizer

    texts = [message["content"] for row in ROWS for message in row["messages"]]
    learner = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    learner.pre_tokenizer = pre_tokenizers.Metaspace()
    specials = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256))]
    learner.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=320, special_tokens=specials,
                                                           show_progress=False))
    learned = json.loads(learner.to_str())["model"]
    tokenizer = LlamaTokenizer(vocab=learned["vocab"], merges=[tuple(pair) for pair in learned["merges"]])
    tokenizer.chat_template = AutoTokenizer.from_pretrained(FAMILIES / "tiny-mistral").chat_template
    config = AutoConfig.from_pretrained(FAMILIES / "tiny-mistral")
    config.vocab_size = len(learned["vocab"]) + 8  # rows the tokenizer has no token for: written as [PAD<id>]
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("sentencepiece") / "model"
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("quant", ["f32", "f16", "bf16", "q8_0"])
def test_the_trained_model_reads_back_with_its_logits_and_answers(sft_model, tmp_path, quant):
    import gguf

    out = export(sft_model, tmp_path / "model.gguf", quant, say=_quiet).path
    source, tokenizer = _source(sft_model)
    model, _ = _read_back(out)
    batch = _batch(tokenizer)
    expected = _logits(source, batch)
    difference = float((_logits(model, batch) - expected).abs().max() / expected.abs().max())
    low, high = BOUNDS[quant]
    assert (difference == 0.0) if quant == "f32" else (low < difference <= high), (
        f"{quant}: largest logit difference {difference:.4g} of the largest logit, not in ({low}, {high}]")
    reader = gguf.GGUFReader(out)
    assert gguf.LlamaFileType(reader.fields["general.file_type"].contents()).name == FILE_TYPES[quant]
    # llama.cpp's convention, which ft follows: the norms (the only 1-D tensors) stay F32, every weight matrix is
    # --quant's type; q8_0 would write a matrix whose rows are not in blocks of 32 as F16 (none here: rows of 64, 256)
    written = {tensor.name: tensor.tensor_type.name for tensor in reader.tensors}
    rule = {tensor.name: "F32" if len(tensor.shape) == 1 else "F16" if quant == "q8_0" and tensor.shape[0] % 32
            else MATRIX_TYPES[quant] for tensor in reader.tensors}
    assert written == rule
    assert sorted(len(tensor.shape) for tensor in reader.tensors) == [1] * 5 + [2] * 15  # 5 norms, 15 matrices
    if quant in ("f32", "f16"):
        answers = _greedy(source, tokenizer)
        assert sum(answer.strip().isdigit() for answer in answers) >= 15, answers  # real answers, not empty text
        assert _greedy(model, tokenizer) == answers


@pytest.mark.parametrize("family", ["tiny-mistral", "tiny-qwen2", "sentencepiece-style"])
def test_each_family_reads_back_exactly_in_f32(families, sentencepiece_style, tmp_path, family):
    folder = sentencepiece_style if family == "sentencepiece-style" else families[family]
    out = export(folder, tmp_path / "model.gguf", "f32", say=_quiet).path
    source, tokenizer = _source(folder)
    model, _ = _read_back(out)
    batch = _batch(tokenizer)
    assert torch.equal(_logits(model, batch), _logits(source, batch))


def test_llama3_rope_scaling_is_written_as_llama_cpps_rope_factors(families, tmp_path):
    """transformers' GGUF reader does not read RoPE scaling back (it keeps rope_theta only), so the logits are compared
    with the source's config given; the factors llama.cpp applies are checked against llama.cpp's own formula."""
    import gguf

    folder = families["tiny-llama3"]
    out = export(folder, tmp_path / "model.gguf", "f32", say=_quiet).path
    source, tokenizer = _source(folder)
    model, _ = _read_back(out, config=source.config)
    batch = _batch(tokenizer)
    assert torch.equal(_logits(model, batch), _logits(source, batch))
    (tensor,) = [t for t in gguf.GGUFReader(out).tensors if t.name == "rope_freqs.weight"]
    rope = source.config.rope_parameters
    dim = source.config.head_dim
    expected = []
    for i in range(0, dim, 2):  # convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors
        wavelen = 2 * math.pi * rope["rope_theta"] ** (i / dim)
        low, high = (rope["original_max_position_embeddings"] / rope[key] for key in ("low_freq_factor",
                                                                                     "high_freq_factor"))
        smooth = (rope["original_max_position_embeddings"] / wavelen - rope["low_freq_factor"]) / (
            rope["high_freq_factor"] - rope["low_freq_factor"])
        expected.append(1.0 if wavelen < high else rope["factor"] if wavelen > low
                        else 1 / ((1 - smooth) / rope["factor"] + smooth))
    assert torch.allclose(torch.from_numpy(tensor.data.copy()), torch.tensor(expected), rtol=1e-5)
    assert not torch.equal(torch.tensor(expected), torch.ones(len(expected)))  # the scaling does something here


@pytest.mark.parametrize("which", ["trained", "tiny-mistral", "tiny-qwen2", "sentencepiece-style"])
def test_the_tokenizer_read_back_encodes_the_data_and_renders_chats_the_same(sft_model, families, sentencepiece_style,
                                                                            tmp_path, which):
    folder = {"trained": sft_model, "sentencepiece-style": sentencepiece_style}.get(which) or families[which]
    out = export(folder, tmp_path / "model.gguf", "f16", say=_quiet).path
    _, source = _source(folder)
    _, read = _read_back(out)
    assert read.chat_template == source.chat_template
    for row in ROWS:
        text = source.apply_chat_template(row["messages"], tokenize=False)
        assert read.apply_chat_template(row["messages"], tokenize=False) == text
        assert read(text, add_special_tokens=False)["input_ids"] == source(text, add_special_tokens=False)["input_ids"]
        for message in row["messages"]:  # with the tokenizer's own BOS / EOS, and text outside the template
            assert read(message["content"])["input_ids"] == source(message["content"])["input_ids"]
    odd = "Naïve café: 12×7 ≠ 84 🦙\n\t x"  # bytes no token covers (byte fallback / byte-level alphabet)
    assert read(odd)["input_ids"] == source(odd)["input_ids"] and read.decode(read(odd)["input_ids"],
                                                                               skip_special_tokens=True) == odd
    for name in ("bos_token_id", "eos_token_id"):
        assert getattr(read, name) == getattr(source, name), name
    assert read.pad_token_id == (source.pad_token_id if source.pad_token is not None else source.eos_token_id)
    specials = [token for token in source.all_special_tokens]
    assert [read.convert_tokens_to_ids(t) for t in specials] == [source.convert_tokens_to_ids(t) for t in specials]


@pytest.mark.slow
def test_an_adapter_run_exports_the_same_bytes_as_its_merged_model(full_run, lora_run, lora_merged, tmp_path):
    """conftest's LoRA run (on the query and value projections, which llama.cpp's layout reorders) and its merge."""
    result = run_ft("export", str(lora_run), "--gguf", str(tmp_path / "run.gguf"), "--quant", "q8_0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(tmp_path / "run.gguf")
    assert "q8_0" in result.stderr and "llama architecture" in result.stderr
    export(lora_merged, tmp_path / "merged.gguf", "q8_0", say=_quiet)
    assert (tmp_path / "run.gguf").read_bytes() == (tmp_path / "merged.gguf").read_bytes()
    base = export(full_run, tmp_path / "base.gguf", "q8_0", say=_quiet).path
    assert base.read_bytes() != (tmp_path / "run.gguf").read_bytes()  # the adapter is in it


# The Modelfiles of two families, written by hand from their Jinja chat templates (src/ft/smoke/assets/*/
# tokenizer_config.json): Ollama's Go template renders the same text for a conversation with or without a system
# message. Qwen2 puts its default system prompt first when the chat has none; Llama 3 opens with <|begin_of_text|> and
# ends each turn with <|eot_id|>, its stop token.
SYSTEM_OR = '{{ if .Messages }}{{ if eq (index .Messages 0).Role "system" }}'
TURNS = '{{ range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}{{ if eq .Role "user" }}'
MODELFILES = {
    "tiny-qwen2": (
        'FROM ./model.gguf\n'
        'TEMPLATE """' + SYSTEM_OR + '<|im_start|>system\n{{ (index .Messages 0).Content }}<|im_end|>\n'
        '{{ else }}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{{ end }}'
        '{{ else }}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{{ end }}'
        + TURNS + '<|im_start|>user\n{{ .Content }}<|im_end|>\n{{ if $last }}<|im_start|>assistant\n{{ end }}'
        '{{ else if eq .Role "assistant" }}<|im_start|>assistant\n{{ .Content }}'
        '{{ if not $last }}<|im_end|>\n{{ end }}{{ end }}{{ end }}"""\n'
        'PARAMETER stop "<|im_end|>"\n'),
    "tiny-llama3": (
        'FROM ./model.gguf\n'
        'TEMPLATE """' + SYSTEM_OR + '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n'
        '{{ (index .Messages 0).Content }}<|eot_id|>{{ else }}<|begin_of_text|>{{ end }}'
        '{{ else }}<|begin_of_text|>{{ end }}'
        + TURNS + '<|start_header_id|>user<|end_header_id|>\n\n{{ .Content }}<|eot_id|>'
        '{{ if $last }}<|start_header_id|>assistant<|end_header_id|>\n\n{{ end }}'
        '{{ else if eq .Role "assistant" }}<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Content }}'
        '{{ if not $last }}<|eot_id|>{{ end }}{{ end }}{{ end }}"""\n'
        'PARAMETER stop "<|eot_id|>"\n'),
}


@pytest.mark.parametrize("family", sorted(MODELFILES))
def test_a_modelfile_carries_the_chat_template_and_stop_tokens(families, tmp_path, family):
    exported = export(families[family], tmp_path / "model.gguf", "f16", modelfile=True, say=_quiet)
    assert exported.modelfile == tmp_path / "model.Modelfile"
    assert exported.modelfile.read_text() == MODELFILES[family]


def _refused(source: Path, out: Path, match: str, **options) -> None:
    with pytest.raises(FtError, match=match):
        export(source, out, say=_quiet, **options)


def test_bad_input_is_refused_and_nothing_is_written(families, tmp_path):
    out = tmp_path / "out" / "model.gguf"
    result = run_ft("export", str(families["tiny-gemma"]), "--gguf", str(out))
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert "architecture is 'gemma'" in result.stderr and "Nothing was written" in result.stderr
    blocked = run_ft("export", str(families["tiny-qwen2"]), "--gguf", str(out),
                     env={"PYTHONPATH": str(without_module(tmp_path, "gguf"))})
    assert blocked.returncode == 2 and "pip install 'ft[gguf]'" in blocked.stderr, blocked.stderr[-2000:]
    _refused(tmp_path, out, "neither a model")
    _refused(families["tiny-mistral"], out, "cannot be written as an Ollama TEMPLATE", modelfile=True)  # Mistral's
    assert not (tmp_path / "out").exists()  # template moves the system prompt into the last user turn
    out.parent.mkdir()
    out.write_bytes(b"mine")
    _refused(families["tiny-qwen2"], out, "--overwrite")
    assert out.read_bytes() == b"mine"
    (tmp_path / "a-file").write_text("")
    _refused(families["tiny-qwen2"], tmp_path / "a-file" / "model.gguf", "cannot create the folder")
    _refused(families["tiny-qwen2"], tmp_path, "is a directory")
    assert [path.name for path in out.parent.iterdir()] == ["model.gguf"]


def _small_disk() -> None:
    """In the child: files may not grow past 100 kB (writes fail with EFBIG, as on a full disk)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))


@pytest.mark.slow
def test_a_write_that_fails_half_way_leaves_no_file(families, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "model.gguf"
    result = subprocess.run([sys.executable, "-m", "ft", "export", str(families["tiny-qwen2"]), "--gguf", str(out),
                             "--quant", "f32"], capture_output=True, text=True, preexec_fn=_small_disk, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"cannot write {out}: " in result.stderr and "Nothing was written" in result.stderr
    assert list(tmp_path.iterdir()) == []


def _large_model(folder: Path) -> int:
    """Save in ``folder`` a model whose f32 GGUF file is over PROGRESS_FROM (512 MiB), the size from which ft export
    reports its progress: the shipped tiny Llama widened (hidden size 1024, 8 layers), its weights zeros (their values
    do not matter to a write), saved in bf16 (half the bytes to save and load). Its number of weights."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(ASSETS)
    config.update({"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
                   "num_key_value_heads": 16, "head_dim": 64, "num_hidden_layers": 8, "dtype": "bfloat16"})
    with torch.device("meta"):  # the names and shapes alone
        shapes = {name: tensor.shape for name, tensor in AutoModelForCausalLM.from_config(config).state_dict().items()
                  if name != "lm_head.weight"}  # tied to the embeddings: not saved, not written
    weights = sum(shape.numel() for shape in shapes.values())
    assert 4 * weights > PROGRESS_FROM
    folder.mkdir(parents=True)
    save_file({name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in shapes.items()},
              folder / "model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ASSETS / name, folder / name)
    return weights


# an environment the fork server does not run commands with (conftest.start_ft): a fresh ``python -m ft``, a
# subprocess.Popen whose stderr is a pipe, read line by line as the command writes it
PIPED = {"FT_TEST_STDERR": "pipe"}


@pytest.mark.slow
def test_a_large_export_reports_its_progress_and_ctrl_c_keeps_the_old_file(tmp_path):
    """From 512 MiB on, ft export says at each tenth how far the write has come. Ctrl-C while it writes a replacement
    (a real SIGINT, sent as soon as the first of those lines says the write is under way) exits 130 with one line,
    removes the partial file and leaves the old file as it was."""
    folder, out = tmp_path / "model", tmp_path / "out" / "model.gguf"
    size = f"{4 * _large_model(folder) / 1e6:.1f} MB"  # f32: 4 bytes a weight (539.0 MB)
    result = run_ft("export", str(folder), "--gguf", str(out), "--quant", "f32")
    assert result.returncode == 0, result.stderr[-3000:]
    progress = [f"ft: writing model.gguf: {percent}% of {size}" for percent in range(10, 101, 10)]
    lines = result.stderr.splitlines()
    assert [line for line in lines if "writing" in line] == progress  # each tenth once, in order
    assert lines[-11:] == [*progress, f"ft: exported {folder} to {out}: {out.stat().st_size / 1e6:.1f} MB, f32, "
                                      "74 tensors, llama architecture"]  # 9 in each of 8 layers, embeddings, norm

    before = out.stat()
    process = start_ft("export", str(folder), "--gguf", str(out), "--quant", "f32", "--overwrite", env=PIPED)
    try:
        seen = []
        for line in process.stderr:  # until the first progress line: the new file is being written
            seen.append(line)
            if line.startswith("ft: writing model.gguf: "):
                break
        assert seen and seen[-1] == f"{progress[0]}\n", "".join(seen)[-3000:]
        process.send_signal(signal.SIGINT)
        rest = process.stderr.read().splitlines()
        assert process.wait(timeout=120) == 130, rest
        assert process.stdout.read() == ""  # the path is printed once the file is written
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    message = f"ft export: interrupted; {out} was not written (the partial file was removed)."
    assert rest[-1:] == [message] and all(line.startswith("ft: writing model.gguf: ") for line in rest[:-1]), rest
    assert [path.name for path in out.parent.iterdir()] == ["model.gguf"]  # no partial file
    after = out.stat()  # the same file, not replaced or written to
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def test_an_interrupted_write_leaves_the_old_file(tmp_path):
    from ft.export.gguf import _atomically

    out = tmp_path / "model.gguf"
    out.write_bytes(b"old")

    def interrupted(partial: Path) -> None:
        partial.write_bytes(b"half a file")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _atomically(out, interrupted)
    assert [path.name for path in tmp_path.iterdir()] == ["model.gguf"] and out.read_bytes() == b"old"


def test_an_unknown_quantization_is_refused_before_loading(tmp_path):
    with pytest.raises(ExportError, match="--quant"):
        export(tmp_path / "missing", tmp_path / "x.gguf", "q4_k", say=_quiet)
