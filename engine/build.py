"""Options in, a ready engine out: the one place that loads models, builds stages and measures costs.

Why it is shaped so: the session, bench, `localspec calibrate` and tools all need the same steps in
the same order, and each step depends on the one before:

1. torch, when a stage runs in PyTorch, is imported before any llama.cpp model loads (the load
   order every GPU measurement used);
2. the target loads, then what the stages are built from (`registry.Parts`): a GGUF draft model
   (checked against the target's vocabulary), a PyTorch draft, a head, the n-gram store;
3. calibration measures the target's batch costs beside the GGUF draft's (cached per machine),
   and decides with them how a GGUF draft on a GPU shapes its forwards: padded to one shape
   unless a change of shape is cheap there;
4. the stages are built by name through the registry;
5. each stage adds its own cost curve (a PyTorch draft and a head time themselves), and the
   engine starts from the estimates the last run learnt.

Before step 1, `with_head` names the draft head a run uses when the options leave it automatic
(the head installed for the target, models/heads.py): the one place that decides it, so the
library, every command and the chat's engine process find the same head.

`load` does steps 1-3 and hands back a `Loaded`, from which any number of engines are built
(`Loaded.engine`: steps 4-5; bench builds one per configuration over one target); `build` does all
five for one engine (the session). Nothing here switches on a drafter's type: stage names pick the
factories.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from .calibrate import MAX_AGE, Progress, cache_path, calibrate, default_cache_dir, learnt_path, read_json, write_json
from .costs import Costs
from .config import HEAD_CONTEXT, HEAD_MAX_STEP_SHARE, TreeBudget
from .decode import Engine
from .drafters import registry
from .drafters.base import Drafter
from .errors import LocalspecError, vocab_mismatch
from .llama_model import EXACT_MAX_ROWS, LlamaModel, gpu_offload_supported
from .options import Options
from .policy import make_policy
from .target import Target


def check_head_path(path: str | Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise LocalspecError("Draft head not found", str(path),
                             "Pass the .npz file `localspec head train` wrote, or leave out --head")
    return path


def with_head(options: Options) -> Options:
    """`options` with the head this run uses named in `head`: when none is given and heads are on
    (`use_head`), the head installed for the target (models/heads.py), if there is one; otherwise
    unchanged. `options.model` must be a path. Reads the target's header (a fraction of a second)."""
    if options.head is not None or not options.use_head or not options.speculation:
        return options
    from localspec.models.heads import head_for

    found = head_for(options.model)
    return options if found is None else replace(options, head=found, head_found=True)


def _unusable_installed_head(err: LocalspecError, path: Path) -> LocalspecError:
    """A head found for the target that does not load: the user did not name it, so the fix says
    how to run without it too."""
    return LocalspecError(err.title, f"{err.cause} (the head installed for this model)",
                          f"{err.fix}; or run without it: --no-head, or delete '{path}'")


def head_taps(path: str | Path, target: str | Path | None = None) -> tuple[int, ...]:
    """The target layers a head file reads beside the last (its shape's "taps"), which the target
    must be opened with; () for a head without, or a meta that does not say (the head's own load
    then says what is wrong with it). With `target`: refused, with the fix, where the target has
    no such layers (a file made for another model)."""
    from localspec.models.gguf_file import read_gguf
    from localspec.models.head_file import bad_head, read_meta

    try:
        taps = read_meta(check_head_path(path)).get("shape", {}).get("taps", [])
    except (LocalspecError, AttributeError):
        return ()
    if not (isinstance(taps, list) and all(isinstance(t, int) for t in taps)):
        return ()
    if target is not None and taps:
        info = read_gguf(target)
        n_layer = info.n_layer
        if n_layer is None or not all(0 <= t < n_layer for t in taps):
            raise bad_head(Path(path), f"it reads layers {taps}; '{info.path.name}' has "
                                       f"{n_layer or 'no stated number of'} layers")
    return tuple(taps)


