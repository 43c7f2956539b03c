"""Options in, a ready engine out: the one place that loads models, builds stages and measures costs.

Why it is shaped so: the session, bench and tools all need the same steps in the same order, and
each step depends on the one before:

1. torch, when a stage runs in PyTorch, is imported before any llama.cpp model loads (the load
   order every GPU measurement used);
2. the target loads, then what the stages are built from (`registry.Parts`): a GGUF draft model
   (checked against the target's vocabulary), a PyTorch draft, a head, the n-gram store;
3. calibration measures the target's batch costs beside the GGUF draft's (cached per machine);
4. the stages are built by name through the registry, with what calibration decided: a GGUF
   draft on a GPU pads its forwards to one shape unless a change of shape is cheap there;
5. each stage adds its own cost curve (a PyTorch draft and a head time themselves), and the
   engine starts from the estimates the last run learnt.

Nothing here switches on a drafter's type: the options' stage names pick the factories.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .calibrate import Costs, Progress, calibrate, learnt_path, read_json
from .config import TreeBudget
from .decode import Engine
from .drafters import registry
from .drafters.base import Drafter
from .errors import LocalspecError, vocab_mismatch
from .llama_model import EXACT_MAX_ROWS, LlamaModel
from .options import Options
from .policy import make_policy
from .target import Target


@dataclass
class Built:
    """A loaded target with its stages and engine; `close` frees them (the session owns it)."""

    options: Options
    model: LlamaModel
    stages: list[Drafter]
    costs: Costs | None
    engine: Engine
    store: Any = None          # the personal n-gram store (NgramStore) or None
    head: Any = None           # the DraftHead or None
    learnt_path: Path | None = None

    def close(self) -> None:
        for d in self.stages:
            d.close()
        if self.store is not None:
            self.store.close()
        self.model.close()


def check_head_path(path: str | Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise LocalspecError("Draft head not found", str(path),
                             "Pass the .npz file `localspec head train` wrote, or leave out --head")
    return path


def load_head(path: str | Path, model: LlamaModel):
    """A DraftHead for `model` (opened with hidden=True), on the GPU where there is one."""
    from .drafters.head import DraftHead   # torch is heavy: import only when used

    return DraftHead(check_head_path(path), model.path, n_embd=model.n_embd, vocab_size=model.vocab_size)


def check_same_vocab(target: LlamaModel, draft: LlamaModel) -> None:
    if draft.vocab_size != target.vocab_size:
        raise vocab_mismatch(draft.path.name, draft.vocab_size, target.path.name, target.vocab_size)
    step = max(1, target.vocab_size // 997)
    for token in range(0, target.vocab_size, step):
        if target.token_text(token) != draft.token_text(token):
            raise LocalspecError("Draft vocabulary does not match the target",
                                 f"token {token} is {target.token_text(token)!r} in the target but "
                                 f"{draft.token_text(token)!r} in the draft (both {target.vocab_size} tokens)",
                                 "Use a draft from the target's model family (same tokenizer)")


def check_exact_tree(options: Options) -> None:
    nodes = options.budget.max_nodes
    if options.exact and options.speculation and nodes + 2 > EXACT_MAX_ROWS:
        raise LocalspecError("Tree too large for exact numerics",
                             f"trees of {nodes} nodes: a verify of more than {EXACT_MAX_ROWS} rows "
                             "takes llama.cpp's tiled attention",
                             f"Use trees of {EXACT_MAX_ROWS - 2} nodes or fewer with --exact "
                             f"(--tree-nodes; in bench, adaptive-N)")


def new_engine(target: Target, stages: list[Drafter], budget: TreeBudget, costs: Costs | None,
               offloaded: bool) -> Engine:
    """The decode loop over these stages and the policy that chooses their trees (one place)."""
    return Engine(target, stages, make_policy(budget, stages, costs, offloaded=offloaded))


def build(options: Options, progress: Progress | None = None) -> Built:
    """Load and build everything `options` asks for. model and draft must be paths (the app
    resolves installed models' names first); LocalspecError for what the user can fix.
    progress: told each step of a first calibration on this machine (calibrate.Step)."""
    names = options.stages
    if "head" in names:
        check_head_path(options.head)          # before the slow target load
    if "torch-draft" in names or "head" in names:
        from . import torch_lm  # noqa: F401  (torch before llama.cpp: the measured load order)
    check_exact_tree(options)
    nodes = options.budget.max_nodes
    spec = options.speculation     # room for trees (bench builds its stages over this target)
    model = LlamaModel(options.model, n_ctx=options.n_ctx,
                       n_seq_max=max(2, nodes + 1) if spec else 1,
                       n_gpu_layers=options.n_gpu_layers, n_threads=options.n_threads,
                       n_batch=max(512, nodes + 2), n_pad_seqs=nodes + 1 if spec else 0,
                       hidden="head" in names, exact=options.exact)
    target = Target(model)
    stages: list[Drafter] = []
    loose: list[Any] = []          # loaded, not yet owned by a stage: closed on failure
    store = head = None
    try:
        gguf = torch_lm = None
        if "draft" in names:
            gguf = LlamaModel(Path(options.draft).expanduser(), n_ctx=options.n_ctx,
                              n_seq_max=nodes + 1, n_gpu_layers=options.n_gpu_layers,
                              n_threads=options.n_threads,
                              n_pad_seqs=options.draft_limits.pad_rows - 1)
            loose.append(gguf)
            check_same_vocab(model, gguf)
        if "torch-draft" in names:
            from .torch_lm import TorchLM
            torch_lm = TorchLM.load(Path(options.draft).expanduser(), max_len=options.n_ctx)
            loose.append(torch_lm)
            if torch_lm.vocab_size != model.vocab_size:
                raise vocab_mismatch(Path(options.draft).name, torch_lm.vocab_size, model.path.name,
                                     model.vocab_size)
        if "personal" in names:
            from localspec.models.ngram_store import NgramStore, vocab_key
            store = NgramStore.open(vocab_key(model), label=model.path.name)
        if "head" in names:
            head = load_head(options.head, model)
        costs = None
        if names and options.budget.adaptive and options.calibrate:
            costs = calibrate(model, gguf, nodes, progress=progress)
        draft_stable = (gguf is not None
                        and (options.stable_shapes if options.stable_shapes is not None
                             else gguf.n_gpu_layers != 0)
                        and not (costs is not None and costs.cheap_switch))
        parts = registry.Parts(target, gguf_draft=gguf, torch_lm=torch_lm, head=head, store=store,
                               draft_limits=options.draft_limits, head_limits=options.head_limits,
                               draft_stable=draft_stable,
                               draft_path=Path(options.draft) if options.draft else None)
        for name in names:
            stages.append(registry.make(name, parts))
        loose.clear()              # the draft stage closes its model
        if costs is not None:
            for d in stages:
                costs = d.cost_curve(costs)
        stable = options.stable_shapes if options.stable_shapes is not None else model.n_gpu_layers != 0
        engine = new_engine(target, stages, options.budget if spec else TreeBudget(0), costs, stable)
        learnt = learnt_path(costs) if costs is not None else None
        if learnt is not None:
            engine.resume(read_json(learnt))
    except BaseException:
        for d in stages:
            d.close()
        for r in loose:            # a model its stage closed already: close is idempotent
            r.close()
        if store is not None:
            store.close()
        model.close()
        raise
    return Built(options, model, stages, costs, engine, store, head, learnt)
