"""Load a target and its drafters from paths, and turn user input into generation requests.

The one place that decides which drafter runs a draft path: a .gguf file runs in llama.cpp (the
right draft on CPU-only machines), a transformers folder in PyTorch. Stages run cheapest first:
Max-Gram, then the neural draft, which adopts and extends the nodes Max-Gram proposed.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .calibrate import Costs, calibrate, learnt_path, read_json, write_json
from .chat import render_chat
from .config import HEAD_LIMITS, DraftLimits, GenerationRequest, SamplingParams, TreeBudget
from .decode import Engine, Generation, drain
from .drafters.base import Drafter
from .drafters.llama_draft import LlamaDraft
from .drafters.maxgram import MaxGram
from .errors import LocalspecError, vocab_mismatch
from .llama_model import EXACT_MAX_ROWS, LlamaModel
from .policy import make_policy
from .target import Target


@dataclass(frozen=True)
class EngineConfig:
    model: Path
    draft: Path | None = None
    head: Path | None = None          # a draft head trained for this target (drafters/head.py);
                                      # it takes the draft model's place (one neural stage, one cost curve)
    speculation: bool = True
    maxgram: bool = True
    personal: bool = False            # the personal n-gram drafter (store under the user data dir)
    n_ctx: int = 4096
    n_gpu_layers: int = -1
    n_threads: int | None = None      # None: every core this process may use
    budget: TreeBudget = field(default_factory=TreeBudget)
    draft_limits: DraftLimits = field(default_factory=DraftLimits)
    head_limits: DraftLimits = field(default_factory=lambda: HEAD_LIMITS)
    calibrate: bool = True            # adaptive budget: measure batch costs (cached) to prune tree sizes
    stable_shapes: bool | None = None  # keep batch shapes steady for CUDA graphs; None: when offloaded to a GPU
    exact: bool = False               # batch-invariant numerics (CPU): greedy speculation emits plain
                                      # decoding's tokens bit for bit (LlamaModel's exact)


def _check_same_vocab(target: LlamaModel, draft: LlamaModel) -> None:
    if draft.vocab_size != target.vocab_size:
        raise vocab_mismatch(draft.path.name, draft.vocab_size, target.path.name, target.vocab_size)
    step = max(1, target.vocab_size // 997)
    for token in range(0, target.vocab_size, step):
        if target.token_text(token) != draft.token_text(token):
            raise LocalspecError("Draft vocabulary does not match the target",
                                 f"token {token} is {target.token_text(token)!r} in the target but "
                                 f"{draft.token_text(token)!r} in the draft (both {target.vocab_size} tokens)",
                                 "Use a draft from the target's model family (same tokenizer)")


def draft_runs_in_torch(path: Path | None, torch_draft: bool = False) -> bool:
    """Whether the draft at `path` runs in PyTorch (a transformers folder always does, a .gguf
    when asked); if so torch is imported now, before any llama.cpp model loads: the order every
    GPU measurement used (with the system libstdc++ preloaded, dev/gpu-env.sh)."""
    if path is None or not (torch_draft or Path(path).expanduser().is_dir()):
        return False
    from . import torch_lm  # noqa: F401
    return True


def with_torch_draft(costs: Costs, lm, path: Path | None) -> Costs:
    """`costs` with the PyTorch draft's (a TorchLM's) forward times, measured now, as the draft
    curve, and learnt estimates kept apart from the GGUF draft's and the target's own."""
    from .drafters.torch_draft import measure_forward

    tag = hashlib.sha256(str(Path(path).resolve() if path else "").encode()).hexdigest()[:8]
    file = costs.file.with_name(f"{costs.file.stem}-torch-{tag}.json") if costs.file else None
    return replace(costs, draft=measure_forward(lm), file=file)


def with_head(costs: Costs, head) -> Costs:
    """`costs` with a draft head's step times, measured now, as the draft curve (learnt
    estimates kept apart from the draft models')."""
    st = head.path.stat()
    tag = hashlib.sha256(f"{head.path.resolve()} {st.st_size} {st.st_mtime_ns}".encode()).hexdigest()[:8]
    file = costs.file.with_name(f"{costs.file.stem}-head-{tag}.json") if costs.file else None
    return replace(costs, draft=head.measure(), file=file)


def load_head(path: Path, model: LlamaModel):
    """A DraftHead for `model` (opened with hidden=True), on the GPU where there is one."""
    from .drafters.head import DraftHead   # torch is heavy: import only when used

    return DraftHead(check_head_path(path), model.path, n_embd=model.n_embd, vocab_size=model.vocab_size)


