"""Options in, a ready engine out: the one place that loads models, builds stages and measures costs.

Why it is shaped so: the session, bench, `localspec calibrate` and tools all need the same steps in
the same order, and each step depends on the one before:

1. each requested stage's kind (drafters/registry.py, drafters/stage.py) declares what it needs
   from the target (hidden states, the layers read beside the last, a prefill tail) and what it
   runs in, imported before any llama.cpp model loads;
2. the target loads with that, then each stage's parts beside it (`registry.Parts`: a GGUF draft
   model checked against the target's vocabulary, a PyTorch draft, a head, the n-gram store);
3. calibration measures the target's batch costs beside the GGUF draft's (cached per machine),
   and each stage settles with them: its own cost curve, its limits, or why it sits out on this
   machine (then the target stops doing what only it needed, measured again without it);
4. the stages are built by name through the registry;
5. each stage adds its own cost curve (a PyTorch draft and a head time themselves), and the
   engine starts from the estimates the last run learnt.

`load` does steps 1-3 and hands back a `Loaded`, from which any number of engines are built
(`Loaded.engine`: steps 4-5; bench builds one per configuration over one target); `build` does all
five for one engine (the session). Nothing here names a drafter: the stage names pick the kinds,
and the kinds' hooks say what each needs (the draft head's, and the choice of the head installed
for the target, are drafters/head_stage.py's).
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from .calibrate import Progress, Step, calibrate, default_cache_dir, learnt_path, read_json
from .costs import Costs
from .config import TreeBudget
from .decode import Engine
from .drafters import registry
from .drafters.base import Drafter
from .errors import LocalspecError
from .llama_model import EXACT_MAX_ROWS, LlamaModel, gpu_offload_supported
from .model_lock import measuring
from .options import Options
from .policy import make_policy
from .target import Target


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
    sat_out: dict[str, str] = field(default_factory=dict)   # stage name -> why it sits out here
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
        self.parts.close()
        self.model.close()


def kv_type_for(options: Options, on_gpu: bool | None = None) -> str:
    """The KV cache's cell type this run uses: the one asked for, else models/fit.py's
    auto_kv_type for where the target runs (on_gpu: already known); exact numerics keep f16
    (their promise is checked on it)."""
    from localspec.models.fit import auto_kv_type

    if options.kv_type != "auto":
        return options.kv_type
    if options.exact:
        return "f16"
    return auto_kv_type(_on_gpu(options) if on_gpu is None else on_gpu)


def _on_gpu(options: Options) -> bool:
    return options.n_gpu_layers != 0 and gpu_offload_supported()


def default_context(options: Options) -> int:
    """The context when none is asked for (n_ctx 0): what fits this machine's free memory where
    the target runs, up to its trained length (models/fit.py)."""
    from localspec.models.fit import fitted_context
    from localspec.models.gguf_file import read_gguf

    path = Path(options.model).expanduser()
    on_gpu = _on_gpu(options)
    return fitted_context(read_gguf(path), path.stat().st_size, on_gpu, kv_type=kv_type_for(options, on_gpu))


def load(options: Options, names: Sequence[str], *, measure: bool, refresh: bool = False,
         progress: Progress | None = None) -> Loaded:
    """Load the target and what the stages `names` are built from (steps 1-3). model and draft
    must be paths (the app resolves installed models' names first); LocalspecError for what the
    user can fix. measure: calibrate (refresh: measure again even if cached); progress is told
    each step of a first calibration on this machine (calibrate.Step)."""
    kinds = {name: registry.kind(name) for name in names}
    for kind in kinds.values():
        kind.check(options)                 # before the slow target load
    needs = {name: kind.needs(options) for name, kind in kinds.items()}
    need = registry.needs_of(needs.values())
    registry.first_imports(need)
    nodes = options.budget.max_nodes
    spec = options.speculation     # room for trees (bench builds its stages over this target)
    n_ctx = options.n_ctx or default_context(options)
    model = LlamaModel(options.model, n_ctx=n_ctx,
                       n_seq_max=max(2, nodes + 1) if spec else 1,
                       n_gpu_layers=options.n_gpu_layers, n_threads=options.n_threads,
                       n_batch=max(512, nodes + 2), n_pad_seqs=nodes + 1 if spec else 0,
                       hidden=need.hidden, exact=options.exact, taps=need.taps,
                       kv_type=kv_type_for(options))
    parts = registry.Parts(None)   # the target goes in last, as its stages left it
    sat_out: dict[str, str] = {}
    curves: dict[tuple[str, ...], Costs] = {}
    held = ExitStack()   # the model's measuring lock (model_lock.py), while its costs are measured
    try:
        lock = held.enter_context(measuring(model.path, default_cache_dir(), _waiting(progress))) if measure else None
        again = refresh and not (lock and lock.waited)   # a process waited for has just measured the model
        keep = lock is None or lock.quiet                # measured under another's replies: not kept
        for name, kind in kinds.items():
            got = kind.load(options, model, parts, remembered=measure and not again, progress=progress)
            parts = _take(got, name, sat_out)
        need = _without_hidden(model, need, needs, sat_out)
        costs = (calibrate(model, parts.gguf_draft, nodes, refresh=again, progress=progress,
                           keep=keep)
                 if measure else None)
        while True:
            for name, kind in kinds.items():
                if name not in sat_out:
                    got = kind.settle(options, model, parts, costs)
                    parts = _take(got, name, sat_out)
                    if got.curve is not None:   # stage_costs' entry: its step measured once a load
                        curves[(name,)] = got.curve
            kept = _without_hidden(model, need, needs, sat_out)
            if kept.hidden == need.hidden:
                break
            # the hidden states' only reader sat out: the run's costs are the target's without
            # them (cached apart), and the stages left settle again on those
            need = kept
            costs = (calibrate(model, parts.gguf_draft, nodes, refresh=again, progress=progress,
                           keep=keep)
                     if measure else None)
    except BaseException:
        parts.close()
        model.close()
        raise
    finally:
        held.close()
    parts = replace(parts, target=Target(model, hidden_tail=need.tail))
    return Loaded(options, model, parts, costs, sat_out, curves)


def _waiting(progress: Progress | None) -> Callable[[str], None] | None:
    """The measuring lock's wait, told as a step of no total (app/progress.py words it)."""
    return None if progress is None else lambda what: progress(Step(what, 0, 0))


def _take(got: registry.Settled, name: str, sat_out: dict[str, str]) -> registry.Parts:
    """A hook's parts, noting in `sat_out` why stage `name` sits out, if it does."""
    if got.sat_out:
        sat_out[name] = got.sat_out
    return got.parts


def _without_hidden(model: LlamaModel, need: registry.Needs, needs: dict[str, registry.Needs],
                    sat_out: dict[str, str]) -> registry.Needs:
    """What the stages that did not sit out need; the target stops handing back hidden states
    where none of them reads them any more."""
    kept = registry.needs_of(n for name, n in needs.items() if name not in sat_out)
    if need.hidden and not kept.hidden:
        model.set_hidden(False)
    return kept


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

    def close(self) -> None:
        for d in self.stages:
            d.close()
        self.loaded.close()


def build(options: Options, progress: Progress | None = None) -> Built:
    """Load and build everything `options` asks for (see `load`; the session names the head first:
    head_stage.with_head); progress: told each step of a first calibration on this machine
    (calibrate.Step)."""
    names = options.stages
    check_exact_tree(options)
    loaded = load(options, names, measure=bool(names) and options.budget.adaptive and options.calibrate,
                  progress=progress)
    names = tuple(n for n in names if n not in loaded.sat_out)
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
