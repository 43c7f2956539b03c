"""`localspec pull`: a known pair by name, or any hub GGUF, downloaded, verified and installed.

The order is chosen so that every refusal comes as early, and costs as little, as it can:
names (the pair's, the files') are checked before any request; the hub's metadata (commit, sha256,
sizes) before any download; the target's and draft's vocabularies from a Range request over
their headers before gigabytes move; every byte against the hub's sha256 before the file leaves
the staging folder; and the library checks the complete files once more (GGUF structure, the
vocabulary again) as it moves them in and registers them in one manifest write.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from localspec.models.errors import LocalspecError
from localspec.models import hub, library, registry, torch_draft
from localspec.models.hub import RemoteFile, RepoListing

_PREFERRED_QUANT = "q4_k_m"


@dataclass(frozen=True)
class RemoteModel:
    parts: tuple[RemoteFile, ...]     # one file, every part of a split GGUF, or a torch folder's files
    kind: str = "gguf"                # or "torch": a transformers folder (PyTorch draft)

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)

    @property
    def label(self) -> str:
        first = self.parts[0]
        if self.kind == "torch":
            return f"{first.repo} (PyTorch: {', '.join(p.name for p in self.parts)})"
        more = f" (+{len(self.parts) - 1} parts)" if len(self.parts) > 1 else ""
        return f"{first.repo}:{first.name}{more}"

    @property
    def source(self) -> str:
        """Provenance for the manifest: hf:REPO/FILE@COMMIT, or hf:REPO@COMMIT for a folder."""
        first = self.parts[0]
        return f"hf:{first.repo}@{first.commit[:12]}" if self.kind == "torch" else first.source

    def config(self) -> RemoteFile:
        return next(p for p in self.parts if p.name == "config.json")


@dataclass(frozen=True)
class PullPlan:
    name: str
    target: RemoteModel
    draft: RemoteModel | None


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'OWNER/REPO[:FILE]' -> (repo, file or None)."""
    repo, _, file = spec.partition(":")
    hub.check_repo_id(repo)
    if file:
        hub.check_repo_file(file, repo)
    return repo, file or None


def plan(spec: str, name: str | None = None, draft: str | None = None,
         with_draft: bool = True, torch_draft: bool = False) -> PullPlan:
    """What a pull would fetch: names checked, hub metadata read, nothing downloaded.
    `draft` is OWNER/REPO[:FILE]: a GGUF, or a transformers repo (a PyTorch draft);
    `torch_draft` takes a known pair's PyTorch draft instead of its GGUF one."""
    if "/" not in spec:
        pair = registry.lookup(spec)                       # unknown: lists the known names
        if name is not None:
            library.check_name(name)
        target = _hub_files(pair.target.repo, pair.target.files)
        if draft:
            d_model = _from_spec(draft, allow_torch=True)
        elif with_draft and torch_draft and pair.torch_draft:
            d_model = _torch_model(hub.list_repo(pair.torch_draft))
        elif with_draft and pair.draft:
            d_model = _hub_files(pair.draft.repo, pair.draft.files)
        else:
            d_model = None
        return PullPlan(library.check_name(name or pair.name), target, d_model)
    if torch_draft:
        raise LocalspecError("--torch-draft needs a known name", f"'{spec}' is a repo",
                             "Name the PyTorch draft repo instead: --draft OWNER/REPO")
    if name is not None:
        library.check_name(name)
    target = _from_spec(spec)
    d_model = _from_spec(draft, allow_torch=True) if draft and with_draft else None
    return PullPlan(library.check_name(name or default_name(target.parts[0].name)), target, d_model)


def default_name(file_name: str) -> str:
    """'Qwen2.5-7B-Instruct-Q4_K_M-00001-of-00002.gguf' -> 'qwen2.5-7b-instruct-q4_k_m'."""
    stem = Path(file_name).name
    split = library.SPLIT.match(stem)
    stem = split.group("stem") if split else stem.removesuffix(".gguf")
    return re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-.")[:64] or "model"


def _hub_files(repo: str, files: tuple[str, ...]) -> RemoteModel:
    for f in files:
        hub.check_repo_file(f, repo)
    listing = hub.list_repo(repo)
    return RemoteModel(tuple(hub.remote_file(listing, f) for f in files))


def _from_spec(spec: str, allow_torch: bool = False) -> RemoteModel:
    repo, file = parse_spec(spec)
    listing = hub.list_repo(repo)
    if file is None and allow_torch and not listing.ggufs() and torch_draft.is_torch_repo(listing.files):
        return _torch_model(listing)
    first = file or _pick_gguf(listing)
    return RemoteModel(tuple(hub.remote_file(listing, f) for f in _parts_of(first)))


def _torch_model(listing: RepoListing) -> RemoteModel:
    """The top-level config, tokenizer and safetensors files (no folders: nothing else is fetched)."""
    if not torch_draft.is_torch_repo(listing.files):
        raise LocalspecError("Not a transformers repository", f"{listing.repo} has no config.json "
                             "with .safetensors weights", "Name a PyTorch model repo as the draft")
    files = torch_draft.wanted_files(listing.files)
    return RemoteModel(tuple(hub.remote_file(listing, f) for f in files), "torch")


