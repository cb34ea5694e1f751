"""Every Hub repository a recipe reads is checked before anything downloads, in seconds, against a local server
standing in for the Hub (HF_ENDPOINT): a missing, private, gated or unreachable repository stops `ft train` with exit
2, the recipe key and the way out, instead of a minute of huggingface_hub's retries and a traceback at load time."""

from __future__ import annotations

import json
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import ASSETS, DATA, run_ft, tiny_sft

TOKEN = "hf_reader"
ROUTES = {  # auth-check path -> (status, headers) as the Hub answers it
    "/api/models/org/ok/auth-check": (200, {}),
    "/api/models/org/missing/auth-check": (404, {"X-Error-Code": "RepoNotFound",
                                                 "X-Error-Message": "Repository not found"}),
    "/api/models/org/private/auth-check": (401, {"X-Error-Code": "RepoNotFound",
                                                 "X-Error-Message": "Invalid username or password."}),
    "/api/models/org/gated/auth-check": (403, {"X-Error-Code": "GatedRepo",
                                               "X-Error-Message": "Access to model org/gated is restricted."}),
    "/api/models/org/broken/auth-check": (503, {}),
    "/api/datasets/org/rows/auth-check": (404, {"X-Error-Code": "RepoNotFound",
                                                "X-Error-Message": "Repository not found"}),
}


