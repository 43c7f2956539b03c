"""The installed models: `<data_dir>/models/manifest.json` and the files the store owns.

Why it is shaped so:

* The manifest is the single source of truth: a model is installed exactly when the manifest names
  it. It is rewritten whole, atomically (temp file, fsync, os.replace), so a kill at any moment
  leaves the old or the new manifest; a stray temp file is never read.
* Files are either *referenced in place* (the user's own file, by absolute path; never deleted by
  localspec) or *owned* (copied or downloaded into `<store>/<name>/`). An owned file is written as
  `<file>.partial` and renamed only when complete, and registered only after that, so partial
  files never count as installed.
* Downloads (models/pull.py) are staged in `<store>/.downloads/`, verified there, and handed to
  `install_downloaded`, which moves them in with os.replace (same filesystem) and registers them
  in one manifest write; a failure moves them back, so a pair is installed whole or not at all.
* Every file is validated with read_gguf before it is registered, and a draft must share the
  target's vocabulary (size and token-list fingerprint), so a registered pair always loads.
* A split GGUF (`-00001-of-0000N.gguf`) is one ModelFile: the first part is its path (what
  llama.cpp opens), the others are its `parts`. A PyTorch draft is one ModelFile of kind "torch":
  its path is the transformers folder (what `--draft` takes), its parts the files in it. Its
  vocabulary is checked against the target GGUF's token by token (torch_draft.py).
* Names are safe slugs; every path the store builds is checked to stay inside the store.
* The manifest is read as every file of localspec's own is (models/own_files.py): a regular
  file, at most MANIFEST_MAX_BYTES; damage is explained (move it aside), and a manifest of a newer
  version is refused rather than rewritten without what this version does not know.
* `rm` deletes a file only if the store owns it, it lies inside the store, and no other installed
  model uses it (the same resolved path or the same inode: `import B <store>/A/target.gguf`).
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
from typing import Iterator, Sequence

from localspec.models.errors import LocalspecError
from localspec.models import torch_draft
from localspec.models.architectures import check_runnable, why_not_runnable
from localspec.models.gguf_file import GGUFInfo, Vocabulary, file_vocabulary, read_gguf
from localspec.models.own_files import MANIFEST_MAX_BYTES, Unreadable, read_json
from localspec.models.paths import data_dir, resolved

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
PARTIAL_SUFFIX = ".partial"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
DOWNLOADS = ".downloads"
SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class ModelFile:
    path: Path                 # the GGUF (the first part of a split one)
    size: int                  # bytes, all parts together
    owned: bool                # copied/downloaded into the store, deleted by `rm`
    quantization: str
    vocab_size: int
    parts: tuple[Path, ...] = ()    # the later parts of a split GGUF; a torch folder's files
    source: str = ""                # where it came from: "hf:REPO/FILE@COMMIT", "" if imported
    kind: str = "gguf"              # "gguf" (llama.cpp) or "torch" (a transformers folder)

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file on disk: the GGUF and its parts, or the torch folder's files."""
        return self.parts if self.kind == "torch" else (self.path, *self.parts)

    def to_json(self) -> dict:
        return {"path": str(self.path), "size": self.size, "owned": self.owned,
                "quantization": self.quantization, "vocab_size": self.vocab_size,
                "parts": [str(p) for p in self.parts], "source": self.source, "kind": self.kind}

    @classmethod
    def from_json(cls, d: dict) -> ModelFile:
        return cls(Path(d["path"]), int(d["size"]), bool(d["owned"]), str(d["quantization"]),
                   int(d["vocab_size"]), tuple(Path(p) for p in d.get("parts", ())),
                   str(d.get("source", "")), str(d.get("kind", "gguf")))


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
class StagedFile:
    """A downloaded file, verified, waiting in `<store>/.downloads/` to be moved in."""
    staged: tuple[Path, ...]        # every part, in order (a torch draft: every file)
    names: tuple[str, ...]          # their file names in the store
    source: str
    folder: str | None = None       # a torch draft's folder name inside `<store>/<name>/`


@dataclass(frozen=True)
class ModelListing:
    """One row of `localspec list`."""
    model: InstalledModel
    fit: str          # "fits in VRAM" / "fits in RAM" / "too big" / "unknown" (models/fit.py)
    need: int | None  # estimated bytes to run it: weights + KV cache
    missing: tuple[Path, ...]   # registered files no longer on disk
    context: int | None = None  # tokens of context a run gets here by default (fit.listed_context)

    @property
    def name(self) -> str:
        return self.model.name


