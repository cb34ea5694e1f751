"""``ft export``: a trained run or a model directory as one GGUF file, for llama.cpp, Ollama and LM Studio.

A full run (or any model directory) is written as it is; an adapter run is first folded into its base in memory,
exactly as ``ft merge`` folds it (same base, same dtype), so exporting an adapter run and exporting its merged model
write the same file. The file is written under a temporary name in the target folder and renamed when complete, so a
failure, a full disk or Ctrl-C leaves no partial file behind. Everything that can be refused (the output path, the
architecture, a tensor or RoPE scaling GGUF cannot say, a chat template Ollama cannot take) is refused before the
first byte is written.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..model.locate import (
    Found,
    find_base,
    load_adapter_model,
    load_full,
    load_processing_class,
    locate,
    scoring_model,
    start_config,
)
from ..recipe.errors import first_line
from .errors import ExportError
from .gguf_file import QUANTS, architecture_of, write_gguf
from .modelfile import modelfile_text

ARG = "RUN_OR_MODEL_DIR"
PROGRESS_FROM = 512 * 2**20  # files larger than this report their progress


@dataclass(frozen=True)
class Exported:
    path: Path
    nbytes: int
    quant: str
    tensors: int
    architecture: str
    modelfile: Path | None


def export(source: Path, out: Path, quant: str = "f16", overwrite: bool = False, modelfile: bool = False,
           say: Callable[[str], None] = print) -> Exported:
    if quant not in QUANTS:
        raise ExportError(f"--quant: {quant!r} is not one ft writes; choose one of {', '.join(QUANTS)}.")
    modelfile_path = out.with_suffix(".Modelfile") if modelfile else None
    _check_out(out, overwrite, "--gguf")
    if modelfile_path is not None:
        _check_out(modelfile_path, overwrite, "--modelfile")
    _check_gguf()  # first: it costs nothing, where the checks below import transformers' model tables
    found = locate(source, ARG)
    if scoring_model(found):
        raise ExportError(f"{ARG}: {found.path} is a reward model (a sequence classifier); GGUF files for "
                          "llama.cpp and Ollama hold models that write text. Nothing was written.")
    _check_architecture(found)
    model, tokenizer = _load(found, say)
    architecture = architecture_of(model.config.model_type, ARG)
    template = modelfile_text(tokenizer, out.name, ARG) if modelfile_path is not None else None
    _make_parent(out)
    with tempfile.TemporaryDirectory(prefix="ft-export-") as folder:
        tokenizer.save_pretrained(folder)  # what gguf.SpecialVocab reads: ids, merges, flags, chat template
        model.config.save_pretrained(folder)
        written = _atomically(out, lambda partial: write_gguf(model, tokenizer, Path(folder), partial, quant, ARG,
                                                              _progress(out, say)))
    if template is not None:
        _atomically(modelfile_path, lambda partial: partial.write_text(template, encoding="utf-8"))
    for name in written.fell_back[:1]:
        say(f"ft: {len(written.fell_back)} tensor(s) written f16, not q8_0 (q8_0 needs rows in blocks of 32), "
            f"e.g. {name}")
    if written.pre_tokenizer == "default":
        say("ft: warning: the tokenizer splits text before BPE in a way llama.cpp has no name for; the file says "
            "'default', so llama.cpp may split some text differently (transformers reads the file as GPT-2's split).")
    say(f"ft: exported {found.path} to {out}: {_size(written.nbytes)}, {quant}, {written.tensors} tensors, "
        f"{architecture.gguf_arch} architecture" + (f"; Ollama: ollama create NAME -f {modelfile_path}"
                                                    if modelfile_path else ""))
    return Exported(out, written.nbytes, quant, written.tensors, architecture.gguf_arch, modelfile_path)


def _check_out(path: Path, overwrite: bool, option: str) -> None:
    if path.is_dir():
        raise ExportError(f"{option}: {path} is a directory; give the file to write, e.g. {path / 'model.gguf'}.")
    if path.exists() and not overwrite:
        raise ExportError(f"{option}: {path} already exists; pass --overwrite to replace it, or choose another "
                          "name. Nothing was written.")


def _check_gguf() -> None:
    try:
        import gguf  # noqa: F401 - the writer, name maps and quantizers
    except ImportError:
        raise ExportError("--gguf: writing a GGUF file needs the `gguf` package, which is not installed here; run "
                          "`pip install 'ft[gguf]'` (or `pip install gguf`). Nothing was written.") from None


def _make_parent(out: Path) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"--gguf: cannot create the folder {out.parent}: {first_line(exc)}. Choose a writable "
                          "path. Nothing was written.") from None


def _check_architecture(found: Found) -> None:
    """Refuse an architecture ft does not write from the config alone, before any weights load."""
    import json

    if found.kind == "full":
        try:
            model_type = json.loads((found.path / "config.json").read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            return  # loading says what is wrong with it
        _refuse_vision(model_type, found)
        architecture_of(model_type, ARG)
        return
    model_type = _base_model_type(found)
    if model_type is not None:
        _refuse_vision(model_type, found)
        architecture_of(model_type, ARG)


def _refuse_vision(model_type: str | None, found: Found) -> None:
    """A vision-language model (``ft.model.loading.modality_of``) is refused: llama.cpp reads such a model from two
    files, the language model's GGUF and a separate projector file (mmproj) holding the vision tower and projector,
    and ft writes the first kind only. Refused from the config, before anything is written."""
    from types import SimpleNamespace

    from ..model.loading import modality_of

    if modality_of(SimpleNamespace(model_type=model_type)) == "vision":
        raise ExportError(f"{ARG}: {found.path} is a vision-language model ({model_type}); llama.cpp reads one as "
                          "two files, the language model's GGUF and a separate projector file (mmproj) with its "
                          "vision tower, and ft does not write the projector file. Nothing was written. Serve it "
                          "with transformers (ft generate --image), or convert final/ (or `ft merge`'s output) with "
                          "llama.cpp's convert_hf_to_gguf.py and its --mmproj option.")


def _base_model_type(found: Found) -> str | None:
    """The model_type of an adapter's base, read from its config.json when that is cheap to reach; None otherwise
    (a GGUF base, whose metadata takes as long to parse as the load that follows: the loaded model is checked)."""
    from transformers import AutoConfig

    try:
        base = find_base(found, ARG)
        if base.recipe is not None:
            return None if base.recipe.model.gguf_file else start_config(base.recipe.model).model_type
        return AutoConfig.from_pretrained(base.name, revision=base.revision).model_type
    except Exception:  # noqa: BLE001 - only an early check: loading the base reports any real problem
        return None


def _load(found: Found, say: Callable[[str], None]):
    """(model, tokenizer): a full model as saved; an adapter folded into its base as ``ft merge`` folds it."""
    if found.kind == "adapter":
        model, tokenizer = load_adapter_model(found, None, ARG, say)
        return model.merge_and_unload(safe_merge=True), tokenizer
    return load_full(found.path, "auto", ARG).eval(), load_processing_class(found, ARG, say)


def _atomically(path: Path, write: Callable[[Path], object]):
    """Run ``write`` on a temporary name beside ``path`` and rename it to ``path`` when it returns; on any failure
    (a full disk, Ctrl-C) the temporary file is removed and ``path`` is left as it was."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        result = write(partial)
        os.replace(partial, path)
        return result
    except OSError as exc:
        partial.unlink(missing_ok=True)
        why = exc.strerror or ("the system took only part of the data (a full disk or a file size limit)"
                               if exc.errno is None else first_line(exc))
        raise ExportError(f"cannot write {path}: {why}. Nothing was written (the partial file was removed); free "
                          "space or choose another path.") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _progress(out: Path, say: Callable[[str], None]) -> Callable[[int, int], None]:
    """A line at each tenth of a large file, so a long write is seen to move."""
    reported = [0]

    def report(done: int, total: int) -> None:
        tenth = done * 10 // max(total, 1)
        if total >= PROGRESS_FROM and tenth > reported[0]:
            reported[0] = tenth
            say(f"ft: writing {out.name}: {tenth * 10}% of {_size(total)}")

    return report


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"
