"""A Hugging Face hub on 127.0.0.1 for `localspec pull` tests: the real client talks to it through
HF_ENDPOINT, so nothing in localspec is mocked.

It serves the endpoints huggingface_hub uses for a pull, with the hub's headers:
`GET /api/models/{repo}[/revision/{rev}]` (model_info with `blobs=true`: siblings with size and
LFS sha256), `HEAD /{repo}/resolve/{rev}/{file}` (X-Repo-Commit, ETag, X-Linked-Etag,
X-Linked-Size; X-Error-Code RepoNotFound / EntryNotFound on 404) and `GET` of the same, which
redirects (302) to a signed-looking `/cdn/...` address serving the bytes with Range (206 +
Content-Range), as the hub redirects LFS files to its CDN. Files other than .gguf/.safetensors
are kept "in git", as on the hub: listed without LFS data, their ETag and blobId the git blob
sha1, served directly from /resolve/. Faults a test can arm per file: cut the connection after N bytes,
stall after N bytes until released, serve a corrupted byte under the right metadata, stream for
ever past the bytes asked for; and for the whole hub (`endless`): a listing or a redirect that
streams for ever. Every request is recorded (method, path, Range) so tests can assert what the
client asked for.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Fault:
    cut_after: int | None = None       # close the connection after this many body bytes
    stall_after: int | None = None     # send this many bytes, then wait for `release`
    corrupt: bool = False              # flip the last byte (same size, wrong sha256)
    endless: bool = False              # no Content-Length; after the bytes asked for, more, for ever
    times: int = 1                     # how many downloads it hits (Range probes never)
    release: threading.Event = field(default_factory=threading.Event)
    stalled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    range: str | None


@dataclass
class Repo:
    files: dict[str, bytes]
    listed_extra: list[str]            # names listed in siblings but never served
    sha256: dict[str, str] = field(default_factory=dict)
    commit: str = ""

    def __post_init__(self) -> None:
        self.sha256 = {n: hashlib.sha256(c).hexdigest() for n, c in self.files.items()}
        self.commit = hashlib.sha1(json.dumps(sorted(self.sha256.items())).encode()).hexdigest()

    def is_lfs(self, name: str) -> bool:
        return name.endswith((".gguf", ".safetensors"))

    def blob_id(self, name: str) -> str:
        content = self.files[name]
        return hashlib.sha1(f"blob {len(content)}\0".encode() + content).hexdigest()


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.faults: dict[tuple[str, str], Fault] = {}
        self.seen: list[Seen] = []
        self.endless: str | None = None    # "listing" or "redirect": that reply streams for ever
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, repo: str, files: dict[str, bytes | Path], listed_extra: tuple[str, ...] = ()
            ) -> None:
        self.repos[repo] = Repo({n: Path(c).read_bytes() if isinstance(c, Path) else c
                                 for n, c in files.items()}, list(listed_extra))

    def fault(self, repo: str, name: str, **kw) -> Fault:
        self.faults[(repo, name)] = fault = Fault(**kw)
        return fault

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def gets(self, name: str) -> list[Seen]:
        """The byte transfers of `name` (GETs of its CDN address), in order."""
        return [s for s in self.seen if s.method == "GET" and s.path.startswith("/cdn/")
                and s.path.endswith("/" + name)]

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        for fault in self.faults.values():
            fault.release.set()
        self._server.shutdown()
        self._server.server_close()


_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_CDN = re.compile(r"^/cdn/(?P<repo>[^/]+/[^/]+)/(?P<sha>[0-9a-f]{64})/(?P<file>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:      # quiet
            pass

        def do_GET(self) -> None:
            self._serve(body=True)

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.record(Seen(self.command, path, self.headers.get("Range")))
            if m := _API.match(path):
                return self._api(m["repo"])
            if m := _RESOLVE.match(path):
                return self._resolve(m["repo"], m["file"], body)
            if (m := _CDN.match(path)) and body:
                return self._bytes(m["repo"], m["file"])
            self._error(404, None, "no such endpoint")

        def _api(self, repo_id: str) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found")
            if hub.endless == "listing":
                return self._endless_reply(200, {"Content-Type": "application/json"}, b'{"siblings": [')
            siblings = [{"rfilename": n, "size": len(c), "blobId": repo.blob_id(n),
                         **({"lfs": {"sha256": repo.sha256[n], "size": len(c), "pointerSize": 134}}
                            if repo.is_lfs(n) else {})}
                        for n, c in sorted(repo.files.items())]
            siblings += [{"rfilename": n, "size": 10, "blobId": "0" * 40,
                          "lfs": {"sha256": "0" * 64, "size": 10, "pointerSize": 134}}
                         for n in repo.listed_extra]
            self._send(200, {"Content-Type": "application/json"},
                       json.dumps({"id": repo_id, "modelId": repo_id, "sha": repo.commit,
                                   "private": False, "siblings": siblings}).encode())

        def _resolve(self, repo_id: str, name: str, body: bool) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found")
            if name not in repo.files:
                return self._error(404, "EntryNotFound", "Entry not found",
                                   {"X-Repo-Commit": repo.commit})
            content, sha = repo.files[name], repo.sha256[name]
            if not repo.is_lfs(name):
                headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{repo.blob_id(name)}"'}
                return self._bytes(repo_id, name, headers) if body else self._head(
                    headers, len(content))
            headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{sha}"',
                       "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(content)),
                       "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            if not body:
                return self._head(headers, len(content))
            cdn = f"/cdn/{repo_id}/{sha}/{name}?expires=9999999999&signature=x"
            if hub.endless == "redirect":
                return self._endless_reply(302, {**headers, "Location": cdn}, b"")
            self._send(302, {**headers, "Location": cdn}, b"")

        def _bytes(self, repo_id: str, name: str, extra: dict[str, str] | None = None) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None or name not in repo.files:
                return self._error(404, None, "no such object")
            content = repo.files[name]
            headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                       **(extra or {})}
            fault = hub.faults.get((repo_id, name))
            start, end = 0, len(content) - 1
            ranged = self.headers.get("Range")
            if ranged and (m := _RANGE.match(ranged)):
                start = int(m[1])
                end = min(int(m[2]), end) if m[2] else end
            is_probe = bool(ranged and ranged.rstrip().split("-")[-1])     # bytes=0-N
            if fault and fault.corrupt:
                content = content[:-1] + bytes([content[-1] ^ 0x01])
            if start > end:
                return self._error(416, None, "Range not satisfiable",
                                   {"Content-Range": f"bytes */{len(content)}"})
            piece = content[start:end + 1]
            status = 206 if ranged else 200
            headers["Content-Length"] = str(len(piece))
            if ranged:
                headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
            armed = fault is not None and not is_probe and fault.times > 0 and (
                fault.cut_after is not None or fault.stall_after is not None or fault.endless)
            if armed:
                fault.times -= 1
            if armed and fault.endless:
                del headers["Content-Length"]        # the body ends when the connection does
                self.close_connection = True
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if armed and fault.endless:
                self.wfile.write(piece)
                return self._endless()
            if armed and fault.cut_after is not None:
                self.wfile.write(piece[:fault.cut_after])
                self.wfile.flush()
                self.close_connection = True
                return
            if armed and fault.stall_after is not None:
                self.wfile.write(piece[:fault.stall_after])
                self.wfile.flush()
                fault.stalled.set()
                fault.release.wait(60)
                self.close_connection = True
                return
            self.wfile.write(piece)

        def _endless_reply(self, status: int, headers: dict[str, str], start: bytes) -> None:
            self.close_connection = True
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(start)
            self._endless()

        def _endless(self) -> None:
            """Bytes until the client hangs up (a mirror that streams for ever)."""
            block = b"\0" * (1 << 16)
            try:
                while True:
                    self.wfile.write(block)
            except OSError:            # the client closed the connection
                pass

        def _error(self, status: int, code: str | None, message: str,
                   extra: dict[str, str] | None = None) -> None:
            headers = {"Content-Type": "application/json", **(extra or {})}
            if code:
                headers["X-Error-Code"] = code
            headers["X-Error-Message"] = message
            self._send(status, headers, json.dumps({"error": message}).encode())

        def _head(self, headers: dict[str, str], length: int) -> None:
            self.send_response(200)
            for k, v in {**headers, "Content-Length": str(length)}.items():
                self.send_header(k, v)
            self.end_headers()

        def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    return Handler
