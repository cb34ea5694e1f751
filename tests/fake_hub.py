"""A local stand-in for the Hugging Face Hub's write API, for tests that push (point ``HF_ENDPOINT`` at ``.url``).

It answers the calls huggingface_hub makes to create a repository and a branch and to commit files: ``POST
/api/repos/create``, ``/api/models/<repo>/branch/<name>``, ``/preupload/<revision>`` and ``/commit/<revision>``, with
the JSON and NDJSON bodies huggingface_hub sends and reads. Every file is answered as a "regular" upload (its bytes
inside the commit), as the Hub answers small text files: no LFS or Xet storage is needed, and every byte that goes up
is seen here. Like the Hub, a commit to a branch that does not exist is refused (404, RevisionNotFound).

What it keeps, for the tests to compare: ``repos`` (id -> {"private", "branches": {name: {path: bytes}}}),
``commits`` (one dict per commit: repo, revision, message, files), ``uploads`` (every (repo, revision, path) sent,
in order, repeats included) and ``authorizations`` (the Authorization header of every request). ``refuse`` maps a
call (``create``, ``branch``, ``commit``) to the status it answers instead (401, 500); a call in ``stall`` never answers
(until ``close``); ``refuse_commits`` refuses only the commits whose message starts with its key, with its status.
"""

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
        self.repos: dict[str, dict] = {}
        self.commits: list[dict] = []
        self.uploads: list[tuple[str, str, str]] = []
        self.authorizations: list[str | None] = []
        self.unanswered: list[str] = []  # requests this stand-in does not know (answered 404)
        self.refuse: dict[str, int] = {}
        self.stall: set[str] = set()
        self.refuse_commits: dict[str, int] = {}  # message prefix -> status
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

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
                return 200, {}, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
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
        with self._lock:
            branches = self.repos[repo]["branches"]
            if revision not in branches:
                return 404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": f"Invalid rev id: {revision}"}, {
                    "error": f"Invalid rev id: {revision}"}
            branches[revision].update(added)
            self.uploads.extend((repo, revision, path) for path in added)
            oid = hashlib.sha1(repr((len(self.commits), sorted(added))).encode()).hexdigest()
            self.commits.append({"repo": repo, "revision": revision, "message": header.get("summary"),
                                 "files": sorted(added), "oid": oid})
        return 200, {}, {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid, "success": True}


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
