"""The Hugging Face hub, for `localspec pull` only: file lists, vocabulary probes, verified downloads.

Why it is shaped so:

* Everything goes through huggingface_hub, the real client, at the endpoint it is configured with
  (HF_ENDPOINT; tests point it at a server on 127.0.0.1): `HfApi.model_info(files_metadata=True)`
  lists a repo at one commit with each LFS file's sha256 and size, `get_hf_file_metadata` (HEAD)
  gives the etag and where to download from, its HTTP session carries the retries, headers and
  the hub's error types, its tqdm the progress bar.
* Not `hf_hub_download`: in huggingface_hub 2.x it streams into a process-unique temporary file
  that is deleted when the download fails, so an interrupted multi-GB pull starts over, and it
  checks the size only. Here a file is appended to `<downloads>/<sha256>.partial`, named by the
  content it must become: a later pull resumes it with a Range request and never appends to
  another version's bytes. The whole file is then hashed and compared with the hub's sha256
  (the listing's LFS sha256, cross-checked with the HEAD's etag) before anyone else sees it; a
  mismatch deletes it. A verified file is renamed `<hash>.verified` and waits to be installed.
  Small non-LFS files (a PyTorch draft's config.json) have no sha256 on the hub; they are checked
  against their git blob id instead (sha1 of "blob <size>\\0" + content), listing and ETag alike.
* Repo file names, from the user or from the hub's listing, are checked before any request is
  made for them or any byte is written: no absolute paths, no `..`, plain segments only.
* huggingface_hub is imported inside the functions: only `pull` ever loads it, and by then
  cli.main has settled its offline switch.
* Every reply is read with a cap (models/hub_bounds.py): a download stops at the size the hub
  announced, a listing or an error page at a size no real one reaches, so that a mirror that
  streams for ever ends the pull with an error, never a process growing without bound.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from localspec.models.errors import LocalspecError
from localspec.models.gguf_file import Vocabulary, header_vocabulary

CHUNK = 1 << 20                       # bytes per read of a probe or of a file being hashed
PROBE_SIZES = (4 << 20, 32 << 20)     # header bytes fetched to read a vocabulary before download
RETRIES = 5                           # transient failures in a row before a pull gives up
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHA1 = re.compile(r"[0-9a-f]{40}")
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


@dataclass(frozen=True)
class RemoteFile:
    repo: str
    name: str          # path inside the repo
    commit: str        # the commit every file of a pull is taken from
    sha256: str | None          # LFS files (every GGUF, safetensors)
    git_sha1: str | None        # small files kept in git: their blob id
    size: int
    url: str           # /resolve/ at the pinned commit: each request gets a fresh redirect

    @property
    def source(self) -> str:
        return f"hf:{self.repo}/{self.name}@{self.commit[:12]}"

    @property
    def key(self) -> str:
        """The content's name in the staging folder."""
        return self.sha256 or f"git-{self.git_sha1}"


@dataclass(frozen=True)
class RepoListing:
    repo: str
    commit: str
    files: dict[str, tuple[int | None, str | None, str | None]]   # name -> (size, LFS sha256, blob id)

    def ggufs(self) -> list[str]:
        return sorted(n for n in self.files if n.lower().endswith(".gguf"))


def check_repo_id(repo: str) -> str:
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise LocalspecError("Bad hub repository name", f"'{repo}' is not OWNER/NAME",
                             "Write it as on huggingface.co, e.g. Qwen/Qwen2.5-Coder-7B-Instruct-GGUF")
    return repo


def check_repo_file(name: str, repo: str) -> str:
    """`name` if it is a plain relative path inside a repo; LocalspecError before any write."""
    segments = name.split("/")
    if (not name or name.startswith("/") or "\\" in name
            or any(s in ("", ".", "..") or not _SEGMENT.fullmatch(s) for s in segments)):
        raise LocalspecError("Refusing a file name that would leave the model store",
                             f"'{name}' in {repo} is absolute, contains '..' or is not a plain "
                             "file name; nothing was downloaded or written",
                             f"Name a plain file of the repo: localspec pull {repo}:FILE.gguf")
    return name


