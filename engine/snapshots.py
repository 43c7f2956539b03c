"""Conversation caches that outlive the process: the target's KV cache of a conversation, on disk.

After each reply the chat's engine writes the conversation's sequence (llama.cpp's per-sequence
state: every cell of sequence 0, keys and values) with the tokens it holds; reopening that
conversation later, in this process or after a restart, loads it back and prefills only what it
lacks (engine/target.py's keep_prefix), instead of reading the whole conversation again.

What a snapshot is trusted for, and why:
- it is only used by a target whose numbers it matches: the key names the model file's weights
  (its fingerprint), llama.cpp's build, where the layers run, exact mode and the KV cache's cell
  type; a snapshot under
  another key is never opened. Not the context size: a position's keys and values depend on the
  tokens before it alone, and a context fitted to free memory may differ from one start to the
  next; a snapshot longer than the context is refused by `Target.load_state`;
- llama.cpp parses the state with few checks and aborts the process on some malformed input, so
  a snapshot is handed over only after its header, sizes and sha256 over tokens and state check
  out; a damaged, truncated or foreign file is skipped with a note and deleted;
- the folder is bounded (`cap_bytes`: the settings' kv_cache_mb, 4 GiB by default, a few
  conversations of a 7B model at 16k tokens; least recently used out first), and a snapshot
  larger than the whole cap is not written (a cap of 0 keeps none).
Files are written to a temporary name and renamed, so a crash leaves the old snapshot or none.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from localspec.models.gguf_file import fingerprint

from .native import library_stamps
from .options import Options
from .prefix import common_prefix

MAGIC = b"LSKVSNAP"
FORMAT = 1
_HEAD = struct.Struct("<8sIQ")     # magic, format, header length
MAX_HEADER = 1 << 20               # a header is a few hundred bytes of JSON


def snapshot_key(model) -> str:
    """What a snapshot must match to be loaded into `model` (a LlamaModel): 24 hex digits."""
    import llama_cpp as lc

    parts = [f"format {FORMAT}", fingerprint(model.info), lc.__version__, *library_stamps(),
             f"gpu layers {model.n_gpu_layers}", "exact" if model.exact else "fast",
             f"kv {model.kv_type}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Restored:
    tokens: int          # tokens the cache now holds from the snapshot (0: none loaded)
    note: str = ""       # why a snapshot there was not used


class Snapshots:
    """The snapshots of one model's conversations under `root` (<data dir>/kv-cache), keyed by
    `snapshot_key`; `cap_bytes` bounds the whole folder, every key's together."""

    def __init__(self, root: Path, key: str, cap_bytes: int = Options.kv_cache_mb << 20,
                 note: Callable[[str], None] = lambda s: None) -> None:
        self.root, self.key, self.cap_bytes, self.note = Path(root), key, cap_bytes, note
        self.folder = self.root / key

    def path(self, conversation: str) -> Path:
        return self.folder / (hashlib.sha256(conversation.encode()).hexdigest()[:32] + ".kv")

    def save(self, conversation: str, target) -> bool:
        """Write `target`'s cache as `conversation`'s snapshot; False where it was not kept (over
        the cap, nothing cached, a disk error: the cache only saves time, so never an error)."""
        tokens = np.asarray(target.tokens, np.int32)
        if tokens.size == 0:
            return False
        state = target.model.seq_state(0)
        size = _HEAD.size + tokens.nbytes + state.nbytes + 512
        if size > self.cap_bytes:
            self.forget(conversation)
            return False
        digest = hashlib.sha256(tokens.tobytes())
        digest.update(memoryview(state))
        header = json.dumps({"key": self.key, "tokens": int(tokens.size), "state_bytes": int(state.nbytes),
                             "sha256": digest.hexdigest()}).encode()
        path = self.path(conversation)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(_HEAD.pack(MAGIC, FORMAT, len(header)))
                fh.write(header)
                fh.write(tokens.tobytes())
                fh.write(memoryview(state))
            os.replace(tmp, path)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            self.note(f"the conversation's cache was not saved: {err.strerror or err}")
            return False
        self._evict(keep=path)
        return True

    def restore(self, conversation: str, target, prompt) -> Restored:
        """Load `conversation`'s snapshot into `target` where it holds more of `prompt`'s start
        than the target's cache does now; the tokens the cache then holds of the prompt."""
        have = common_prefix(target.tokens, prompt)
        path = self.path(conversation)
        try:
            loaded = self._read(path)
        except FileNotFoundError:
            return Restored(have)
        except (OSError, ValueError) as err:
            path.unlink(missing_ok=True)
            why = f"the conversation's saved cache was ignored ({err}); it is read again instead"
            self.note(why)
            return Restored(have, why)
        tokens, state = loaded
        if common_prefix(tokens, prompt) <= have:
            return Restored(have)
        if not target.load_state(tokens, state):
            path.unlink(missing_ok=True)
            why = "llama.cpp did not take the conversation's saved cache; it is read again instead"
            self.note(why)
            return Restored(0, why)
        os.utime(path)                           # used: the last to be evicted
        return Restored(common_prefix(tokens, prompt))

    def forget(self, conversation: str) -> None:
        self.path(conversation).unlink(missing_ok=True)

    def _read(self, path: Path) -> tuple[list[int], np.ndarray]:
        """(tokens, state) of a snapshot whose every check holds; ValueError naming the one that
        failed. Opened without following a FIFO's wait, and only a regular file is read."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("not a regular file")
            if st.st_size > self.cap_bytes:
                raise ValueError("larger than the cache's cap")
            head = fh.read(_HEAD.size)
            if len(head) < _HEAD.size:
                raise ValueError("truncated")
            magic, fmt, header_len = _HEAD.unpack(head)
            if magic != MAGIC or fmt != FORMAT or header_len > MAX_HEADER:
                raise ValueError("not a snapshot of this version")
            try:
                header = json.loads(fh.read(header_len))
                n, state_bytes, want = int(header["tokens"]), int(header["state_bytes"]), str(header["sha256"])
            except (ValueError, KeyError, TypeError, RecursionError):
                raise ValueError("a damaged header") from None
            if header.get("key") != self.key:
                raise ValueError("made for another model or setting")
            if n <= 0 or state_bytes <= 0 or _HEAD.size + header_len + 4 * n + state_bytes != st.st_size:
                raise ValueError("truncated or padded")
            tokens = np.frombuffer(fh.read(4 * n), np.int32)
            state = np.frombuffer(fh.read(state_bytes), np.uint8)
        if tokens.size != n or state.size != state_bytes:
            raise ValueError("truncated")
        digest = hashlib.sha256(tokens.tobytes())
        digest.update(memoryview(state))
        if digest.hexdigest() != want:
            raise ValueError("its checksum does not match")
        return [int(t) for t in tokens], state

    def _evict(self, keep: Path) -> None:
        """Delete the least recently used snapshots, any key's, until the folder fits the cap."""
        files = []
        for folder in (p for p in self.root.iterdir() if p.is_dir()):
            for f in folder.glob("*.kv"):
                try:
                    st = f.stat()
                except OSError:
                    continue
                files.append((st.st_mtime, st.st_size, f))
        total = sum(size for _, size, _ in files)
        for _, size, f in sorted(files):
            if total <= self.cap_bytes:
                break
            if f != keep:
                f.unlink(missing_ok=True)
                total -= size
