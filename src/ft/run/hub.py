"""The Hugging Face Hub as this machine sees it: for the recipes that push to it, and for every repository a recipe
reads from it (``check_reads``).

transformers and TRL push with the token huggingface_hub finds on the machine: the ``HF_TOKEN`` environment variable,
else the login ``hf auth login`` stored. A recipe never carries one (``train.hub_token`` is refused: the recipe file
would hold it, and transformers pickles its arguments into every ``training_args.bin``). Without a token, or with the
Hub switched off, the trainer would fail creating the repository after the model loaded; ``check_hub`` runs at the
start of ``ft train``, before any model or data loads, next to ``hardware.check_hardware``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..recipe import Problem, Recipe
from ..recipe.errors import first_line
from ..recipe.hub import pushing_keys
from ..recipe.methods import models_of

FIX = ("set the `HF_TOKEN` environment variable to a write token (https://huggingface.co/settings/tokens) or run "
       "`hf auth login` on this machine")


def check_hub(recipe: Recipe) -> list[Problem]:
    """What stops this machine from pushing where the recipe asks (nothing when it does not push)."""
    keys = pushing_keys(recipe)
    if not keys:
        return []
    from huggingface_hub import constants, get_token  # a lazy module: cheap, and only for recipes that push

    problems = []
    if constants.is_offline_mode():
        problems += [Problem(key, "the Hub is switched off here (HF_HUB_OFFLINE is set), so the push would fail; "
                             "unset HF_HUB_OFFLINE on a machine that reaches huggingface.co, or remove this key.")
                     for key in keys]
    try:
        token = get_token()
    except Exception as exc:  # with HF_OIDC_RESOURCE set, a failed token exchange raises
        return problems + [Problem(key, f"getting a Hugging Face token failed ({first_line(exc)}); {FIX}.")
                           for key in keys]
    if token is None:
        problems += [Problem(key, "pushing to the Hub needs a Hugging Face token and this machine has none (no "
                             f"HF_TOKEN environment variable, no stored login); {FIX}, or remove this key.")
                     for key in keys]
    return problems


def push_repo(recipe: Recipe) -> str:
    """The repository ``train.push_to_hub`` writes to as the recipe names it: ``train.hub_model_id``, else (as
    transformers names it) the output directory's name, under the token owner's account."""
    return recipe.train_args.get("hub_model_id") or Path(recipe.train_args["output_dir"]).absolute().name


def check_push(recipe: Recipe) -> list[Problem]:
    """For a recipe with ``train.push_to_hub``: create its repository (private as ``train.hub_private_repo`` says, or
    found as it is) and its ``train.hub_revision`` branch, as the trainer would once the model loaded (transformers
    creates the repository but no branch, and its pushes to a missing branch fail unseen). A token that may not
    write, or a Hub that does not answer, is so found before any data or model loads. Call it from one process."""
    args = recipe.train_args
    if not args.get("push_to_hub"):
        return []
    from huggingface_hub import HfApi

    from ..outputs.hub_push import limit_silence, status_of

    limit_silence()  # this call and every later one: the checkpoint pushes, the final push
    key = "train.hub_model_id" if args.get("hub_model_id") else "train.push_to_hub"
    repo = push_repo(recipe)
    try:
        made = HfApi().create_repo(repo, private=args.get("hub_private_repo"), exist_ok=True)
        if args.get("hub_revision"):
            HfApi().create_branch(made.repo_id, branch=args["hub_revision"], exist_ok=True)
    except Exception as exc:  # refused, a server error, no answer
        status = status_of(exc)
        if status in (401, 403):
            return [Problem(key, f"the Hub refused to create or open the repository '{repo}' with the token here "
                            f"({status}: {first_line(exc)}); use a token that may write there ({FIX}), or name a "
                            "repository of yours in train.hub_model_id.")]
        return [Problem(key, f"creating the repository '{repo}' on the Hub failed ({type(exc).__name__}: "
                        f"{first_line(exc)}), so the run could not be pushed; check the network (HF_ENDPOINT is "
                        f"{_endpoint()}) and try again, or remove train.push_to_hub.")]
    return []


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


# --- what the recipe reads from the Hub ------------------------------------------------------------------------------

TIMEOUT = 10.0  # seconds for the Hub to answer one question; huggingface_hub's own client waits forever
LOGIN = "set HF_TOKEN or run `hf auth login` with a token that may read it"


@dataclass(frozen=True)
class HubRead:
    """One repository a recipe key names: ``kind`` is the Hub's repository type (``model``, ``dataset``);
    ``filename`` is a file the run reads from it, to find the repository in the local cache."""

    key: str
    repo_id: str
    kind: str
    revision: str | None = None
    filename: str = "config.json"


def hub_reads(recipe: Recipe) -> list[HubRead]:
    """Every Hub repository ``ft train`` will read for ``recipe``: the model (its GGUF file), an adapter to continue,
    the models the method's section declares (``MethodSection.models``: a reference, reward models, a teacher), and
    the data sources that are Hub datasets."""
    from ..data.sources import source_kind
    from ..model.loading import names_a_path

    def hub(value: str | None) -> bool:
        return bool(value) and not names_a_path(value) and not Path(value).exists()

    reads = []
    model, adapter = recipe.model, recipe.adapter
    if hub(model.name):
        reads.append(HubRead("model.name", model.name, "model", model.revision, model.gguf_file or "config.json"))
    if adapter is not None and hub(getattr(adapter, "path", None)):
        reads.append(HubRead("adapter.path", adapter.path, "model", None, "adapter_config.json"))
    reads += [HubRead(extra.key, extra.name, "model") for extra in models_of(recipe) if hub(extra.name)]
    for split, sources in (("train", recipe.data.train), ("eval", recipe.data.eval_sources)):
        for i, source in enumerate(sources):
            if source_kind(source) == "hub":
                reads.append(HubRead(f"data.{split}.{i}.path", source.path, "dataset", source.revision, "README.md"))
    return reads


def check_reads(recipe: Recipe) -> list[Problem]:
    """Whether this machine can read every repository the recipe names, asked once each and answered in seconds,
    before anything downloads: without it, an unreachable Hub costs about a minute of huggingface_hub's retries before
    the model fails to load, and a gated or misspelled repository fails only then. Offline (``HF_HUB_OFFLINE``), a
    model must be in the local cache. Reachable, each repository is asked the Hub's auth-check (exists, and the token
    here may read it: a gated one needs its terms accepted). Unreachable, the first failure ends the asking."""
    reads = hub_reads(recipe)
    if not reads:
        return []
    from huggingface_hub import constants, try_to_load_from_cache

    def cached(read: HubRead) -> bool:
        found = try_to_load_from_cache(read.repo_id, read.filename, revision=read.revision, repo_type=read.kind)
        return isinstance(found, str)

    if constants.is_offline_mode():
        return [Problem(read.key, f"'{read.repo_id}' is not in this machine's Hugging Face cache "
                        f"({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set, so it cannot be downloaded: unset "
                        "HF_HUB_OFFLINE on a machine that reaches the Hub, download it there first (`hf download "
                        f"{read.repo_id}`), or give a local path.")
                for read in reads if read.kind == "model" and not cached(read)]
    problems, unreachable = [], None
    for read in reads:
        if unreachable is None:
            answer = _ask(read)
            if answer is None:
                continue
            kind, why = answer
            if kind != "unreachable":
                problems.append(Problem(read.key, why))
                continue
            unreachable = why
        if read.kind == "model" and cached(read):
            problems.append(Problem(read.key, f"the Hub cannot be reached from here ({unreachable}); '{read.repo_id}' "
                                    "is in the local cache: set HF_HUB_OFFLINE=1 to train from it without asking the "
                                    "Hub."))
        else:
            problems.append(Problem(read.key, f"the Hub cannot be reached from here ({unreachable}) and "
                                    f"'{read.repo_id}' is not in the local cache: fix the network (HF_ENDPOINT is "
                                    f"{constants.ENDPOINT}), download it on a machine that can and copy the cache "
                                    f"({constants.HF_HUB_CACHE}), or give a local path."))
    return problems


def _ask(read: HubRead) -> tuple[str, str] | None:
    """None when the repository may be read; else (``unreachable`` | ``refused``, why)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    from ..outputs.hub_push import status_of

    url = f"{constants.ENDPOINT}/api/{read.kind}s/{read.repo_id}/auth-check"
    page = f"{constants.ENDPOINT}/{'datasets/' if read.kind == 'dataset' else ''}{read.repo_id}"
    try:
        hf_raise_for_status(get_session().get(url, headers=build_hf_headers(), timeout=TIMEOUT))
    except GatedRepoError:
        return "refused", (f"'{read.repo_id}' is gated and the token here may not read it: accept its terms at "
                           f"{page} while logged in, then {LOGIN}.")
    except RepositoryNotFoundError:
        return "refused", (f"the Hub has no {read.kind} '{read.repo_id}' that the token here may read (a misspelled "
                           f"id, or a private repository): check the id at {page}, or {LOGIN}.")
    except HfHubHTTPError as exc:
        status = status_of(exc) or "an error"
        if isinstance(status, int) and status >= 500:
            return "unreachable", f"it answered {status}"
        return "refused", f"the Hub answered {status} for '{read.repo_id}' ({first_line(exc)}); {LOGIN}."
    except Exception as exc:  # the connection: refused, no route, no name, timed out
        return "unreachable", f"{type(exc).__name__}: {first_line(exc)}"
    return None