def load_head(path: str | Path, model: LlamaModel):
    """A DraftHead for `model` (opened with hidden=True and the head's taps), on the GPU where
    there is one."""
    from localspec.models.head_file import bad_head

    from .drafters.head import DraftHead   # torch is heavy: import only when used

    head = DraftHead(check_head_path(path), model.path, n_embd=model.n_embd, vocab_size=model.vocab_size)
    if head.shape.taps != model.taps:
        raise bad_head(head.path, f"it reads the target's layers {list(head.shape.taps)}; the target "
                                  f"was opened reading {list(model.taps)}")
    return head


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


@dataclass
class Loaded:
    """A loaded target and what its stages are built from, calibrated (steps 1-3); `close` frees
    what was loaded here (a stage built from it may close its model first: closing is idempotent)."""

    options: Options
    model: LlamaModel
    parts: registry.Parts      # the target, the draft model, the PyTorch draft, the head, the store
    costs: Costs | None        # the calibration (None: not measured)
    head_left_out: str | None = None   # why the installed head was left out on this machine
    _curves: dict[tuple[str, ...], Costs] = field(default_factory=dict, repr=False)

    @property
    def numerics(self) -> dict[str, str]:
        """The numerics switches the calibration was measured with, for the engines' decodes to
        run under (entered around them: native.switched; none without a calibration)."""
        return self.costs.switches if self.costs is not None else {}

    @property
    def offloaded(self) -> bool:
        """Whether the engine keeps the target's batch shapes steady (a GPU, unless told)."""
        stable = self.options.stable_shapes
        return stable if stable is not None else self.model.n_gpu_layers != 0

    def stages(self, names: Sequence[str], parts: registry.Parts | None = None) -> list[Drafter]:
        """The stages `names`, built through the registry from `parts` (default: what was loaded;
        bench hands in each configuration's limits and its own n-gram store). A failure closes
        those built."""
        stages: list[Drafter] = []
        try:
            for name in names:
                stages.append(registry.make(name, parts or self.parts))
        except BaseException:
            for d in stages:
                d.close()
            raise
        return stages

    def stage_costs(self, stages: Sequence[Drafter]) -> Costs | None:
        """The calibration with the stages' own cost curves (a PyTorch draft and a head time their
        steps, once per load for each set of neural stages); None without a calibration."""
        if self.costs is None:
            return None
        key = tuple(d.name for d in stages if d.uses_model)
        if key not in self._curves:
            costs = self.costs
            for d in stages:
                costs = d.cost_curve(costs)
            self._curves[key] = costs
        return self._curves[key]

    def engine(self, stages: list[Drafter], budget: TreeBudget) -> Engine:
        """An engine over the loaded target with these stages; with an adaptive budget it prunes
        and chooses by the stages' costs (`stage_costs`), else it runs `budget` as it is."""
        costs = self.stage_costs(stages) if budget.adaptive else None
        return new_engine(self.parts.target, stages, budget, costs, self.offloaded)

    def close(self) -> None:
        for resource in (self.parts.gguf_draft, self.parts.torch_lm, self.parts.store):
            if resource is not None:
                resource.close()
        self.model.close()


def default_context(options: Options) -> int:
    """The context when none is asked for (n_ctx 0): what fits this machine's free memory where
    the target runs, up to its trained length (models/fit.py)."""
    from localspec.models.fit import fitted_context
    from localspec.models.gguf_file import read_gguf

    path = Path(options.model).expanduser()
    on_gpu = options.n_gpu_layers != 0 and gpu_offload_supported()
    return fitted_context(read_gguf(path), path.stat().st_size, on_gpu)