# ---- locations ---------------------------------------------------------------------------------
def store_dir(root: Path | None = None) -> Path:
    return (root or data_dir()) / "models"


def downloads_dir(root: Path | None = None) -> Path:
    """Staging for downloads: inside the store (same filesystem, so moving in is a rename)."""
    return store_dir(root) / DOWNLOADS


def check_name(name: str) -> str:
    """`name` if it is a safe model name (a slug); LocalspecError otherwise."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise LocalspecError("Bad model name", f"'{name}' is not a plain name (letters, digits, "
                             "'.', '_', '-'; no '/', '..' or path separators; at most 64 chars)",
                             "Pick a simple name such as qwen2.5-coder-1.5b")
    return name


def owned_path(name: str, file_name: str, root: Path | None = None,
               folder: str | None = None) -> Path:
    """Where the store keeps its own copy of `file_name` for model `name` (in `folder`, for a
    torch draft), checked to stay inside."""
    check_name(name)
    for plain in [file_name] + ([folder] if folder is not None else []):
        if not _FILE_NAME.fullmatch(plain) or ".." in plain:
            raise LocalspecError("Bad model file name", f"'{plain}' would leave the model store "
                                 "or is not a plain file name", "Rename the file to a plain name "
                                 "such as model-q4_k_m.gguf")
    base = store_dir(root).resolve()
    path = (base / name / (folder or "") / file_name).resolve()
    if base not in path.parents:
        raise LocalspecError("Bad model file name", f"'{name}/{file_name}' resolves outside "
                             f"the model store {base}", "Use plain names without links or '..'")
    return path


# ---- manifest ----------------------------------------------------------------------------------
def _read_manifest(root: Path | None = None) -> dict[str, InstalledModel]:
    path = store_dir(root) / MANIFEST
    try:
        raw = read_json(path, MANIFEST_MAX_BYTES)
    except FileNotFoundError:
        return {}
    except Unreadable as err:
        raise LocalspecError("Model manifest is unreadable", str(err),
                             f"Move '{path}' aside and re-import your models "
                             "(model files themselves are untouched)") from None
    version = raw.get("version", MANIFEST_VERSION) if isinstance(raw, dict) else None
    if isinstance(version, int) and version > MANIFEST_VERSION:
        raise LocalspecError("Model manifest is from a newer localspec",
                             f"'{path}' is version {version}; this localspec knows version "
                             f"{MANIFEST_VERSION} and would drop what it does not know",
                             "Upgrade localspec to the version that wrote it (packaging/install.sh); "
                             "the manifest is left as it is")
    if version != MANIFEST_VERSION or not isinstance(raw.get("models"), dict):
        raise _malformed(path, 'it does not hold {"version": 1, "models": {NAME: ENTRY, ...}}')
    try:
        return {name: InstalledModel.from_json(name, d) for name, d in raw["models"].items()}
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
        raise _malformed(path, f"bad entry ({err!r})") from None


def _malformed(path: Path, cause: str) -> LocalspecError:
    return LocalspecError("Model manifest is malformed", f"'{path}': {cause}",
                          f"Move '{path}' aside and re-import your models")


def _write_manifest(models: dict[str, InstalledModel], root: Path | None = None) -> None:
    """Replace the manifest atomically: temp file in the same folder, fsync, os.replace."""
    folder = store_dir(root)
    body = json.dumps({"version": MANIFEST_VERSION,
                       "models": {n: m.to_json() for n, m in sorted(models.items())}}, indent=2)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", suffix=".tmp", dir=folder)
    except OSError as err:
        raise store_not_writable(folder, err) from None
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


def store_not_writable(folder: Path, err: OSError) -> LocalspecError:
    """The store cannot be changed (a read-only data dir, permissions, a full disk): the real
    cause, and nothing was changed, so nothing needs repairing."""
    return LocalspecError("Cannot change the installed models",
                          f"'{err.filename or folder}': {err.strerror or err}",
                          f"Make '{folder}' writable for your user (or free disk space), or set "
                          "LOCALSPEC_DATA_DIR to a writable folder; nothing was changed")


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
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fh = open(folder / ".lock", "a")
    except OSError as err:
        raise store_not_writable(folder, err) from None
    with fh:
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


@dataclass(frozen=True)
class _CheckedDraft:
    """A draft checked against its target: a GGUF's part headers, or a PyTorch folder's facts
    (torch_draft.check_against)."""
    infos: list[GGUFInfo] | None = None
    torch: torch_draft.TorchDraftInfo | None = None


def _check_draft(target_first: Path, target_name: str, files: Sequence[Path], names: Sequence[str],
                 folder: str | None) -> _CheckedDraft:
    """Refuse a draft that is not a valid model or whose vocabulary differs from the target's.
    `names`: the files' names as the user knows them (staged downloads have temporary paths);
    `folder`: a PyTorch draft's folder name (None: a GGUF, split or not)."""
    if folder is not None:
        return _CheckedDraft(torch=torch_draft.check_against(target_first, dict(zip(names, files)),
                                                             target_name, folder))
    infos = _read_parts(list(files))
    check_vocabularies(target_name, file_vocabulary(target_first), names[0], file_vocabulary(files[0]))
    return _CheckedDraft(infos=infos)