def check_head_path(path: Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise LocalspecError("Draft head not found", str(path),
                             "Pass the .npz file `localspec head train` wrote, or leave out --head")
    return path


def _load_draft(path: Path, target: LlamaModel, cfg: EngineConfig) -> Drafter:
    path = path.expanduser()
    if path.is_dir():
        from .drafters.torch_draft import (
            TorchDraft,  # torch is heavy: import only when used
        )
        draft = TorchDraft.load(path, max_len=cfg.n_ctx, limits=cfg.draft_limits)
        if draft.vocab_size != target.vocab_size:
            raise vocab_mismatch(path.name, draft.vocab_size, target.path.name, target.vocab_size)
        return draft
    draft = LlamaDraft.load(path, n_ctx=cfg.n_ctx, max_nodes=cfg.budget.max_nodes,
                            n_gpu_layers=cfg.n_gpu_layers, n_threads=cfg.n_threads,
                            limits=cfg.draft_limits, stable_shapes=cfg.stable_shapes)
    _check_same_vocab(target, draft.model)
    return draft


class Session:
    """A loaded target with its stages; reusable across generations."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        if cfg.speculation and cfg.head is not None:
            check_head_path(cfg.head)          # before the slow target load
            cfg = self.cfg = replace(cfg, draft=None)
        if cfg.speculation:
            draft_runs_in_torch(cfg.draft)
            if cfg.head is not None:
                from . import torch_lm  # noqa: F401  (torch before llama.cpp, as with a torch draft)
        n_seq = max(2, cfg.budget.max_nodes + 1) if cfg.speculation else 1
        if cfg.exact and cfg.speculation and cfg.budget.max_nodes + 2 > EXACT_MAX_ROWS:
            raise LocalspecError("Tree too large for exact numerics",
                                 f"trees of {cfg.budget.max_nodes} nodes: a verify of more than "
                                 f"{EXACT_MAX_ROWS} rows takes llama.cpp's tiled attention",
                                 f"Use trees of {EXACT_MAX_ROWS - 2} nodes or fewer with --exact "
                                 f"(--tree-nodes; in bench, adaptive-N)")
        if cfg.exact and cfg.stable_shapes:
            raise ValueError("exact numerics run unpadded (stable_shapes pads batches)")
        self.model = LlamaModel(cfg.model, n_ctx=cfg.n_ctx, n_seq_max=n_seq,
                                n_gpu_layers=cfg.n_gpu_layers, n_threads=cfg.n_threads,
                                n_batch=max(512, cfg.budget.max_nodes + 2),
                                n_pad_seqs=cfg.budget.max_nodes + 1 if cfg.speculation else 0,
                                hidden=cfg.speculation and cfg.head is not None, exact=cfg.exact)
        target = Target(self.model)
        stages: list[Drafter] = []
        self.store = None
        self.head = None
        try:
            if cfg.speculation:
                if cfg.maxgram:
                    stages.append(MaxGram())
                if cfg.personal:
                    from localspec.models.ngram_store import NgramStore, vocab_key

                    from .drafters.ngram import PersonalNgram
                    self.store = NgramStore.open(vocab_key(self.model), label=self.model.path.name)
                    stages.append(PersonalNgram(self.store))
                if cfg.head is not None:
                    from .drafters.head import HeadDrafter
                    self.head = load_head(cfg.head, self.model)
                    stages.append(HeadDrafter(self.head, target, cfg.head_limits))
                if cfg.draft is not None:
                    stages.append(_load_draft(cfg.draft, self.model, cfg))
            self.stages = stages
            self.costs = None
            self._learnt_path: Path | None = None
            if cfg.speculation and cfg.budget.adaptive and cfg.calibrate and stages:
                draft = next((d.model for d in stages if isinstance(d, LlamaDraft)), None)
                self.costs = calibrate(self.model, draft, cfg.budget.max_nodes)
                torch_draft = next((d for d in stages if d.name == "torch-draft"), None)
                if torch_draft is not None:
                    self.costs = with_torch_draft(self.costs, torch_draft.lm, cfg.draft)
                elif self.head is not None:
                    self.costs = with_head(self.costs, self.head)
                self._learnt_path = learnt_path(self.costs)
            stable = cfg.stable_shapes if cfg.stable_shapes is not None else self.model.n_gpu_layers != 0
            if self.costs is not None and self.costs.cheap_switch:
                for d in stages:   # a GGUF draft's batches need not keep one shape either
                    if isinstance(d, LlamaDraft):
                        d.pad = 0
            policy = make_policy(cfg.budget if cfg.speculation else TreeBudget(0), stages, self.costs,
                                 offloaded=stable)
            self.engine = Engine(target, stages, policy)
            if self._learnt_path is not None:
                self.engine.resume(read_json(self._learnt_path))
        except BaseException:
            for d in stages:
                d.close()
            if self.store is not None:
                self.store.close()
            self.model.close()
            raise

    def chat_prompt(self, messages: Sequence[dict],
                    should_stop: Callable[[], bool] | None = None) -> list[int]:
        """The chat template's prompt for `messages` (should_stop: see render_chat)."""
        m = self.model
        text = render_chat(m.meta("tokenizer.chat_template"), messages,
                           bos_token=m.token_text(m.special_token("bos")),
                           eos_token=m.token_text(m.special_token("eos")), model=m.path.name,
                           should_stop=should_stop)
        return m.tokenize(text, special=True)

    def raw_prompt(self, text: str) -> list[int]:
        return self.model.tokenize(text, special=False)

    def generate(self, tokens: Sequence[int], *, max_tokens: int = 256,
                 sampling: SamplingParams = SamplingParams(), stop: Sequence[str] = (),
                 observer: Callable[[list[int], list[str]], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[str]:
        """Stream text pieces (see Engine.generate for observer and should_stop); the return value
        is the Generation."""
        return self.engine.generate(GenerationRequest(tuple(tokens), max_tokens, sampling, tuple(stop)),
                                    observer, should_stop)

    def run(self, tokens: Sequence[int], *, max_tokens: int = 256,
            sampling: SamplingParams = SamplingParams(), stop: Sequence[str] = ()) -> Generation:
        """Generate to the end without streaming."""
        return drain(self.generate(tokens, max_tokens=max_tokens, sampling=sampling, stop=stop))

    def learn(self, conversation_id: str, tokens: Sequence[int]) -> None:
        """Feed a finished exchange (the whole conversation's tokens) to the personal drafter."""
        if self.store is not None:
            from localspec.models.ngram_store import learn
            learn(self.store, conversation_id, tokens)

    def close(self) -> None:
        if getattr(self, "_learnt_path", None) is not None:
            write_json(self._learnt_path, self.engine.learnt())   # the next run starts from here
        for d in self.stages:
            d.close()
        if self.store is not None:
            self.store.close()
        self.model.close()