class _Hub(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.endswith("/auth-check"):  # huggingface_hub also asks the Hub other things of its own
            self.server.asked.append((self.path, self.headers.get("Authorization")))
        status, headers = ROUTES.get(self.path, (404, {"X-Error-Code": "RepoNotFound"}))
        if self.path == "/api/models/org/gated/auth-check" and self.headers.get("Authorization") == f"Bearer {TOKEN}":
            status, headers = 200, {}  # a token whose owner accepted the terms
        body = json.dumps({"error": headers.get("X-Error-Message", "ok")}).encode()
        self.send_response(status)
        for name, value in {**headers, "Content-Type": "application/json", "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def module_hub(tmp_path_factory):
    """One stand-in and one HF_HOME for the module's commands that reach it, so they run with one environment and fork
    from one server started with it (conftest.run_ft's ``shared``: huggingface_hub reads HF_ENDPOINT and HF_HOME at
    import); it answers each repository by its name (ROUTES), and each test sees only what it asked (``hub``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    server.asked = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, _env(tmp_path_factory.mktemp("hub"), f"http://127.0.0.1:{server.server_port}")
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def hub(module_hub):
    server, _ = module_hub
    server.asked.clear()
    return server


@pytest.fixture
def reads_env(module_hub) -> dict:
    return module_hub[1]


@pytest.fixture
def closed_port():
    """A port nothing listens on, for the whole test: bound (without SO_REUSEADDR) and never listening, so connections
    to it are refused at once and no other process can bind it meanwhile (a port bound and released again could be
    taken in between by a server of a parallel test, and answer)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def _env(tmp_path, endpoint: str, **more) -> dict:
    return {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": None,
            "HF_TOKEN": None, "HF_HUB_ETAG_TIMEOUT": "2", **more}


def _recipe(write_recipe, tmp_path, model: str = str(ASSETS), **data) -> str:
    recipe = tiny_sft(tmp_path / "out", max_steps=1)
    recipe["model"] = {"name": model, "init": "pretrained" if model != str(ASSETS) else "random"}
    recipe["data"].update(data)
    return str(write_recipe(recipe))


@pytest.mark.parametrize(("repo", "said"), [
    ("org/missing", "the Hub has no model 'org/missing' that the token here may read"),
    ("org/private", "the Hub has no model 'org/private' that the token here may read"),
    ("org/gated", "'org/gated' is gated and the token here may not read it: accept its terms at"),
])
def test_a_repository_this_machine_may_not_read_stops_the_run_before_anything_loads(write_recipe, tmp_path, hub,
                                                                                     reads_env, repo, said):
    result = run_ft("train", _recipe(write_recipe, tmp_path, repo), env=reads_env, shared=True)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "model.name" in result.stderr and said in result.stderr and "Traceback" not in result.stderr
    assert "Retrying" not in result.stderr and not (tmp_path / "out" / "final").exists()
    assert hub.asked == [(f"/api/models/{repo}/auth-check", None)]  # asked once, with no token here


def test_a_token_that_may_read_a_gated_repository_passes_and_is_sent(write_recipe, tmp_path, hub):
    """The check itself, in a fresh process (huggingface_hub reads its settings at import): no problem with the
    token, and the token went to the server."""
    import subprocess
    import sys

    code = ("import json, sys; from ft.run.hub import check_reads; from ft.recipe import load_recipe; "
            "print(json.dumps([p.render() for p in check_reads(load_recipe(sys.argv[1]).recipe)]))")
    env = {k: v for k, v in {**__import__("os").environ,
                             **_env(tmp_path, f"http://127.0.0.1:{hub.server_port}", HF_TOKEN=TOKEN)}.items()
           if v is not None}
    done = subprocess.run([sys.executable, "-c", code, _recipe(write_recipe, tmp_path, "org/gated")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert hub.asked == [("/api/models/org/gated/auth-check", f"Bearer {TOKEN}")]


def test_a_hub_dataset_is_checked_under_its_data_key(write_recipe, tmp_path, hub, reads_env):
    path = _recipe(write_recipe, tmp_path, train=[{"path": "org/rows", "format": "chat"}], eval=[])
    result = run_ft("train", path, env=reads_env, shared=True)
    assert result.returncode == 2 and "data.train.0.path" in result.stderr
    assert "the Hub has no dataset 'org/rows'" in result.stderr
    assert hub.asked == [("/api/datasets/org/rows/auth-check", None)]


@pytest.mark.parametrize(("method", "section", "reads"), [
    ("dpo", {"ref_model": "org/ref"}, [("dpo.ref_model", "org/ref")]),
    ("dpo", {"ref_model": str(ASSETS)}, []),  # a directory is read from disk
    ("grpo", {"rewards": [{"model": "org/rm", "dtype": "bfloat16"}, {"name": "exact_match"}, {"model": str(ASSETS)},
                          {"model": "org/rm2"}]},
     [("grpo.rewards.0.model", "org/rm"), ("grpo.rewards.3.model", "org/rm2")]),
    ("rloo", {"rewards": [{"name": "exact_match"}, {"model": "org/rm"}]}, [("rloo.rewards.1.model", "org/rm")]),
])
def test_the_models_a_method_section_declares_are_read_from_the_hub_under_their_keys(write_recipe, tmp_path, method,
                                                                                  section, reads):
    """Besides model.name, every model the method's section declares (``MethodSection.models``: a reference, reward
    models) that names a Hub repository is asked for, under its own key, in recipe order."""
    from ft.recipe import load_recipe
    from ft.run.hub import hub_reads

    recipe = tiny_sft(tmp_path / "out", max_steps=1)
    data = {"dpo": ("preference.jsonl", "preference")}.get(method, ("prompts.jsonl", "prompt"))
    recipe.update(method=method, data={"train": [{"path": str(DATA / data[0]), "format": data[1]}]})
    recipe[method] = section
    found = hub_reads(load_recipe(write_recipe(recipe)).recipe)
    assert [(read.key, read.repo_id) for read in found] == reads
    assert all(read.kind == "model" and read.revision is None for read in found)


@pytest.mark.parametrize("endpoint", ["closed", "503"])
def test_an_unreachable_hub_stops_at_once_naming_the_way_out(write_recipe, tmp_path, reads_env, closed_port, endpoint):
    env = _env(tmp_path, f"http://127.0.0.1:{closed_port}") if endpoint == "closed" else reads_env
    repo = "org/ok" if endpoint == "closed" else "org/broken"
    result = run_ft("train", _recipe(write_recipe, tmp_path, repo), env=env, shared=endpoint != "closed")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "the Hub cannot be reached from here" in result.stderr and "is not in the local cache" in result.stderr
    assert "Retrying" not in result.stderr and "Traceback" not in result.stderr


def _cache(tmp_path, repo: str) -> None:
    """``repo`` in the Hub cache under HF_HOME, as `hf download` leaves it: the tiny model's files in a snapshot."""
    folder = tmp_path / "hf-home" / "hub" / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    shutil.copytree(ASSETS, folder / "snapshots" / commit)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)


@pytest.mark.slow
def test_a_cached_model_and_no_hub_say_set_offline_and_offline_it_trains(write_recipe, tmp_path, closed_port):
    _cache(tmp_path, "org/cached")
    path = _recipe(write_recipe, tmp_path, "org/cached")
    down = _env(tmp_path, f"http://127.0.0.1:{closed_port}")
    result = run_ft("train", path, env=down)
    assert result.returncode == 2 and "'org/cached' is in the local cache: set HF_HUB_OFFLINE=1" in result.stderr
    # the advice works: offline, the model loads from the cache (its weights are random-initialised: the tiny
    # model ships no weights, so the recipe builds it from the cached config)
    recipe = json.loads(json.dumps(tiny_sft(tmp_path / "out", max_steps=1)))
    recipe["model"] = {"name": "org/cached", "init": "random"}
    result = run_ft("train", str(write_recipe(recipe, name="offline.yaml")), env={**down, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]


def test_offline_a_model_missing_from_the_cache_is_named(write_recipe, tmp_path):
    result = run_ft("train", _recipe(write_recipe, tmp_path, "org/elsewhere"),
                    env=_env(tmp_path, "http://127.0.0.1:9", HF_HUB_OFFLINE="1"))
    assert result.returncode == 2
    assert "'org/elsewhere' is not in this machine's Hugging Face cache" in result.stderr
    assert "HF_HUB_OFFLINE is set" in result.stderr and "model.name" in result.stderr