def _draft_record(draft: _CheckedDraft, at: Sequence[Path], owned: bool, source: str = "") -> ModelFile:
    """The manifest record of a checked draft whose files are (now) at `at`."""
    if draft.torch is not None:
        t = draft.torch
        return ModelFile(at[0].parent, t.size, owned, t.dtype, t.vocab_size, tuple(at), source, "torch")
    return _gguf_record(list(at), draft.infos, owned, source)


def check_vocabularies(target: str, t_vocab: Vocabulary, draft: str, d_vocab: Vocabulary) -> None:
    """LocalspecError naming both vocabularies unless they are the same (gguf_file.Vocabulary)."""
    fix = ("Use a draft from the target's model family (same tokenizer), or import the target "
           "without --draft")
    if t_vocab.size != d_vocab.size:
        raise LocalspecError("Draft vocabulary does not match the target",
                             f"draft '{draft}' has {d_vocab.size} tokens, target "
                             f"'{target}' has {t_vocab.size} tokens", fix)
    if t_vocab.fingerprint != d_vocab.fingerprint:
        raise LocalspecError("Draft vocabulary does not match the target",
                             f"draft '{draft}' and target '{target}' both have "
                             f"{t_vocab.size} tokens but different token lists "
                             f"(fingerprints {d_vocab.fingerprint[:12]} vs "
                             f"{t_vocab.fingerprint[:12]})", fix)


