"""The ``ft`` command. Commands stay thin; heavy modules are imported inside them, so ``ft --help``
and ``ft validate`` start fast and never import torch."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Fine-tune large language models from one declarative YAML recipe.",
    pretty_exceptions_enable=False,
)

RecipeArg = Annotated[Path, typer.Argument(help="Path to the recipe YAML file.", show_default=False)]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a recipe key, e.g. --set train.max_steps=10 (value parsed as YAML)."),
]

ShowOpt = Annotated[
    int | None,
    typer.Option("--show", min=1, metavar="N", show_default=False,
                 help="Print the first N training rows as the model sees them: trained tokens marked (colour on a "
                      "terminal, [[...]] otherwise or with NO_COLOR), tokens per role, the stop-token check. Reads "
                      "only those rows; loads the tokenizer."),
]

EXIT_INVALID = 2


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _load(recipe: Path, overrides: list[str] | None, num_processes: int | str | None = None):
    """The validated recipe, checked with the process count this command knows (``run.launch.known_processes``)."""
    from .recipe import load_recipe
    from .run.launch import known_processes

    loaded = _guarded(lambda: load_recipe(recipe, overrides or [], processes=known_processes(num_processes)))
    for warning in loaded.warnings:
        _err("warning: " + warning.render())
    return loaded


@app.command()
def validate(recipe: RecipeArg, set_: SetOpt = None, show: ShowOpt = None) -> None:
    """Check a recipe and print it resolved (defaults filled in), or list every problem at once. With --show N, then
    load the tokenizer and print the first N training rows as the model sees them."""
    from .recipe.resolved import resolved_recipe_yaml

    loaded = _load(recipe, set_)
    _guarded(lambda: _check_inputs(loaded))
    print(resolved_recipe_yaml(loaded.recipe), end="")
    if show is not None:
        print()
        _show(loaded, show)


def _check_inputs(loaded) -> None:
    """The local files and folders the recipe reads exist (``run.inputs``), and its GGUF file is whole: checked by
    ``ft validate`` without loading them; a folder another recipe writes is a warning."""
    from .model.loading import gguf_problems
    from .run.inputs import missing_inputs

    problems = missing_inputs(loaded)
    if not any(problem.path == "model.name" for problem in problems):  # a missing folder's file is missing too
        problems += gguf_problems(loaded.recipe.model)
    for warning in (problem for problem in problems if problem.level == "warning"):
        _err("warning: " + loaded.error([warning]).problems[0].render())
    errors = [problem for problem in problems if problem.level == "error"]
    if errors:
        raise loaded.error(errors)


def _show(loaded, count: int) -> None:
    """``--show N``: the rows as the model sees them, on stdout (``run.preprocess.show``)."""
    from .data.show import wants_colour
    from .run.preprocess import show as run_show

    print(_guarded(lambda: run_show(loaded, count, wants_colour(sys.stdout)), "showing the rows", _run_dir(loaded)),
          end="", flush=True)


@app.command()
def train(
    recipe: RecipeArg,
    set_: SetOpt = None,
    resume: Annotated[
        str, typer.Option(help="auto (newest complete checkpoint), never, or a checkpoint path.")
    ] = "auto",
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Delete what a previous run left in the output directory (checkpoints, "
                           "final/, summary) and start over.")
    ] = False,
    smoke: Annotated[
        bool, typer.Option("--smoke", help="Smoke-test the recipe before renting a GPU: end to end on a tiny random "
                           "model of the same family, a few dozen rows, a few steps on the CPU, into "
                           "<output_dir>-smoke (the real output directory is not touched). Says what it substituted.")
    ] = False,
    num_processes: Annotated[
        str | None, typer.Option("--num-processes", help="Processes on this machine (data-parallel ranks): a number, "
                                 "or auto (the visible GPUs). ft starts them, passes SIGTERM/SIGINT on and leaves none "
                                 "behind. Default: the recipe's launch section, else 1.", show_default=False)
    ] = None,
    nnodes: Annotated[int | None, typer.Option(min=1, help="Machines taking part (run ft train on each).",
                                               show_default=False)] = None,
    node_rank: Annotated[int | None, typer.Option(min=0, help="This machine's number, 0..nnodes-1.",
                                                  show_default=False)] = None,
    master_addr: Annotated[str | None, typer.Option(help="Address of machine 0 (several machines).",
                                                    show_default=False)] = None,
    master_port: Annotated[int | None, typer.Option(help="Port on machine 0 (default 29500).",
                                                    show_default=False)] = None,
    rdzv_endpoint: Annotated[str | None, typer.Option(help="host:port of a c10d rendezvous, instead of "
                                                      "--master-addr/--master-port.", show_default=False)] = None,
) -> None:
    """Validate the recipe, then train. Writes recipe.yaml, checkpoints, final/ and summary.json."""
    from .run import launch

    flags = {"num_processes": _guarded(lambda: launch.num_processes_flag(num_processes)), "nnodes": nnodes,
             "node_rank": node_rank, "master_addr": master_addr, "master_port": master_port,
             "rdzv_endpoint": rdzv_endpoint}
    launch.watch_parent()
    loaded = _load(recipe, set_, flags["num_processes"])
    from .run.notices import install as hide_notices_not_for_the_user

    hide_notices_not_for_the_user(loaded.recipe.train_args)  # not with FT_DEBUG=1 or train.log_level (notices.py)
    from .run.train import train as run_train

    command = launch.command_that_resumes(sys.argv)
    if not smoke and launch.several_processes_wanted(loaded, flags):
        code = _guarded(lambda: launch.start_ranks(loaded, flags, sys.argv[1:], command, say=_err),
                        "launching the processes", _run_dir(loaded))
        if code is not None:
            raise typer.Exit(code)
    from .run.stack import TRAINING, import_stack

    imports = functools.partial(import_stack, TRAINING)  # this process trains: stack.py says what this way saves
    if smoke:
        from .smoke import rehearse

        if resume != "auto":
            _err("ft: --smoke always starts afresh in its own directory (<output_dir>-smoke); drop --resume.")
            raise typer.Exit(EXIT_INVALID)
        result = _guarded(lambda: rehearse.train(loaded, say=_err, command=command, imports=imports),
                          "the smoke test", _run_dir(rehearse.redirected(loaded)))
        raise typer.Exit(result.exit_code)
    result = _guarded(lambda: run_train(loaded, resume=resume, say=_err, overwrite=overwrite, command=command,
                                        imports=imports), "training", _run_dir(loaded))
    _ending()
    raise typer.Exit(result.exit_code)


def _ending() -> None:
    """The run has ended and said how (summary.json, its exit code): SIGTERM and SIGINT are ignored while the process
    exits (the interpreter's shutdown, atexit handlers: up to a second), where a signal would only turn a completed
    run's 0 into 143 or a KeyboardInterrupt traceback, and a scheduler would take it for a stop to resume (found by
    tests/test_signal_any_moment.py)."""
    from .run.signals import hold_stops

    hold_stops()


def _guarded(step, doing: str | None = None, log_dir: str | None = None):
    """Run a command's work, turning a failure ft explains (``FtError``) into its one paragraph and exit code. With
    ``doing``, any other exception becomes the unexpected-failure paragraph (exit 1; its traceback in ``log_dir``);
    without, it is raised on, a bug shown with its traceback."""
    from .errors import FtError

    try:
        return step()
    except FtError as exc:
        _err(exc.render())
        raise typer.Exit(exc.exit_code) from None
    except Exception as exc:  # anything else: one paragraph here, the traceback in a file
        if doing is None:
            raise
        _err(_unexpected_failure(exc, doing, log_dir or "."))
        raise typer.Exit(1) from None


def _run_dir(loaded) -> str:
    """Where an unexpected failure of a command that runs a recipe leaves its traceback: the run's output directory."""
    return loaded.recipe.train_args.get("output_dir", ".")


