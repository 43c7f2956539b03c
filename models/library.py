"""The installed models: `<data_dir>/models/manifest.json` and the files the store owns.

Why it is shaped so:

* The manifest is the single source of truth: a model is installed exactly when the manifest names
  it. It is rewritten whole, atomically (temp file, fsync, os.replace), so a kill at any moment
  leaves the old or the new manifest; a stray temp file is never read.
* Files are either *referenced in place* (the user's own file, by absolute path; never deleted by
  localspec) or *owned* (copied or downloaded into `<store>/<name>/`). An owned file is written as
  `<file>.partial` and renamed only when complete, and registered only after that, so partial
  files never count as installed.
* Every file is validated with read_gguf before it is registered, and a draft must share the
  target's vocabulary (size and token-list fingerprint), so a registered pair always loads.
* Names are safe slugs; every path the store builds is checked to stay inside the store.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from localspec.engine.errors import LocalspecError
from localspec.models.gguf_file import GGUFInfo, read_gguf
from localspec.models.ngram_store import data_dir, vocab_key

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
PARTIAL_SUFFIX = ".partial"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
# Fit estimate: model bytes as a share of MemAvailable (KV cache and runtime need the rest).
FITS_SHARE, TIGHT_SHARE = 0.7, 1.0


@dataclass(frozen=True)
class ModelFile:
    path: Path
    size: int
    owned: bool                # copied/downloaded into the store, deleted by `rm`
    quantization: str
    vocab_size: int

    def to_json(self) -> dict:
        return {"path": str(self.path), "size": self.size, "owned": self.owned,
                "quantization": self.quantization, "vocab_size": self.vocab_size}

    @classmethod
    def from_json(cls, d: dict) -> ModelFile:
        return cls(Path(d["path"]), int(d["size"]), bool(d["owned"]), str(d["quantization"]),
                   int(d["vocab_size"]))


@dataclass(frozen=True)
class InstalledModel:
    name: str
    target: ModelFile
    draft: ModelFile | None
    added_at: float

    @property
    def size(self) -> int:
        return self.target.size + (self.draft.size if self.draft else 0)

    @property
    def quantization(self) -> str:
        return self.target.quantization

    @property
    def location(self) -> str:
        return "store" if self.target.owned else "in place"

    def to_json(self) -> dict:
        return {"target": self.target.to_json(),
                "draft": self.draft.to_json() if self.draft else None, "added_at": self.added_at}

    @classmethod
    def from_json(cls, name: str, d: dict) -> InstalledModel:
        return cls(name, ModelFile.from_json(d["target"]),
                   ModelFile.from_json(d["draft"]) if d.get("draft") else None,
                   float(d.get("added_at", 0.0)))


@dataclass(frozen=True)
class ModelListing:
    """One row of `localspec list`."""
    model: InstalledModel
    fit: str          # "fits" / "tight" / "too big" / "unknown"
    missing: tuple[Path, ...]   # registered files no longer on disk

    @property
    def name(self) -> str:
        return self.model.name


# ---- locations ---------------------------------------------------------------------------------
def store_dir(root: Path | None = None) -> Path:
    return (root or data_dir()) / "models"


def check_name(name: str) -> str:
    """`name` if it is a safe model name (a slug); LocalspecError otherwise."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise LocalspecError("Bad model name", f"'{name}' is not a plain name (letters, digits, "
                             "'.', '_', '-'; no '/', '..' or path separators; at most 64 chars)",
                             "Pick a simple name such as qwen2.5-coder-1.5b")
    return name