def _pick_gguf(listing: RepoListing) -> str:
    """The repo's only GGUF model (a split one counts once), or its only Q4_K_M one."""
    for name in listing.ggufs():            # a hostile listing is refused, not skipped
        hub.check_repo_file(name, listing.repo)
    models = [n for n in listing.ggufs() if "mmproj" not in n.lower() and _is_first_part(n)]
    if len(models) > 1:
        preferred = [n for n in models if _PREFERRED_QUANT in n.lower()]
        models = preferred if len(preferred) == 1 else models
    if len(models) == 1:
        return models[0]
    if not models:
        raise LocalspecError("No GGUF model in the repository", f"{listing.repo} has no .gguf "
                             "files", "Pull a GGUF repo (their names usually end in -GGUF)")
    raise LocalspecError("The repository has several GGUF models", f"{listing.repo}: "
                         f"{', '.join(models)}", f"Pick one: localspec pull {listing.repo}:FILE")


def _is_first_part(name: str) -> bool:
    split = library.SPLIT.match(Path(name).name)
    return split is None or int(split["index"]) == 1


def _parts_of(first: str) -> list[str]:
    folder = first[:len(first) - len(Path(first).name)]
    return [folder + name for name in library.split_names(Path(first).name)]


def check_vocabularies_remotely(p: PullPlan) -> str:
    """Compare the pair's vocabularies from their headers before downloading; a line to print."""
    if p.draft is None:
        return "no draft"
    if p.draft.kind == "torch":
        return _check_torch_vocabulary_remotely(p)
    t_vocab = hub.probe_vocabulary(p.target.parts[0])
    d_vocab = hub.probe_vocabulary(p.draft.parts[0])
    if t_vocab is None or d_vocab is None:
        return "vocabularies not readable from the headers; checked after download"
    library.check_vocabularies(p.target.parts[0].name, t_vocab, p.draft.parts[0].name, d_vocab)
    return f"target and draft share one vocabulary ({t_vocab.describe()})"


def _check_torch_vocabulary_remotely(p: PullPlan) -> str:
    """The target header's token count against the draft's config.json vocab_size."""
    t_vocab = hub.probe_vocabulary(p.target.parts[0])
    config = p.draft.config()
    d_size = torch_draft.config_vocab_size(hub.read_small(config), f"{config.repo}/config.json")
    if t_vocab is None:
        return "target vocabulary not readable from its header; checked after download"
    if t_vocab.size != d_size:
        raise LocalspecError("Draft vocabulary does not match the target",
                             f"draft '{config.repo}' has {d_size} tokens (config.json), target "
                             f"'{p.target.parts[0].name}' has {t_vocab.size} tokens",
                             "Use the draft of the target's model family (same tokenizer)")
    return (f"target and PyTorch draft both have {t_vocab.size} tokens "
            "(token texts compared after download)")


def already_installed(p: PullPlan, root: Path | None = None) -> library.InstalledModel | None:
    """The installed model if `p.name` is this very pull done before (same repo files, all on
    disk); None if the name is free; LocalspecError if the name holds something else."""
    existing = library.get_model(p.name, root)
    if existing is None:
        return None
    wanted = [m.source.split("@")[0] for m in (p.target, p.draft) if m]
    have = [f.source.split("@")[0] for f in (existing.target, existing.draft) if f]
    on_disk = all(path.is_file() for f in (existing.target, existing.draft) if f for path in f.files)
    if wanted == have and on_disk:
        return existing
    raise LocalspecError(f"Model '{p.name}' is already installed",
                         f"'{p.name}' points at {existing.target.path}"
                         + ("" if on_disk else ", and some of its files are missing"),
                         f"Remove it first (localspec rm {p.name}), or pull under another --name")


def pull(p: PullPlan, root: Path | None = None, log=lambda line: print(line, file=sys.stderr)
         ) -> library.InstalledModel:
    existing = already_installed(p, root)
    if existing is not None:
        return existing
    log(f"target {p.target.label}, {_gib(p.target.size)}")
    if p.draft:
        log(f"draft  {p.draft.label}, {_gib(p.draft.size)}")
    log(check_vocabularies_remotely(p))
    downloads = library.downloads_dir(root)
    staged = [_download(m, downloads) for m in [p.target] + ([p.draft] if p.draft else [])]
    try:
        return library.install_downloaded(p.name, staged[0], staged[1] if p.draft else None, root)
    except LocalspecError:
        for s in staged:          # verified but unusable (not a GGUF, another vocabulary): drop
            for path in s.staged:
                path.unlink(missing_ok=True)
        raise


def _download(model: RemoteModel, downloads: Path) -> library.StagedFile:
    paths = tuple(hub.download(part, downloads) for part in model.parts)
    if model.kind == "torch":
        return library.StagedFile(paths, tuple(part.name for part in model.parts), model.source,
                                  model.parts[0].repo.split("/")[1])
    return library.StagedFile(paths, tuple(Path(part.name).name for part in model.parts),
                              model.source)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 28 else f"{n / (1 << 20):.1f} MiB"
