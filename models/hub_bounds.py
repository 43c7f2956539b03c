"""Every reply the hub client reads, bounded: a mirror that streams an endless body (a listing, a
redirect, an error page, a file) ends a pull with an error instead of growing it without bound.

huggingface_hub reads whole replies into memory (the repo listing's JSON, a redirect's body before
it follows it, an error page), and our own downloads stream into files. So one response hook on
the client's shared session (`bounded_session`, idempotent) wraps each reply's byte stream with a
cap, decided from the request and the status before a byte is read:

* a download or a header probe (hub.py marks its requests with `with_cap`): what the hub announced
  for the file, plus DOWNLOAD_MARGIN; hub.py stops at the exact size itself;
* any other successful reply (the listing): LISTING_MAX_BYTES;
* a redirect or an error: REPLY_MAX_BYTES.
"""
from __future__ import annotations

from typing import Iterator

import httpx2

from localspec.models.errors import LocalspecError

# past a download's announced size, more than a reader's last chunk (hub.CHUNK) can overshoot:
# hub.py's own check stops at the size; this is the backstop
DOWNLOAD_MARGIN = 4 << 20
# a repo listing with every file's metadata takes about 1 KiB a file: this holds tens of thousands
LISTING_MAX_BYTES = 64 << 20
# a redirect's or an error's body is a line of text or a small JSON object
REPLY_MAX_BYTES = 1 << 20
_EXTENSION = "localspec_body_cap"


def with_cap(announced: int) -> dict:
    """The request extensions that bound a download's reply to `announced` bytes plus the margin."""
    return {_EXTENSION: announced + DOWNLOAD_MARGIN}


def bounded_session():
    """huggingface_hub's shared session, with the bounding hook installed (once)."""
    from huggingface_hub.utils import get_session

    session = get_session()
    hooks = session.event_hooks
    if _bound_reply not in hooks["response"]:
        hooks["response"] = [*hooks["response"], _bound_reply]
        session.event_hooks = hooks
    return session


def _bound_reply(response) -> None:
    """A response hook: the reply's stream replaced by one that stops past its cap."""
    request = response.request
    if 200 <= response.status_code < 300:
        cap = request.extensions.get(_EXTENSION, LISTING_MAX_BYTES)
    else:
        cap = REPLY_MAX_BYTES
    response.stream = _Capped(response.stream, cap, f"{request.url.host}{request.url.path}")


def _too_long(where: str, cap: int) -> LocalspecError:
    return LocalspecError("The hub sent more than it announced",
                          f"{where} sent over {cap:,} bytes in one reply (reading stopped there)",
                          "Check that HF_ENDPOINT points at a Hugging Face hub or a faithful mirror, "
                          "then run the same localspec pull again: it resumes")


class _Capped(httpx2.SyncByteStream):
    """A reply's byte stream that raises once more than `cap` bytes have come."""

    def __init__(self, inner, cap: int, where: str) -> None:
        self._inner, self._cap, self._where = inner, cap, where

    def __iter__(self) -> Iterator[bytes]:
        got = 0
        for chunk in self._inner:
            got += len(chunk)
            if got > self._cap:
                raise _too_long(self._where, self._cap)
            yield chunk

    def close(self) -> None:
        self._inner.close()

    @property
    def elapsed(self):
        """The inner stream's (httpx's Response.elapsed reads it from the stream)."""
        return getattr(self._inner, "elapsed", None)