def owned_path(name: str, file_name: str, root: Path | None = None) -> Path:
    """Where the store keeps its own copy of `file_name` for model `name`, checked to stay inside."""
    check_name(name)
    if not _FILE_NAME.fullmatch(file_name) or ".." in file_name:
        raise LocalspecError("Bad model file name", f"'{file_name}' would leave the model store "
                             "or is not a plain file name", "Rename the file to a plain name "
                             "such as model-q4_k_m.gguf")
    base = store_dir(root).resolve()
    path = (base / name / file_name).resolve()
    if base not in path.parents:
        raise LocalspecError("Bad model file name", f"'{name}/{file_name}' resolves outside "
                             f"the model store {base}", "Use plain names without links or '..'")
    return path


# ---- manifest ----------------------------------------------------------------------------------
def _read_manifest(root: Path | None = None) -> dict[str, InstalledModel]:
    path = store_dir(root) / MANIFEST
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LocalspecError("Model manifest is unreadable", f"'{path}': {err}",
                             f"Move '{path}' aside and re-import your models "
                             "(model files themselves are untouched)") from None
    try:
        return {name: InstalledModel.from_json(name, d) for name, d in raw["models"].items()}
    except (KeyError, TypeError, ValueError) as err:
        raise LocalspecError("Model manifest is malformed", f"'{path}': bad entry ({err!r})",
                             f"Move '{path}' aside and re-import your models") from None


def _write_manifest(models: dict[str, InstalledModel], root: Path | None = None) -> None:
    """Replace the manifest atomically: temp file in the same folder, fsync, os.replace."""
    folder = store_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"version": MANIFEST_VERSION,
                       "models": {n: m.to_json() for n, m in sorted(models.items())}}, indent=2)
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, folder / MANIFEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _locked(root: Path | None = None) -> Iterator[None]:
    """Serialise manifest read-modify-write between localspec processes."""
    folder = store_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# ---- import / list / rm ------------------------------------------------------------------------
def quantization_of(info: GGUFInfo) -> str:
    """The GGUF's general.file_type as a name (Q4_K_M, F16, ...); else a guess from the file name."""
    from gguf.constants import LlamaFileType

    file_type = info.metadata.get("general.file_type")
    if isinstance(file_type, int):
        try:
            return LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass   # a type newer than the gguf package: fall back to the file name
    found = re.search(r"(?i)(i?q\d(?:_[a-z0-9]+)*|bf16|f16|f32)", info.path.stem)
    return found.group(1).upper() if found else "unknown"


def check_draft_vocabulary(target: Path, draft: Path) -> None:
    """Refuse a draft whose vocabulary differs from the target's (size, then token fingerprint)."""
    t_info, d_info = read_gguf(target), read_gguf(draft)
    fix = ("Use a draft from the target's model family (same tokenizer), or import the target "
           "without --draft")
    if t_info.vocab_size != d_info.vocab_size:
        raise LocalspecError("Draft vocabulary does not match the target",
                             f"draft '{draft.name}' has {d_info.vocab_size} tokens, target "
                             f"'{target.name}' has {t_info.vocab_size} tokens", fix)
    t_key, d_key = vocab_key(target), vocab_key(draft)
    if t_key != d_key:
        raise LocalspecError("Draft vocabulary does not match the target",
                             f"draft '{draft.name}' and target '{target.name}' both have "
                             f"{t_info.vocab_size} tokens but different token lists "
                             f"(fingerprints {d_key[:12]} vs {t_key[:12]})", fix)