def load(options: Options, names: Sequence[str], *, measure: bool, refresh: bool = False,
         progress: Progress | None = None) -> Loaded:
    """Load the target and what the stages `names` are built from (steps 1-3). model and draft
    must be paths (the app resolves installed models' names first); LocalspecError for what the
    user can fix. measure: calibrate (refresh: measure again even if cached); progress is told
    each step of a first calibration on this machine (calibrate.Step)."""
    if "head" in names:
        check_head_path(options.head)          # before the slow target load
    if "torch-draft" in names:
        from . import torch_lm  # noqa: F401  (torch before llama.cpp: the measured load order)
    elif "head" in names:      # torch alone: transformers' import would add seconds to each start
        import torch  # noqa: F401
    nodes = options.budget.max_nodes
    spec = options.speculation     # room for trees (bench builds its stages over this target)
    n_ctx = options.n_ctx or default_context(options)
    model = LlamaModel(options.model, n_ctx=n_ctx,
                       n_seq_max=max(2, nodes + 1) if spec else 1,
                       n_gpu_layers=options.n_gpu_layers, n_threads=options.n_threads,
                       n_batch=max(512, nodes + 2), n_pad_seqs=nodes + 1 if spec else 0,
                       hidden="head" in names, exact=options.exact,
                       taps=head_taps(options.head, options.model) if "head" in names else ())
    opened: list[Any] = [model]    # closed on failure, the target last
    gguf = lm = head = store = None
    try:
        if "draft" in names:
            gguf = LlamaModel(Path(options.draft).expanduser(), n_ctx=model.n_ctx,
                              n_seq_max=nodes + 1, n_gpu_layers=options.n_gpu_layers,
                              n_threads=options.n_threads,
                              n_pad_seqs=options.draft_limits.pad_rows - 1)
            opened.append(gguf)
            check_same_vocab(model, gguf)
        if "torch-draft" in names:
            from .torch_lm import TorchLM
            lm = TorchLM.load(Path(options.draft).expanduser(), max_len=model.n_ctx)
            opened.append(lm)
            if lm.vocab_size != model.vocab_size:
                raise vocab_mismatch(Path(options.draft).name, lm.vocab_size, model.path.name,
                                     model.vocab_size)
        if "personal" in names:
            from localspec.models.ngram_store import NgramStore, vocab_key
            store = NgramStore.open(vocab_key(model), label=model.path.name)
            opened.append(store)
        left_out, curves = None, {}
        if "head" in names and measure and options.head_found and not refresh:
            left_out = _sat_out(model, Path(options.head))
            if left_out:   # measured before on this machine: not loaded, not compiled, not timed
                model.set_hidden(False)
        if "head" in names and not left_out:
            try:
                head = load_head(options.head, model)
                head.prepare(progress)    # a GPU's graphs, compiled, before the costs measure them
            except LocalspecError as err:
                from localspec.models.heads import is_installed

                if is_installed(options.head):
                    raise _unusable_installed_head(err, Path(options.head)) from None
                raise
        costs = (calibrate(model, gguf, nodes, refresh=refresh, progress=progress)
                 if measure else None)
        head_limits = options.head_limits
        if head is not None and costs is not None:
            from .drafters.head import head_costs

            curve = head_costs(costs, head)       # the head's step, measured now
            if options.head_found:
                share = curve.draft_cost(1) / curve.target_cost(1)
                _remember_share(model, head.path, share)
                left_out = _head_too_dear(head.path, share)
            if left_out:   # the run's costs are the target's without hidden states (cached apart)
                head = None
                model.set_hidden(False)
                costs = calibrate(model, gguf, nodes, refresh=refresh, progress=progress)
            else:          # stage_costs' entry for the head: its step measured once a load
                curves[("head",)] = curve
                if head_limits.floor is None:   # its trees grow only what pays here
                    head_limits = replace(head_limits, floor=curve.growth_floor(head_limits.width))
    except BaseException:
        for resource in reversed(opened):
            resource.close()
        raise
    draft_stable = (gguf is not None
                    and (options.stable_shapes if options.stable_shapes is not None
                         else gguf.n_gpu_layers != 0)
                    and not (costs is not None and costs.cheap_switch))
    parts = registry.Parts(Target(model, hidden_tail=HEAD_CONTEXT if head else 1), gguf_draft=gguf, torch_lm=lm, head=head, store=store,
                           draft_limits=options.draft_limits, head_limits=head_limits,
                           draft_stable=draft_stable,
                           draft_path=Path(options.draft) if options.draft else None)
    return Loaded(options, model, parts, costs, left_out, curves)