def _temp_dir(name: str) -> str:
    """Where an unexpected failure of a command without a recipe leaves its traceback: <temp dir>/<name>, since there
    is no output directory of a run to hold it."""
    import tempfile

    return str(Path(tempfile.gettempdir()) / name)


def _unexpected_failure(exc: Exception, doing: str, output_dir: str) -> str:
    """The paragraph for an exception ft has no explanation for (a bug, or a library's failure): what failed, the first
    line of its message, and where its traceback was written (``output_dir``/error.log; a rank's own file under
    several processes). ``ft train`` writes that file itself when a run fails once its trainer is built, the file its
    summary.json names (``ft_error_log`` on the exception); it is not written twice. With FT_DEBUG=1 the exception is
    raised instead."""
    import os
    import traceback

    if os.environ.get("FT_DEBUG"):
        raise exc
    rank = os.environ.get("RANK", "0")  # under torchrun every process may fail; each keeps its own traceback
    log = Path(output_dir) / ("error.log" if rank == "0" else f"error-rank{rank}.log")
    written = getattr(exc, "ft_error_log", None)
    try:
        if written and Path(written).is_file():
            log = Path(written)
        else:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("".join(traceback.format_exception(exc)))
        where = f"the full traceback is in {log}"
    except OSError:
        where = "set FT_DEBUG=1 to see the traceback"
    from .recipe.errors import first_line

    first = first_line(exc)
    return (f"ft: {doing} failed with {type(exc).__name__}: {first}. This is not a recipe error ft knows how to "
            f"explain; {where}. Rerun with FT_DEBUG=1 to raise it, and please report it if it looks like a bug.")