def import_model(name: str, target_path: str | Path, draft_path: str | Path | None = None,
                 copy: bool = False, root: Path | None = None) -> InstalledModel:
    """Register GGUF files already on disk under `name`: in place (default) or copied into the store."""
    check_name(name)
    sources = [Path(target_path).expanduser().resolve()]
    if draft_path is not None:
        sources.append(Path(draft_path).expanduser().resolve())
    infos = [read_gguf(p) for p in sources]       # validation: missing/non-GGUF/truncated refused
    if len(sources) == 2:
        check_draft_vocabulary(sources[0], sources[1])
    if copy:
        dests = [owned_path(name, p.name, root) for p in sources]
        if len(dests) == 2 and dests[0] == dests[1]:
            raise LocalspecError("Target and draft have the same file name", f"'{sources[0].name}'",
                                 "Rename one of them before importing with --copy")
    with _locked(root):
        models = _read_manifest(root)
        if name in models:
            raise LocalspecError(f"Model '{name}' is already installed",
                                 f"'{name}' points at {models[name].target.path}",
                                 f"Remove it first (localspec rm {name}) or pick another name")
        files = _copy_all(sources, dests) if copy else sources
        records = [ModelFile(path, info.file_size, copy, quantization_of(info), info.vocab_size)
                   for path, info in zip(files, infos)]
        model = InstalledModel(name, records[0], records[1] if len(records) == 2 else None,
                               time.time())
        models[name] = model
        _write_manifest(models, root)
    return model


def _copy_all(sources: list[Path], dests: list[Path]) -> list[Path]:
    """Copy every file in, or none: a failure removes the copies already made."""
    done: list[Path] = []
    try:
        for src, dest in zip(sources, dests):
            done.append(_copy_in(src, dest))
    except BaseException:
        for path in done:
            path.unlink(missing_ok=True)
        if dests[0].parent.is_dir() and not any(dests[0].parent.iterdir()):
            dests[0].parent.rmdir()
        raise
    return done


def _copy_in(src: Path, dest: Path) -> Path:
    """Copy `src` to `dest` through `dest.partial`, renamed only once complete and synced."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + PARTIAL_SUFFIX)
    try:
        with src.open("rb") as fin, partial.open("wb") as fout:
            shutil.copyfileobj(fin, fout, 16 << 20)
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(partial, dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    _fsync_dir(dest.parent)
    return dest


def installed(root: Path | None = None) -> dict[str, InstalledModel]:
    return _read_manifest(root)


def get_model(name: str, root: Path | None = None) -> InstalledModel | None:
    return _read_manifest(root).get(name)


def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where there is no /proc (not Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def fit_estimate(size: int, available: int | None) -> str:
    if not available:
        return "unknown"
    if size <= FITS_SHARE * available:
        return "fits"
    return "tight" if size <= TIGHT_SHARE * available else "too big"


def list_models(root: Path | None = None) -> list[ModelListing]:
    available = mem_available()
    rows = []
    for name, model in sorted(_read_manifest(root).items()):
        files = [model.target] + ([model.draft] if model.draft else [])
        missing = tuple(f.path for f in files if not f.path.is_file())
        rows.append(ModelListing(model, fit_estimate(model.size, available), missing))
    return rows


def remove_model(name: str, root: Path | None = None) -> InstalledModel:
    """Forget `name`; delete only the files the store owns, never a file referenced in place."""
    check_name(name)
    with _locked(root):
        models = _read_manifest(root)
        if name not in models:
            raise not_installed(name, models)
        model = models.pop(name)
        _write_manifest(models, root)   # first: a crash below leaves orphans, never dangling entries
    base = store_dir(root).resolve()
    for f in [model.target] + ([model.draft] if model.draft else []):
        if f.owned and base in f.path.resolve().parents:
            f.path.unlink(missing_ok=True)
    folder = base / name
    if folder.is_dir():
        for stale in folder.glob(f"*{PARTIAL_SUFFIX}"):
            stale.unlink()
        if not any(folder.iterdir()):
            folder.rmdir()
    return model


def not_installed(name: str, models: dict[str, InstalledModel] | None = None) -> LocalspecError:
    from localspec.models.registry import known_names

    names = sorted(models if models is not None else _read_manifest())
    have = f"installed: {', '.join(names)}" if names else "no models are installed"
    pull = (f"localspec pull {name}" if name in known_names()
            else f"localspec pull NAME (known: {', '.join(known_names())})")
    return LocalspecError(f"Model '{name}' is not installed", have,
                          f"Run: {pull}, or register a file: localspec import {name} FILE.gguf")