def split_names(file_name: str) -> list[str]:
    """Every part's name of a split GGUF named by its first part; [file_name] if not split."""
    found = SPLIT.match(file_name)
    if not found:
        return [file_name]
    if int(found["index"]) != 1:
        raise LocalspecError("Not the first part of a split model", f"'{file_name}' is part "
                             f"{int(found['index'])} of {int(found['count'])}",
                             f"Pass the first part, {found['stem']}-00001-of-{found['count']}.gguf")
    count = int(found["count"])
    return [f"{found['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def _parts_on_disk(first: Path) -> list[Path]:
    parts = [first.with_name(n) for n in split_names(first.name)]
    missing = [p.name for p in parts[1:] if not p.is_file()]
    if missing and first.is_file():
        raise LocalspecError("A part of the split model is missing", f"{', '.join(missing)} "
                             f"not found next to '{first}'",
                             f"Put all {len(parts)} parts in one folder, then import the first")
    return parts


def _read_parts(parts: list[Path]) -> list[GGUFInfo]:
    """Validate every part of a (possibly split) GGUF; only the first carries the tokenizer and
    the architecture, which must be one localspec can generate text with."""
    infos = [read_gguf(p, require_vocab=(i == 0)) for i, p in enumerate(parts)]
    check_runnable(infos[0])
    return infos


def _gguf_record(at: list[Path], infos: list[GGUFInfo], owned: bool, source: str = "") -> ModelFile:
    """The manifest record of a GGUF whose parts are (now) at `at`."""
    return ModelFile(at[0], sum(i.file_size for i in infos), owned, quantization_of(infos[0]),
                     infos[0].vocab_size, tuple(at[1:]), source)


def import_model(name: str, target_path: str | Path, draft_path: str | Path | None = None,
                 copy: bool = False, root: Path | None = None) -> InstalledModel:
    """Register files already on disk under `name`: in place (default) or copied into the store.
    The target is a GGUF (a split one named by its first part; the others are found next to it);
    the draft a GGUF or a transformers folder (a PyTorch draft)."""
    check_name(name)
    target = _parts_on_disk(resolved(target_path, "Cannot import the model"))
    # validation: missing/non-GGUF/truncated refused; only a first part carries the tokenizer
    t_infos = _read_parts(target)
    draft: list[Path] = []
    folder: Path | None = None
    checked: _CheckedDraft | None = None
    if draft_path is not None:
        found = resolved(draft_path, "Cannot import the draft")
        if found.is_dir():
            folder = found
            draft = [found / n for n in torch_draft.wanted_files(
                p.name for p in found.iterdir() if p.is_file())]
        else:
            draft = _parts_on_disk(found)
        checked = _check_draft(target[0], target[0].name, draft, [p.name for p in draft],
                               folder.name if folder is not None else None)
    sources = target + draft
    if copy:
        dests = [owned_path(name, p.name, root, folder.name if folder and i >= len(target) else None)
                 for i, p in enumerate(sources)]
        if len(set(dests)) != len(dests):
            raise LocalspecError("Target and draft have the same file name", f"'{sources[0].name}'",
                                 "Rename one of them before importing with --copy")
    with _locked(root):
        models = _read_manifest(root)
        _check_free(name, models)
        placed = _copy_all(sources, dests) if copy else sources
        t_at, d_at = placed[:len(target)], placed[len(target):]
        model = InstalledModel(name, _gguf_record(t_at, t_infos, copy),
                               _draft_record(checked, d_at, copy) if checked else None, time.time())
        models[name] = model
        _write_manifest(models, root)
    return model


def name_for_file(path: str | Path) -> str:
    """The model name `localspec import FILE.gguf` gives a file: its name without .gguf (and
    without a split file's part number), as a plain name (check_name)."""
    stem = SPLIT.sub(r"\g<stem>", Path(path).name)
    stem = re.sub(r"(?i)\.gguf$", "", stem)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).lstrip("._-")
    name = re.sub(r"\.{2,}", ".", name)[:64]
    if not name:
        raise LocalspecError("No name for the model", f"'{Path(path).name}' has no usable "
                             "letters or digits for a name", "Name it: localspec import NAME FILE.gguf")
    return name


def _check_free(name: str, models: dict[str, InstalledModel]) -> None:
    if name in models:
        raise LocalspecError(f"Model '{name}' is already installed",
                             f"'{name}' points at {models[name].target.path}",
                             f"Remove it first (localspec rm {name}) or pick another name")


def install_downloaded(name: str, target: StagedFile, draft: StagedFile | None,
                       root: Path | None = None) -> InstalledModel:
    """Move verified downloads into `<store>/<name>/` and register them: all or nothing."""
    check_name(name)
    t_infos = _read_parts(target.staged)
    checked = (_check_draft(target.staged[0], target.names[0], draft.staged, draft.names, draft.folder)
               if draft is not None else None)
    staged = [target] + ([draft] if draft else [])
    dests = [[owned_path(name, n, root, s.folder) for n in s.names] for s in staged]
    flat = [d for group in dests for d in group]
    if len(set(flat)) != len(flat):
        raise LocalspecError("Target and draft have the same file name", f"{[d.name for d in flat]}",
                             "Pull the draft from a repo whose file is named differently")
    with _locked(root):
        models = _read_manifest(root)
        _check_free(name, models)
        moved: list[tuple[Path, Path]] = []
        try:
            for s_file, group in zip(staged, dests):
                for src, dest in zip(s_file.staged, group):
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(src, dest)
                    moved.append((src, dest))
            for folder in {d.parent for d in flat}:
                _fsync_dir(folder)
            model = InstalledModel(name, _gguf_record(dests[0], t_infos, True, target.source),
                                   _draft_record(checked, dests[1], True, draft.source) if checked else None,
                                   time.time())
            models[name] = model
            _write_manifest(models, root)
        except BaseException:
            for src, dest in reversed(moved):      # back to staging: a later pull reuses them
                os.replace(dest, src)
            raise
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
        for folder in sorted({d.parent for d in dests}, key=lambda f: len(f.parts), reverse=True):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
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


def unfinished_downloads(root: Path | None = None) -> list[Path]:
    """Partial downloads waiting in the staging folder (a later pull of the same file resumes)."""
    folder = downloads_dir(root)
    return sorted(folder.glob(f"*{PARTIAL_SUFFIX}")) if folder.is_dir() else []