@app.command()
def preprocess(recipe: RecipeArg, set_: SetOpt = None, show: ShowOpt = None) -> None:
    """Tokenize the data once (with loss masks and a length column) into data.prepared_path for ft train. With --show
    N, only print the first N training rows as the model sees them (nothing is prepared)."""
    loaded = _load(recipe, set_)
    if show is not None:
        _show(loaded, show)
        return
    from .run.preprocess import preprocess as run_preprocess

    prepared = _guarded(lambda: run_preprocess(loaded, say=_err), "preprocessing", _run_dir(loaded))
    print(json.dumps(prepared.stats, indent=1))


DtypeOpt = Annotated[
    Literal["auto", "float32", "bfloat16", "float16"] | None,
    typer.Option(help="Weights dtype. Default for an adapter: its run's model.dtype (a QLoRA run: the compute_dtype); "
                      "for a full model: auto, the checkpoint's."),
]


@app.command()
def merge(
    source: Annotated[Path, typer.Argument(metavar="RUN_OR_ADAPTER_DIR", show_default=False,
                                           help="A LoRA run directory (its final/), or an adapter folder.")],
    out: Annotated[Path, typer.Option("--out", help="New or empty directory for the merged model.",
                                      show_default=False)],
    dtype: DtypeOpt = None,
) -> None:
    """Fold a LoRA adapter into its base and save a plain model (weights, config, tokenizer, chat template)."""
    from .inference.merge import merge as run_merge
    from .run.notices import install as hide_notices_not_for_the_user

    hide_notices_not_for_the_user()  # as ft train does; not with FT_DEBUG=1 (notices.py)
    _guarded(lambda: run_merge(source, out, dtype, say=_err), "merging", _temp_dir("ft-merge"))
    print(out)


