"""A local stand-in for the Hugging Face Hub's write API, for tests that push (point ``HF_ENDPOINT`` at ``.url``).

It answers the calls huggingface_hub makes to create a repository and a branch and to commit files: ``POST
/api/repos/create``, ``/api/models/<repo>/branch/<name>``, ``/preupload/<revision>`` and ``/commit/<revision>``, with
the JSON and NDJSON bodies huggingface_hub sends and reads. A file is answered as a "regular" upload (its bytes inside
the commit, base64), as the Hub answers small text files, unless its name ends with one of ``lfs_suffixes``: those are
answered "lfs", as the Hub answers weights, and go up as huggingface_hub sends them to LFS storage: their sha256 and
size to the LFS batch API (``POST /<repo>.git/info/lfs/objects/batch``), which answers where to PUT the bytes (here,
``/lfs-storage/<repo>/<sha256>``; nothing, for bytes already stored, as the Hub skips them) and where to verify them;
the commit then names the file by sha256 and size (an ``lfsFile`` line) and takes its bytes from that storage (a commit
naming bytes never stored is refused, 422; the Hub refuses it too). Bytes PUT whose sha256 is not the one announced are
refused (400).

huggingface_hub sends a file the preupload answers "lfs" through Xet storage, not LFS, whenever ``hf_xet`` is installed
(a dependency of huggingface_hub on x86-64 and arm64; the choice is the client's alone, the server's answers cannot
steer it): a client pushing such files to this stand-in, which has no Xet storage, runs with HF_HUB_DISABLE_XET=1 (its
request for a Xet token would be answered 404 and listed in ``unanswered``). Like the Hub, a commit to a branch that
does not exist is refused (404, RevisionNotFound).

What it keeps, for the tests to compare: ``repos`` (id -> {"private", "branches": {name: {path: bytes}}}), ``commits``
(one dict per commit: repo, revision, message, files, ``lfs``: those of its files that came through LFS storage,
``lfs_oids``: their sha256), ``uploads`` (every (repo, revision, path) sent, in order, repeats included),
``lfs_objects`` ((repo, sha256) -> the bytes PUT), ``lfs_puts`` (every (repo, sha256) PUT, in order) and
``authorizations`` (the Authorization header of every request). ``refuse`` maps a call (``create``, ``branch``,
``commit``) to the status it answers instead (401, 500); a call in ``stall`` never answers (until ``close``);
``refuse_commits`` refuses only the commits whose message starts with its key, with its status."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

USER = "someone"  # the account the token belongs to: a repository named without a namespace is created under it


class FakeHub:
    def __init__(self):
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._empty()
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def reset(self) -> None:
        """Empty again, with no failure set, at the same address (tests sharing one stand-in: its address is then part
        of one environment they all run with). A call a ``stall`` held is answered first (503)."""
        stalled, self._closing = self._closing, threading.Event()
        stalled.set()
        with self._lock:
            self._empty()

    def _empty(self) -> None:
        self.repos: dict[str, dict] = {}
        self.commits: list[dict] = []
        self.uploads: list[tuple[str, str, str]] = []
        self.lfs_suffixes: tuple[str, ...] = ()  # files answered "lfs" at preupload (".safetensors")
        self.lfs_objects: dict[tuple[str, str], bytes] = {}  # (repo, sha256) -> the bytes PUT to LFS storage
        self.lfs_puts: list[tuple[str, str]] = []
        self.authorizations: list[str | None] = []
        self.unanswered: list[str] = []  # requests this stand-in does not know (answered 404)
        self.refuse: dict[str, int] = {}
        self.stall: set[str] = set()
        self.refuse_commits: dict[str, int] = {}  # message prefix -> status

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def files(self, repo: str, revision: str = "main") -> dict[str, bytes]:
        return self.repos[repo]["branches"][revision]

    # --- the API ---------------------------------------------------------------------------------------------------

    def answer(self, method: str, path: str, headers, body: bytes) -> tuple[int, dict, dict | None]:
        """(status, extra headers, JSON body) for one request."""
        with self._lock:
            self.authorizations.append(headers.get("Authorization"))
        parts = [unquote(p) for p in path.split("?")[0].strip("/").split("/")]
        if len(parts) == 6 and parts[1].endswith(".git") and parts[2:5] == ["info", "lfs", "objects"]:
            repo = f"{parts[0]}/{parts[1].removesuffix('.git')}"
            if method == "POST" and parts[5] == "batch":
                return self._lfs_batch(repo, json.loads(body))
            if method == "POST" and parts[5] == "verify":
                return self._lfs_verify(repo, json.loads(body))
        if method == "PUT" and len(parts) == 4 and parts[0] == "lfs-storage":
            return self._lfs_put(f"{parts[1]}/{parts[2]}", parts[3], body)
        if method == "POST" and parts[:3] == ["api", "repos", "create"]:
            return self._refused("create") or self._create_repo(json.loads(body or b"{}"))
        if method == "POST" and parts == ["api", "validate-yaml"]:  # a README.md's metadata, checked before a commit
            return 200, {}, {"errors": [], "warnings": []}
        if method == "POST" and len(parts) >= 6 and parts[:2] == ["api", "models"]:
            repo, action, rest = f"{parts[2]}/{parts[3]}", parts[4], "/".join(parts[5:])
            if repo not in self.repos:
                return 404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}, {}
            if action == "branch":
                return self._refused("branch") or self._create_branch(repo, rest)
            if action == "preupload":
                files = json.loads(body)["files"]
                return 200, {}, {"files": [{"path": f["path"], "shouldIgnore": False,
                                            "uploadMode": "lfs" if f["path"].endswith(self.lfs_suffixes) else "regular"}
                                           for f in files]}
            if action == "commit":
                return self._refused("commit") or self._commit(repo, rest, body)
        with self._lock:
            self.unanswered.append(f"{method} {path}")
        return 404, {"X-Error-Code": "EntryNotFound", "X-Error-Message": "not in the stand-in"}, {}

    def _refused(self, call: str):
        if call in self.stall:
            self._closing.wait()
            return 503, {}, {}
        if call in self.refuse:
            status = self.refuse[call]
            why = f"refused with {status} by the stand-in"
            return status, {"X-Error-Message": why}, {"error": why}
        return None

    def _create_repo(self, asked: dict):
        repo = f"{asked.get('organization') or USER}/{asked['name']}"
        with self._lock:
            if repo in self.repos:
                return 409, {"X-Error-Message": "You already created this model repo"}, {
                    "error": "You already created this model repo", "url": f"{self.url}/{repo}"}
            private = asked.get("private", asked.get("visibility") == "private")
            self.repos[repo] = {"private": bool(private), "branches": {"main": {}}}
        return 200, {}, {"url": f"{self.url}/{repo}", "name": repo}

    def _create_branch(self, repo: str, branch: str):
        with self._lock:
            branches = self.repos[repo]["branches"]
            if branch in branches:
                return 409, {"X-Error-Message": "Reference already exists"}, {"error": "Reference already exists"}
            branches[branch] = dict(branches["main"])
        return 200, {}, {}

    def _commit(self, repo: str, revision: str, body: bytes):
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        for prefix, status in self.refuse_commits.items():
            if (header.get("summary") or "").startswith(prefix):
                return status, {"X-Error-Message": f"refused with {status}"}, {"error": f"refused with {status}"}
        added = {line["value"]["path"]: base64.b64decode(line["value"]["content"])
                 for line in lines if line["key"] == "file"}
        pointers = {line["value"]["path"]: line["value"] for line in lines if line["key"] == "lfsFile"}
        with self._lock:
            branches = self.repos[repo]["branches"]
            if revision not in branches:
                return 404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": f"Invalid rev id: {revision}"}, {
                    "error": f"Invalid rev id: {revision}"}
            for path, pointer in pointers.items():
                stored = self.lfs_objects.get((repo, pointer["oid"]))
                if pointer["algo"] != "sha256" or stored is None or len(stored) != pointer["size"]:
                    why = f"{path}: the LFS pointer names bytes that were never uploaded ({pointer['oid']})"
                    return 422, {"X-Error-Message": why}, {"error": why}
                added[path] = stored
            branches[revision].update(added)
            self.uploads.extend((repo, revision, path) for path in added)
            oid = hashlib.sha1(repr((len(self.commits), sorted(added))).encode()).hexdigest()
            self.commits.append({"repo": repo, "revision": revision, "message": header.get("summary"),
                                 "files": sorted(added), "lfs": sorted(pointers), "oid": oid,
                                 "lfs_oids": {path: pointer["oid"] for path, pointer in pointers.items()}})
        return 200, {}, {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid, "success": True}

    def _lfs_batch(self, repo: str, asked: dict):
        """Where to PUT each object (the basic transfer: one PUT of the whole file) and where to verify it; no actions
        for an object already stored, which the client then skips."""
        if repo not in self.repos:
            return 404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}, {}
        objects = []
        for obj in asked["objects"]:
            answer = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            with self._lock:
                stored = (repo, obj["oid"]) in self.lfs_objects
            if not stored:
                answer["actions"] = {"upload": {"href": f"{self.url}/lfs-storage/{repo}/{obj['oid']}"},
                                     "verify": {"href": f"{self.url}/{repo}.git/info/lfs/objects/verify"}}
            objects.append(answer)
        return 200, {}, {"transfer": "basic", "objects": objects}

    def _lfs_put(self, repo: str, oid: str, body: bytes):
        if hashlib.sha256(body).hexdigest() != oid:
            return 400, {"X-Error-Message": "the bytes are not the object announced"}, {}
        with self._lock:
            self.lfs_objects[(repo, oid)] = body
            self.lfs_puts.append((repo, oid))
        return 200, {}, {}

    def _lfs_verify(self, repo: str, asked: dict):
        with self._lock:
            stored = self.lfs_objects.get((repo, asked["oid"]))
        if stored is None or len(stored) != asked["size"]:
            return 404, {"X-Error-Message": f"object {asked['oid']} was not stored"}, {}
        return 200, {}, {}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """Quiet about clients that hung up (a push that gave up on a stalled call); loud about anything else."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self, method: str):
            body = self._body()
            status, headers, payload = hub.answer(method, self.path, self.headers, body)
            data = json.dumps(payload if payload is not None else {}).encode()
            self.send_response(status)
            for name, value in {**headers, "Content-Type": "application/json",
                                "Content-Length": str(len(data))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(chunks)
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def do_GET(self):  # noqa: N802 (http.server's names)
            self._serve("GET")

        def do_POST(self):  # noqa: N802
            self._serve("POST")

        def do_PUT(self):  # noqa: N802
            self._serve("PUT")

        def log_message(self, *args):
            pass

    return Handler
