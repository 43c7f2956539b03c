"""What one run of the engine is asked to do: the one options type every entry point shares.

Why it is shaped so:

* One frozen dataclass, whose defaults are what `localspec generate` runs with no flags (the
  adaptive budget over trees of up to DEFAULT_TREE_NODES nodes, calibrated, Max-Gram and the
  personal n-grams before the draft), so the library (`Session(Options(model, draft=...))`), the
  CLI, the chat's engine process, `ask` and bench cannot drift apart.
* Serialisable (`to_json` / `from_json`): the chat's engine process receives it as JSON, and a
  key this version does not know is an error there (both ends are this version).
* Validation in one place (`check_values`, by the rules in RULES): every value a user can type is
  named by its flag with the range that works, the same words in every command and in the
  settings file; `Options` checks itself when built, so no invalid one exists.
* `model` and `draft` are what the user gave (a path, or an installed model's name, which the
  app resolves to paths before building); `stages` turns the switches into the ordered list of
  drafter names the builder walks (engine/drafters/registry.py).
* A draft head is automatic: `head=None` means the head installed for the target, if there is
  one; `head` names another, `use_head=False` none. The builder finds the installed one
  (drafters/head_stage.py's `with_head`, which reads the target file's fingerprint), so options stay plain
  data and the library's defaults run what the CLI runs without flags.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Mapping

from .config import DEFAULT_TREE_NODES, HEAD_LIMITS, DraftLimits, SamplingParams, TreeBudget
from .errors import LocalspecError

# llama.cpp holds at most 256 sequences, and a tree of N nodes takes N + 1 and as many again for
# padding (LlamaModel's n_pad_seqs): 64 stays well inside, and bench's adaptive-N stops there too.
MAX_TREE_NODES = 64
# llama.cpp keeps positions and sizes in 32-bit integers. How small a context may be depends on
# the tree size (a sequence per path and per padding row): LlamaModel checks that, with the fix.
MAX_CTX = (1 << 31) - 1


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's or `taskset`'s share of
    the machine), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


# llama.cpp starts every thread it is given, and each spins for its share of every matrix
# product: threads past the cores only wait on each other, and tens of thousands abort in the
# OpenMP runtime or crash the process. So a thread count is at most the cores this process may
# use (as seen when localspec starts: its child processes inherit the same affinity).
MAX_THREADS = usable_cores()

# the sampling llama.cpp's own tools default to (greedy by default: temperature 0)
DEFAULT_SAMPLING = SamplingParams(temperature=0.0, top_k=40, top_p=0.95, seed=0)


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _integer(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class Rule:
    flag: str                          # how the user spells it on the command line
    want: str                          # the values that work, as the fix says it
    ok: Callable[[object], bool]


def within(flag: str, low: float, high: float | None = None, integer: bool = True) -> Rule:
    """The rule of a count (integer) or a finite number from `low` (to `high`)."""
    kind = "an integer" if integer else "a number"
    want = f"{kind} >= {low}" if high is None else f"{kind} from {low} to {high}"
    return Rule(flag, want, lambda v: (_integer(v) if integer else _number(v))
                and v >= low and (high is None or v <= high))


RULES: dict[str, Rule] = {
    "temperature": Rule("--temperature", "a finite number >= 0 (0 = greedy)",
                        lambda v: _number(v) and v >= 0),
    "top_p": Rule("--top-p", "a number with 0 < top-p <= 1", lambda v: _number(v) and 0 < v <= 1),
    "top_k": Rule("--top-k", "an integer >= 0 (0 = off)", lambda v: _integer(v) and v >= 0),
    "seed": Rule("--seed", "an integer >= 0", lambda v: _integer(v) and v >= 0),
    "max_tokens": Rule("--max-tokens", "an integer >= 1", lambda v: _integer(v) and v >= 1),
    "tree_nodes": Rule("--tree-nodes", f"an integer from 1 to {MAX_TREE_NODES}",
                       lambda v: _integer(v) and 1 <= v <= MAX_TREE_NODES),
    "n_ctx": Rule("--ctx", f"an integer from 0 to {MAX_CTX} (tokens; 0, the default: the largest "
                           "that fits this machine's memory, up to the model's trained length)",
                  lambda v: _integer(v) and 0 <= v <= MAX_CTX),
    "kv_type": Rule("--kv-type", "auto, f16 or q8_0 (the KV cache's cells; auto: the type measured "
                                 "no slower where the target runs)",
                    lambda v: v in ("auto", "f16", "q8_0")),
    "kv_cache_mb": Rule("kv_cache_mb", "an integer >= 0 (MiB of conversation caches kept on disk; 0: none)",
                        lambda v: _integer(v) and v >= 0),
    "n_gpu_layers": Rule("--gpu-layers", "an integer >= -1 (-1: all layers, 0: CPU only)",
                         lambda v: _integer(v) and v >= -1),
    "n_threads": Rule("--threads", f"an integer >= 1 and <= {MAX_THREADS} (the cores this process "
                                   "may use)",
                      lambda v: v is None or (_integer(v) and 1 <= v <= MAX_THREADS)),
}


def problems(values: Mapping[str, object]) -> list[str]:
    """The values that break a rule, as "name value (want ...)"; [] when all are fine."""
    return [f"{name} {value!r} (want {RULES[name].want})"
            for name, value in values.items() if name in RULES and not RULES[name].ok(value)]


def check_values(values: Mapping[str, object], rules: Mapping[str, Rule] = RULES) -> None:
    """LocalspecError naming each bad value by its flag, and the values that work (`rules`: a
    command's own flags, which are not Options', e.g. head train's)."""
    bad = [(rules[n], v) for n, v in values.items() if n in rules and not rules[n].ok(v)]
    if bad:
        raise LocalspecError("Bad option value" if len(bad) == 1 else "Bad option values",
                             ", ".join(f"{r.flag} {v!r}" for r, v in bad),
                             "Use " + "; ".join(f"{r.flag} {r.want}" for r, _ in bad))


@dataclass(frozen=True)
class Options:
    model: str | Path                  # a .gguf path (or, before the app resolves it, a model's name);
                                       # "" only in the chat before a model is chosen
    draft: str | Path | None = None    # a .gguf (llama.cpp) or a transformers folder (PyTorch)
    head: str | Path | None = None     # a draft head trained for this target (drafters/head.py),
                                       # in the draft model's place; None: the head installed for
                                       # the target (models/heads.py), if any (head_stage.with_head)
    use_head: bool = True              # False: no head, not even the one installed for the target
    head_found: bool = False           # `head` is the installed one head_stage.with_head found (not named):
                                       # it drafts only where its step is cheap enough (head_stage)
    use_draft: bool = True             # False: no draft model, not even an installed model's own
    torch_draft: bool = False          # run a .gguf draft in PyTorch (a folder always is)
    speculation: bool = True
    maxgram: bool = True
    personal: bool = True              # the personal n-gram drafter (store under the user data dir)
    n_ctx: int = 0                     # 0: fitted to the free memory, up to the trained length (build.py)
    kv_type: str = "auto"              # the KV cache's cells: f16, q8_0, or auto (build.kv_type_for)
    n_gpu_layers: int = -1
    n_threads: int | None = None       # None: the cores this process may use, less those others keep busy (cores.py)
    budget: TreeBudget = TreeBudget(max_nodes=DEFAULT_TREE_NODES, adaptive=True)
    draft_limits: DraftLimits = DraftLimits()
    head_limits: DraftLimits = HEAD_LIMITS
    calibrate: bool = True             # adaptive budget: measure batch costs (cached) to prune trees
    stable_shapes: bool | None = None  # keep batch shapes steady for CUDA graphs; None: on a GPU
    exact: bool = False                # batch-invariant numerics (CPU): greedy speculation emits
                                       # plain decoding's tokens bit for bit (LlamaModel's exact)
    sampling: SamplingParams = DEFAULT_SAMPLING   # what generate uses unless told otherwise
    max_tokens: int = 256
    kv_cache_mb: int = 4096            # the chat's conversation caches on disk (engine/snapshots.py); 0: none

    def __post_init__(self) -> None:
        s = self.sampling
        check_values({"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
                      "seed": s.seed, "max_tokens": self.max_tokens,
                      "tree_nodes": self.budget.max_nodes, "n_ctx": self.n_ctx, "kv_type": self.kv_type,
                      "n_gpu_layers": self.n_gpu_layers, "n_threads": self.n_threads,
                      "kv_cache_mb": self.kv_cache_mb})
        if self.exact and self.stable_shapes:
            raise LocalspecError("Exact numerics with stable batch shapes",
                                 "exact numerics run unpadded, stable shapes pad every batch",
                                 "Leave out --exact, or let localspec choose the shapes")

    @property
    def stages(self) -> tuple[str, ...]:
        """The drafters to build, cheapest first, by their registry names (none without
        speculation): Max-Gram, the personal n-grams, then one neural stage: the head if there is
        one, else the draft model (in PyTorch for a folder or when asked, else in llama.cpp). The
        head installed for the target counts once head_stage.with_head has named it in `head`."""
        if not self.speculation:
            return ()
        neural: tuple[str, ...] = ()
        if self.head is not None and self.use_head:
            neural = ("head",)
        elif self.draft is not None and self.use_draft:
            in_torch = self.torch_draft or Path(self.draft).expanduser().is_dir()
            neural = ("torch-draft",) if in_torch else ("draft",)
        return (*(("maxgram",) if self.maxgram else ()),
                *(("personal",) if self.personal else ()), *neural)

    def to_json(self) -> dict:
        d = asdict(self)
        for name in ("model", "draft", "head"):
            d[name] = None if d[name] is None else str(d[name])
        return d

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> Options:
        """The inverse of to_json; a key this version does not know is an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise LocalspecError("Unknown engine options", ", ".join(unknown),
                                 "Start the engine from the same localspec version as the app")
        nested = {"budget": TreeBudget, "draft_limits": DraftLimits, "head_limits": DraftLimits,
                  "sampling": SamplingParams}
        values = {k: (nested[k](**v) if k in nested else v) for k, v in raw.items()}
        return cls(**values)


def sampling_of(temperature: float, top_p: float, top_k: int, seed: int) -> SamplingParams:
    """SamplingParams from values a user typed, checked by RULES first (SamplingParams' own
    checks are for programming errors)."""
    check_values({"temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed})
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)