@app.command()
def generate(
    source: Annotated[Path, typer.Argument(metavar="MODEL_OR_RUN_DIR", show_default=False,
                                           help="A run directory (its final/), a model or adapter folder.")],
    prompt: Annotated[list[str] | None, typer.Option(
        help="The text to complete (a user message when the model has a chat template); repeat it for more "
             "prompts, answered in order.", show_default=False)] = None,
    input_: Annotated[list[str] | None, typer.Option(
        "--input", show_default=False, help="The input of an instruction row, one per --prompt (its instruction): "
        "joined as training joins instruction rows (a blank line between).")] = None,
    file: Annotated[Path | None, typer.Option("--file", show_default=False, help="JSON lines, one object per "
                                              "line with `prompt` (text), `messages` (chat) or `instruction` (and "
                                              "`input`); prints JSON lines with a `completion` each.")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 decodes greedily.")] = 0.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling (temperature > 0).")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Seed for sampling.", show_default=False)] = None,
    chat_template: Annotated[bool, typer.Option("--chat-template/--no-chat-template",
                                                help="Render prompts with the saved chat template.")] = True,
    dtype: DtypeOpt = None,
    image: Annotated[Path | None, typer.Option("--image", show_default=False, help="An image every --prompt asks "
                                               "about (a vision-language run: docs/vision.md).")] = None,
    tools: Annotated[Path | None, typer.Option("--tools", show_default=False, help="A JSON file of tool definitions "
                                               "(a JSON-schema function list) the chat template renders into every "
                                               "prompt, as `data.tools` does in training.")] = None,
) -> None:
    """Complete a prompt (or a file of prompts) with a trained model, adapter or merged model."""
    if (not prompt) == (file is None):
        _err("ft generate: give --prompt TEXT (one or more) or --file prompts.jsonl, not both.")
        raise typer.Exit(EXIT_INVALID)
    if input_ and len(input_) != len(prompt or []):
        _err(f"ft generate: --input gives the input of each --prompt's instruction, one each: {len(input_)} --input "
             f"for {len(prompt or [])} --prompt. Give as many of each (--input '' for an instruction without input).")
        raise typer.Exit(EXIT_INVALID)
    if image is not None and file is not None:
        _err("ft generate: --image goes with --prompt (each prompt asks about the image); a --file's prompts take no "
             "image yet. Give the questions with --prompt.")
        raise typer.Exit(EXIT_INVALID)
    from .inference.generate import Sampling, read_prompts
    from .inference.generate import generate as run_generate
    from .run.notices import install as hide_notices_not_for_the_user

    hide_notices_not_for_the_user()  # as ft train does; not with FT_DEBUG=1 (notices.py)
    sampling = Sampling(max_new_tokens, temperature, top_p, chat_template)

    def step() -> None:
        asking = [{"prompt": text} for text in prompt or []] if not input_ else \
            [{"instruction": text, "input": given} for text, given in zip(prompt, input_, strict=True)]
        items = [(f"--prompt {i + 1}", item) for i, item in enumerate(asking)] if file is None \
            else read_prompts(file)
        completions = run_generate(source, items, sampling, dtype, seed, say=_err, image=image, tools=tools)
        for (_, item), completion in zip(items, completions, strict=True):
            print(completion if file is None else json.dumps({**item, "completion": completion}, ensure_ascii=False),
                  flush=True)

    _guarded(step, "generating", _temp_dir("ft-generate"))