def installed(root: Path | None = None) -> dict[str, InstalledModel]:
    return _read_manifest(root)


def get_model(name: str, root: Path | None = None) -> InstalledModel | None:
    return _read_manifest(root).get(name)


def list_models(root: Path | None = None) -> list[ModelListing]:
    from localspec.models import fit

    free = fit.free_memory()
    rows = []
    for name, model in sorted(_read_manifest(root).items()):
        files = [model.target] + ([model.draft] if model.draft else [])
        missing = tuple(p for f in files for p in f.files if not p.is_file())
        need = None if missing else fit.need_bytes(files)
        context = None if missing or model.target.kind == "torch" else fit.listed_context(model.target, free)
        runs = missing or _runnable(model.target.path)   # one imported before import checked it
        rows.append(ModelListing(model, fit.verdict(need, free) if runs else "cannot run", need, missing,
                                 context))
    return rows


def _runnable(target: Path) -> bool:
    """Whether localspec can generate text with the target's architecture (models/architectures.py;
    a file that cannot be read is listed by its fit, which says "unknown")."""
    try:
        return why_not_runnable(read_gguf(target, require_vocab=False).architecture) is None
    except LocalspecError:
        return True


def remove_model(name: str, root: Path | None = None) -> InstalledModel:
    """Forget `name`; delete only the files the store owns that no other installed model uses,
    never a file referenced in place. A name the manifest holds is removable even if it is not a
    plain name (a hand-edited `../../etc`): it is forgotten, and nothing outside the store goes."""
    with _locked(root):
        models = _read_manifest(root)
        if name not in models:
            check_name(name)
            raise not_installed(name, models)
        model = models.pop(name)
        _write_manifest(models, root)   # first: a crash below leaves orphans, never dangling entries
    try:
        _delete_owned(model, store_dir(root).resolve(), _in_use(models.values()))
    except OSError as err:   # forgotten already: say what is left on disk, not a traceback
        raise LocalspecError(f"Model '{name}' is forgotten, but some of its files stay",
                             f"'{err.filename}': {err.strerror or err}",
                             f"Delete {store_dir(root) / name} yourself once it is writable") from None
    return model


def _files_of(model: InstalledModel) -> list[ModelFile]:
    return [model.target] + ([model.draft] if model.draft else [])


def _identity(path: Path) -> tuple[Path, tuple[int, int] | None]:
    """A file as `rm` compares them: its resolved path, and its inode when it exists."""
    try:
        st = path.stat()
    except OSError:
        return path.resolve(), None
    return path.resolve(), (st.st_dev, st.st_ino)


def _in_use(models) -> set:
    """The resolved paths and inodes of every file (and torch folder) the models use."""
    used: set = set()
    for model in models:
        for f in _files_of(model):
            for path in (*f.files, f.path):
                used.update(x for x in _identity(path) if x is not None)
    return used


def _delete_owned(model: InstalledModel, base: Path, in_use: set) -> None:
    """Delete the files the store owns for `model` inside `base` that are not `in_use` by another
    model (never one referenced in place), then its folder if empty."""
    def deletable(path: Path) -> bool:
        resolved, inode = _identity(path)
        return base in resolved.parents and resolved not in in_use and inode not in in_use

    for f in _files_of(model):
        for path in f.files:
            if f.owned and deletable(path):
                path.unlink(missing_ok=True)
        if (f.kind == "torch" and f.owned and deletable(f.path)
                and f.path.is_dir() and not any(f.path.iterdir())):
            f.path.rmdir()
    if not _NAME.fullmatch(model.name) or ".." in model.name:
        return                                   # a name no store folder can have
    folder = base / model.name
    if folder.is_dir() and not folder.is_symlink():
        for stale in folder.glob(f"*{PARTIAL_SUFFIX}"):
            stale.unlink()
        if not any(folder.iterdir()):
            folder.rmdir()


def not_installed(name: str, models: dict[str, InstalledModel] | None = None) -> LocalspecError:
    from localspec.models.registry import known_names

    names = sorted(models if models is not None else _read_manifest())
    have = f"installed: {', '.join(names)}" if names else "no models are installed"
    pull = (f"localspec pull {name}" if name in known_names()
            else f"localspec pull NAME (known: {', '.join(known_names())})")
    return LocalspecError(f"Model '{name}' is not installed", have,
                          f"Run: {pull}, or register a file: localspec import {name} FILE.gguf")