def _share_file(model: LlamaModel, head: Path) -> Path:
    """Where the installed head's measured step share is kept: beside the calibration of the
    target with hidden states, named for the head file (`head_tag`)."""
    from .drafters.head import head_tag   # torch: imported only with a head

    path = cache_path([model], default_cache_dir())
    return path.with_name(f"{path.stem}-head-{head_tag(head)}.share.json")


def _remember_share(model: LlamaModel, head: Path, share: float) -> None:
    write_json(_share_file(model, head), {"measured": time.time(), "share": share})


def _sat_out(model: LlamaModel, head: Path) -> str | None:
    """Why the installed head sits out, where a load on this machine within the calibration's
    MAX_AGE measured its step over HEAD_MAX_STEP_SHARE of the target's; else None (load it and
    measure). Loading it only to leave it out costs a GPU its compile, the head's tables and a
    calibration with hidden states, every start."""
    data = read_json(_share_file(model, head))
    share, when = data.get("share"), data.get("measured")
    if not isinstance(share, (int, float)) or not isinstance(when, (int, float)):
        return None
    return _head_too_dear(head, share, when) if time.time() - when < MAX_AGE else None


def _head_too_dear(path: Path, share: float, measured: float | None = None) -> str | None:
    """Why the installed head at `path` sits out on this machine, or None: its one-row step costs
    `share` of the target's, more than HEAD_MAX_STEP_SHARE (measured: when a past load measured
    it, a time.time(); None: this load)."""
    if share <= HEAD_MAX_STEP_SHARE:
        return None
    when = ("" if measured is None else f"; measured {time.strftime('%Y-%m-%d', time.localtime(measured))}, "
            "`localspec calibrate --refresh` measures again")
    return (f"its step costs {share:.0%} of the model's here (at most {HEAD_MAX_STEP_SHARE:.0%} "
            f"pays{when}); --head {path} uses it anyway")


@dataclass
class Built:
    """A loaded target with its stages and engine; `close` frees them (the session owns it)."""

    loaded: Loaded
    stages: list[Drafter]
    costs: Costs | None        # the calibration with the stages' own curves
    engine: Engine
    learnt_path: Path | None = None

    @property
    def model(self) -> LlamaModel:
        return self.loaded.model

    @property
    def store(self):
        """The personal n-gram store (NgramStore) or None."""
        return self.loaded.parts.store

    @property
    def head(self):
        """The DraftHead or None."""
        return self.loaded.parts.head

    def close(self) -> None:
        for d in self.stages:
            d.close()
        self.loaded.close()


def build(options: Options, progress: Progress | None = None) -> Built:
    """Load and build everything `options` asks for (see `load`; a head left automatic is found
    first: `with_head`); progress: told each step of a first calibration on this machine
    (calibrate.Step)."""
    options = with_head(options)
    names = options.stages
    check_exact_tree(options)
    loaded = load(options, names, measure=bool(names) and options.budget.adaptive and options.calibrate,
                  progress=progress)
    if loaded.head_left_out:
        names = tuple(n for n in names if n != "head")
    stages: list[Drafter] = []
    try:
        stages = loaded.stages(names)
        engine = loaded.engine(stages, options.budget if options.speculation else TreeBudget(0))
        costs = loaded.stage_costs(stages)
        learnt = learnt_path(costs) if costs is not None else None
        if learnt is not None:
            engine.resume(read_json(learnt))
    except BaseException:
        for d in stages:
            d.close()
        loaded.close()
        raise
    return Built(loaded, stages, costs, engine, learnt)