@app.command(name="eval")
def eval_(
    sources: Annotated[list[str], typer.Argument(metavar="MODEL_OR_RUN", show_default=False,
                                                 help="Run directories (their final/), checkpoint, model or adapter "
                                                      "folders, or hub ids; several are scored side by side.")],
    tasks: Annotated[list[str], typer.Option("--tasks", show_default=False,
                                             help="lm-eval task names or task YAML files, comma-separated (or "
                                                  "repeated).")],
    limit: Annotated[float | None, typer.Option(min=0.0, show_default=False,
                                                help="Rows scored per task: a count, or a fraction below 1.")] = None,
    num_fewshot: Annotated[int | None, typer.Option(min=0, show_default=False,
                                                    help="Examples in each prompt (default: the task's own).")] = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 8,
    chat_template: Annotated[bool | None, typer.Option(
        "--chat-template/--no-chat-template", show_default=False,
        help="Render prompts with the model's chat template (default: where it has one).")] = None,
    system: Annotated[str | None, typer.Option(show_default=False, help="A system message before every prompt (and "
                                               "a task's description).")] = None,
    dtype: DtypeOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print each model's lm-eval results as JSON.")] = False,
) -> None:
    """Score models on lm-eval tasks (standard benchmarks, or local task files), side by side; a run's results are
    written to <run>/eval/."""
    from .eval.command import as_json as results_json
    from .eval.command import evaluate, table
    from .eval.score import Settings
    from .run.notices import install as hide_notices_not_for_the_user

    hide_notices_not_for_the_user()  # as ft train does; not with FT_DEBUG=1 (notices.py)
    names = [name.strip() for given in tasks for name in given.split(",") if name.strip()]
    settings = Settings(limit, num_fewshot, batch_size, chat_template, system)

    def step() -> None:
        scored = evaluate(sources, names, settings, dtype, say=_err)
        print(results_json(scored) if as_json else table(scored), flush=True)

    _guarded(step, "scoring", _temp_dir("ft-eval"))


@app.command()
def export(
    source: Annotated[Path, typer.Argument(metavar="RUN_OR_MODEL_DIR", show_default=False,
                                           help="A run directory (its final/: a full model, or an adapter folded "
                                                "into its base as ft merge does), or a model directory.")],
    gguf: Annotated[Path, typer.Option("--gguf", metavar="OUT.gguf", show_default=False,
                                       help="The GGUF file to write (for llama.cpp, Ollama, LM Studio).")],
    quant: Annotated[Literal["f32", "f16", "bf16", "q8_0"], typer.Option(
        help="Tensor type of the weight matrices (norms stay f32): f32 exact, f16/bf16 half the size, q8_0 a "
             "quarter.")] = "f16",
    modelfile: Annotated[bool, typer.Option("--modelfile", help="Also write OUT.Modelfile for `ollama create`: "
                                            "its TEMPLATE and stop tokens from the chat template.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT.gguf (and OUT.Modelfile) if they "
                                            "exist.")] = False,
) -> None:
    """Write a trained model as one GGUF file: architecture metadata, tokenizer and chat template, weights."""
    from .export.gguf import export as run_export
    from .run.notices import install as hide_notices_not_for_the_user

    hide_notices_not_for_the_user()  # not with FT_DEBUG=1 (notices.py)

    try:
        _guarded(lambda: run_export(source, gguf, quant, overwrite, modelfile, say=_err), "exporting",
                 _temp_dir("ft-export"))
    except KeyboardInterrupt:
        _err(f"ft export: interrupted; {gguf} was not written (the partial file was removed).")
        raise typer.Exit(130) from None
    print(gguf)


@app.command()
def plan(
    recipe: RecipeArg,
    set_: SetOpt = None,
    gpu_memory: Annotated[str | None, typer.Option(
        "--gpu-memory", show_default=False,
        help="Memory of one GPU, e.g. 80GiB or 24GB (default: this machine's GPU, when it has one).")] = None,
    gpus: Annotated[int, typer.Option(min=1, help="GPUs training data-parallel (DDP: each holds a full copy).")] = 1,
    device: Annotated[Literal["cuda", "cpu"], typer.Option(
        help="Where the recipe will train: cuda (ft's GPU defaults: bf16, activation checkpointing, TRL's fused "
             "LM head) or cpu (float32, full logits).")] = "cuda",
    as_json: Annotated[bool, typer.Option("--json", help="Print the estimate as JSON.")] = False,
) -> None:
    """Estimate peak training memory per GPU from the model's config alone (no weights loaded), and what would fit."""
    loaded = _load(recipe, set_)
    from .plan.report import plan as make_plan

    result = _guarded(lambda: make_plan(loaded.recipe, str(recipe), gpu_memory=gpu_memory, gpus=gpus, device=device))
    print(json.dumps(result.as_dict(), indent=1) if as_json else result.render())