@contextmanager
def hub_errors(repo: str, name: str | None = None, transport: bool = True) -> Iterator[None]:
    """Turn the client's exceptions into LocalspecError with a cause and a fix; network failures
    too unless `transport` is False (a download retries those itself)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, RemoteEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    from huggingface_hub.utils import OfflineModeIsEnabled
    import httpx2

    from localspec.models.hub_bounds import bounded_session

    bounded_session()      # every request of a pull is made in here: its replies are bounded
    where = f"{repo}:{name}" if name else repo
    try:
        yield
    except GatedRepoError:
        raise LocalspecError("The repository is gated", f"{repo} on {constants.ENDPOINT} needs an "
                             "accepted licence and a token", "Accept the licence on the repo's "
                             "page, run `hf auth login`, then pull again") from None
    except RepositoryNotFoundError:
        raise LocalspecError("Repository not found on the hub", f"'{repo}' does not exist on "
                             f"{constants.ENDPOINT} (or is private)",
                             "Check the OWNER/NAME spelling as shown on huggingface.co, or pull "
                             "a known name: localspec pull qwen2.5-coder-1.5b") from None
    except RevisionNotFoundError:
        raise LocalspecError("Revision not found on the hub", f"{repo} has no default branch "
                             "(or it moved during the pull)", "Check the repo on huggingface.co, "
                             "then run the same pull again") from None
    except RemoteEntryNotFoundError:
        raise LocalspecError("File not found on the hub", f"'{name}' is not in {repo}",
                             f"List the repo's files on huggingface.co/{repo}, then "
                             f"localspec pull {repo}:FILE.gguf") from None
    except OfflineModeIsEnabled:
        raise LocalspecError("The hub client is in offline mode", "HF_HUB_OFFLINE (or "
                             "TRANSFORMERS_OFFLINE) is set in the environment",
                             "Unset it for `localspec pull`; other commands stay offline anyway") from None
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else "?"
        raise LocalspecError("The hub refused the request", f"HTTP {status} for {where}: "
                             f"{str(err).splitlines()[0]}", "Try again later; if it persists, "
                             "check the name and your access to the repo") from None
    except httpx2.TransportError as err:
        if not transport:
            raise
        raise LocalspecError("Cannot reach the hub", f"{constants.ENDPOINT}: {err}",
                             "Check the network connection (pull is the only command that uses "
                             "it), then run the same pull again: it resumes") from None


def list_repo(repo: str) -> RepoListing:
    """The repo's files at its current commit, with sizes and LFS sha256 (one API call)."""
    from huggingface_hub import HfApi, constants

    check_repo_id(repo)
    with hub_errors(repo):
        info = HfApi().model_info(repo, files_metadata=True, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    if not info.sha:
        raise LocalspecError("The hub answered without a commit", f"{repo}: no 'sha' in the listing",
                             "Check HF_ENDPOINT points at a Hugging Face hub")
    files = {s.rfilename: (s.size, s.lfs.sha256 if s.lfs else None, s.blob_id)
             for s in info.siblings or []}
    return RepoListing(repo, info.sha, files)


def remote_file(listing: RepoListing, name: str) -> RemoteFile:
    """Metadata of `name` at the listing's commit: sha256 and size agreed by listing and HEAD."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    check_repo_file(name, listing.repo)
    if name not in listing.files:
        have = ", ".join(listing.ggufs()) or "no .gguf files"
        raise LocalspecError("File not found on the hub", f"'{name}' is not in {listing.repo} "
                             f"(it has: {have})", f"Pick one: localspec pull {listing.repo}:FILE")
    size, lfs_sha, blob_id = listing.files[name]
    with hub_errors(listing.repo, name):
        head = get_hf_file_metadata(hf_hub_url(listing.repo, name, revision=listing.commit))
    # Downloads go to /resolve/ again rather than to head.location: the hub redirects LFS files
    # to signed CDN addresses that expire, and a resumed multi-GB download can outlive one.
    def agreed(listed: str | None, pattern: re.Pattern, what: str) -> str | None:
        """The listing's hash or the etag's (when it is one of this kind); both must agree."""
        from_etag = head.etag if head.etag and pattern.fullmatch(head.etag) else None
        if listed and from_etag and listed != from_etag:
            raise LocalspecError("The hub's metadata disagree", f"{listing.repo}:{name}: the "
                                 f"listing says {what} {listed}, the file's etag {from_etag}",
                                 "Try again later (the repo may be changing under you)")
        return listed or from_etag

    sha256 = agreed(lfs_sha, _SHA256, "sha256")
    # a small file kept in git: verify its blob id instead
    git_sha1 = agreed(blob_id, _SHA1, "blob") if sha256 is None else None
    if sha256 is None and git_sha1 is None:
        raise LocalspecError("The hub gives no hash for this file", f"{listing.repo}:{name} has "
                             "neither an LFS sha256 nor a git blob id, so it cannot be verified",
                             "Download it yourself and register it: localspec import NAME FILE.gguf")
    size = size if size is not None else head.size
    if size is None or (head.size is not None and head.size != size):
        raise LocalspecError("The hub's metadata disagree", f"{listing.repo}:{name}: sizes "
                             f"{size} (listing) and {head.size} (HEAD)", "Try again later")
    url = hf_hub_url(listing.repo, name, revision=listing.commit)
    return RemoteFile(listing.repo, name, listing.commit, sha256, git_sha1, size, url)


def probe_vocabulary(remote: RemoteFile) -> Vocabulary | None:
    """The GGUF's vocabulary from the first megabytes (Range requests); None if the header is
    bigger than the largest probe or the server will not send a prefix."""
    for size in PROBE_SIZES:
        head = _read_prefix(remote, min(size, remote.size))
        vocab = header_vocabulary(head, f"{remote.repo}:{remote.name}")
        if vocab is not None or len(head) >= remote.size:
            return vocab
    return None


def read_small(remote: RemoteFile) -> bytes:
    """A small file's bytes (a config.json), unverified: for checks before the real download."""
    return _read_prefix(remote, remote.size) if remote.size else b""


def _read_prefix(remote: RemoteFile, n: int) -> bytes:
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    from localspec.models.hub_bounds import with_cap

    headers = {**build_hf_headers(), "Range": f"bytes=0-{n - 1}", "Accept-Encoding": "identity"}
    out = bytearray()
    with hub_errors(remote.repo, remote.name):
        with get_session().stream("GET", remote.url, headers=headers, extensions=with_cap(n),
                                  timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as response:
            hf_raise_for_status(response)
            for chunk in response.iter_bytes(CHUNK):
                out += chunk
                if len(out) >= n:          # a server that ignores Range: stop reading
                    break
    return bytes(out[:n])


def download(remote: RemoteFile, downloads: Path) -> Path:
    """The file, complete and verified against the hub's hash, under `downloads`; resumes an
    earlier `<hash>.partial`. A wrong hash deletes the partial file and raises."""
    done = downloads / f"{remote.key}.verified"
    if done.is_file() and done.stat().st_size == remote.size:
        return done                                   # verified by an earlier, interrupted pull
    downloads.mkdir(parents=True, exist_ok=True)
    partial = downloads / f"{remote.key}.partial"
    if partial.is_file() and partial.stat().st_size > remote.size:
        partial.unlink()
    _fetch(remote, partial)
    kind, want = ("sha256", remote.sha256) if remote.sha256 else ("git blob id", remote.git_sha1)
    got = _digest_of(partial, remote)
    if got != want:
        partial.unlink()
        raise LocalspecError("Downloaded file is corrupt", f"{remote.repo}:{remote.name} has "
                             f"{kind} {got}, the hub says {want}; the download was "
                             "deleted and nothing was installed",
                             "Run the same localspec pull again; if it fails again, a proxy or "
                             "mirror is altering the file")
    os.replace(partial, done)
    return done


def _fetch(remote: RemoteFile, partial: Path) -> None:
    """Append the missing bytes to `partial`, resuming with Range after each transient failure."""
    from huggingface_hub.utils import tqdm

    with partial.open("ab") as fh:
        _lock_or_refuse(fh, remote)
        _check_disk_space(partial.parent, remote.size - fh.tell(), remote)
        with tqdm(total=remote.size, initial=fh.tell(), unit="B", unit_scale=True,
                  desc=_short(remote.name), name="localspec.pull") as bar:
            _fetch_locked(remote, fh, bar)


def _fetch_locked(remote: RemoteFile, fh: BinaryIO, bar) -> None:
    import httpx2

    failures = 0
    while fh.tell() < remote.size:
        before = fh.tell()
        try:
            _stream_into(remote, fh, bar)
        except (httpx2.TransportError, _ShortBody) as err:
            failures = 0 if fh.tell() > before else failures + 1
            if failures >= RETRIES:
                raise LocalspecError("Download interrupted", f"{remote.repo}:{remote.name} "
                                     f"stopped at {fh.tell():,} of {remote.size:,} bytes: {err}",
                                     "Run the same localspec pull again: it resumes") from None
            print(f"connection lost at {fh.tell():,} bytes ({err}); resuming", file=sys.stderr)
            time.sleep(min(2 ** failures, 8) / 2)


class _ShortBody(Exception):
    pass


def _lock_or_refuse(fh: BinaryIO, remote: RemoteFile) -> None:
    """One writer per partial file: a second pull of the same file would interleave bytes."""
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LocalspecError("Another localspec pull is downloading this file",
                             f"{remote.repo}:{remote.name} is being written by another process",
                             "Wait for that pull to finish, then run this one again") from None


def _check_disk_space(folder: Path, missing: int, remote: RemoteFile) -> None:
    free = shutil.disk_usage(folder).free
    if free < missing:
        raise LocalspecError("Not enough disk space", f"{remote.repo}:{remote.name} needs "
                             f"{missing:,} more bytes, {folder} has {free:,} free",
                             "Free some space (localspec rm NAME removes a pulled model), then "
                             "run the same pull again: it resumes")


def _stream_into(remote: RemoteFile, fh: BinaryIO, bar) -> None:
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    from localspec.models.hub_bounds import with_cap

    have = fh.tell()
    headers = {**build_hf_headers(), "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    with hub_errors(remote.repo, remote.name, transport=False):
        with get_session().stream("GET", remote.url, headers=headers, extensions=with_cap(remote.size - have),
                                  timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as response:
            hf_raise_for_status(response)
            if have and not _resumes_at(response, have):
                fh.seek(0)                   # the server sent the whole file: start over
                fh.truncate()
                bar.reset(total=remote.size)
            for chunk in response.iter_bytes():          # as received: a kill loses little
                if fh.tell() + len(chunk) > remote.size:
                    raise LocalspecError("The hub sent more bytes than it announced",
                                         f"{remote.repo}:{remote.name} is {remote.size:,} bytes",
                                         "Run the same localspec pull again")
                fh.write(chunk)
                fh.flush()            # to the OS at once: a killed pull keeps what arrived
                bar.update(len(chunk))
    if fh.tell() < remote.size:
        raise _ShortBody(f"the server closed after {fh.tell():,} bytes")


def _resumes_at(response, have: int) -> bool:
    found = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return response.status_code == 206 and found is not None and int(found.group(1)) == have


def _digest_of(path: Path, remote: RemoteFile) -> str:
    """sha256 of the file, or its git blob id for a file without one (sha1 of a git header + it)."""
    from huggingface_hub.utils import tqdm

    size = path.stat().st_size
    if remote.sha256:
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1(f"blob {size}\0".encode())
    with path.open("rb") as fh, tqdm(total=size, unit="B", unit_scale=True,
                                     desc=f"verify {_short(remote.name)}",
                                     name="localspec.pull") as bar:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _short(name: str) -> str:
    name = Path(name).name
    return name if len(name) <= 40 else name[:39] + "…"