@app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR", show_default=False,
                                                   help="Output directories of ft train runs (train.output_dir).")],
    plots: Annotated[Path | None, typer.Option("--plots", metavar="DIR", show_default=False,
                                               help="Also draw the runs' loss, eval loss, learning rate and tokens/s "
                                                    "on shared axes, as PNGs in DIR.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print every run's summary and the recipe keys that "
                                          "differ, as JSON.")] = False,
) -> None:
    """Show what runs did: status, steps, losses, eval metrics, tokens/s, peak memory, wall time, side by side with
    the recipe keys that differ. A run still training is read from its newest checkpoint."""
    from .outputs.report import load_runs, merged, render, write_overlay_plots

    def step() -> None:
        runs = load_runs(run_dirs)
        print(json.dumps(merged(runs), indent=1) if as_json else render(runs))
        for path in write_overlay_plots(runs, plots) if plots is not None else ():
            _err(f"ft report: wrote {path}")

    _guarded(step, "reporting", _temp_dir("ft-report"))


import_app = typer.Typer(no_args_is_help=True, help="Bring another tool's training config over as an ft recipe, "
                         "naming every key that did not come and why.")
app.add_typer(import_app, name="import")


@import_app.command("axolotl")
def import_axolotl(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", show_default=False, help="An Axolotl YAML config.")],
    out: Annotated[Path | None, typer.Option("--out", show_default=False,
                                             help="Write the recipe here (default: stdout).")] = None,
) -> None:
    """Write an ft recipe from an Axolotl config: each key carried, ignored (empty or off) or named as not carried,
    with the reason, at the end of the recipe. Exit 0: ft accepts the recipe; 1: the recipe is written but ft refuses
    it (its reasons on stderr; fix it by hand); 2: the config cannot be read."""
    from .importers.axolotl import import_axolotl as run_import

    def step() -> int:
        result = run_import(config, out)
        if out is None:
            print(result.text, end="")
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(result.text, encoding="utf-8")
        counts = result.ledger.counts()
        _err(f"ft import axolotl: {config} -> {out or 'stdout'}: {counts['carried']} keys carried, "
             f"{counts['not carried']} not carried, {counts['ignored']} ignored (listed at the end of the recipe).")
        for warning in result.verdict.warnings:
            _err("warning: " + warning.render())
        if not result.valid:
            _err(result.verdict.message)
            return 1
        return 0

    code = _guarded(step, "importing the Axolotl config", _temp_dir("ft-import"))
    if code:
        raise typer.Exit(code)


@app.command()
def schema() -> None:
    """Print the JSON Schema of recipes (for editors: yaml-language-server)."""
    from .recipe.json_schema import recipe_json_schema

    print(json.dumps(recipe_json_schema(), indent=1))


def main() -> None:
    from .run.ranks import exit_without_finalizing, world_size

    if world_size() == 1:
        try:
            app(prog_name="ft")
        finally:
            _skip_the_final_collections()
        return
    try:  # one process of several: see exit_without_finalizing for why it does not end the usual way
        app(prog_name="ft")
        code = 0
    except SystemExit as done:
        code = _exit_code(done)
    exit_without_finalizing(code)


def _skip_the_final_collections() -> None:
    """Exempt the objects alive now from the garbage collections the interpreter runs as it shuts down
    (``gc.freeze``). After ``ft train`` they walk every object torch, transformers and TRL created and free nothing
    anyone still needs: most of the exit on a CPU (benchmarks/README.md measures it with side_by_side.py). Nothing
    else changes: what ft writes is closed by now, and atexit handlers (trackers' last uploads, logging's flush) still
    run."""
    import gc

    gc.freeze()


def _exit_code(done: SystemExit) -> int:
    """The status ``sys.exit`` would give for ``done``: None is 0, an integer itself, anything else printed and 1."""
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    _err(str(done.code))
    return 1


if __name__ == "__main__":
    main()
