"""What a batch of n tokens costs on this machine, measured once per model and machine, and what
that rules out before a single round is played.

At load, each llama.cpp model (the target, a GGUF draft) decodes batches of 1..N tokens after a
short context, the models taking turns; the fastest of a few repetitions counts (the others caught
a noisy neighbour). The curves are cached as JSON under the user data dir for 30 days, keyed by the
model files (path, size, mtime), the offload, the thread count they were measured at (held for
the calibration: 0053), whether the target hands back hidden states (for a draft head), the CPU
and llama.cpp's build: a new machine or model measures again (`localspec calibrate --refresh`
does it by hand).

The curves become `Costs` (costs.py), which the engine prices its trees by. Why these constants:
docs/decisions/0002, 0003, 0004, 0005.

A first measurement takes many seconds on a CPU, so `calibrate` announces each batch it is about
to time (`Step`: what, step i of n) to an optional `progress` callback; the total is known before
the first step because what the cache lacks is decided first. A cached calibration announces
nothing.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .native import (CUDA_MMQ_WIDTHS, CUDA_MULTICOL_WIDTHS, CUDA_STREAM_WIDTHS,  # first: see native.py
                     MULTICOL_MAX, MULTICOL_MIN, TILED_MIN, has_cuda_stream_kernel, has_cuda_width_switches,
                     has_multicol_kernels, has_tiled_min_switch, library_stamps, switches)

import llama_cpp as lc
import numpy as np

from localspec.models import own_files

from .costs import Costs
from .llama_model import LlamaModel, exact_in_process

# 8 and 9 both: llama.cpp's CUDA mat-vec takes up to 8 columns and a 9th moves every matmul to
# its tiled kernel, a step that interpolating from 8 to 12 would hide (docs/decisions/0002)
SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32)
DRAFT_SIZES = (1, 2, 4, 8)
MAX_AGE = 30 * 24 * 3600   # seconds a cached measurement is trusted: drivers and builds change (0001)
_CONTEXT = 64         # tokens before the measured batch
_REPS = 5
# how a measurement is taken: a change re-measures cached curves. Decodes are timed without
# waiting for their logits: waiting (llama_decode returns before a GPU is done) overpriced
# speculative rounds and pruning kept too little (docs/decisions/0003).
_METHOD = "v1"
_BURST = 4            # decodes in a row per size on a GPU: llama.cpp replays a CUDA graph from the third
_SWITCH_PAIRS = 8     # round trips timed to price a change of batch shape
TILED_FROM = 8        # ggml's own floor for its tiled K-quant matmul (packaging/patches moves it, 0005)
# one-row decodes go on packaging/patches' multi-column kernels only when they take less than this
# fraction of a one-row decode on ggml's kernels: a smaller gain is within what two identical
# settings differ by at one row, and a machine where the kernels gain nothing there keeps ggml's
# (docs/decisions/0022)
MULTICOL_GAIN = 0.95
# the most batch rows packaging/patches' multi-column kernels take on a CPU (the patch ships 16):
# more than any tree, so that the measured tiled floor alone decides where ggml's tiled matmul
# takes over: with the shipped 16, rows 17 up to the floor would go one column at a time through
# ggml's vec_dot, slower than the kernels, and the floor would be measured against that (0037)
MULTICOL_WIDEST = 64
# On a GPU with packaging/patches each batch width up to CUDA_WIDEST is served by the path that was
# cheapest for it with the loaded model: ggml's own dispatch (its mat-vec up to 8 rows, mul_mat_q
# from 9), the multi-column tensor-core kernels, mul_mat_q where ggml would take its mat-vec, or
# the streaming kernels for the Q4_K, Q5_K, Q6_K and Q8_0 matrices with ggml's own dispatch for the rest
# (where the build has them). No one crossover holds across models' shapes, so each width is measured
# (docs/decisions/0044, 0049). Each path is one setting of the switches with every width it can
# take on it; a width is timed on each.
CUDA_WIDEST = 16                      # the widest batch the kernels (and the switches' masks) take
_ALL_WIDTHS = (1 << CUDA_WIDEST) - 1
_MMQ_WIDTHS = range(2, 9)             # where ggml would take its mat-vec: mul_mat_q is another path
CUDA_PATHS = {"ggml": {CUDA_MULTICOL_WIDTHS: "0", CUDA_MMQ_WIDTHS: "0", CUDA_STREAM_WIDTHS: "0"},
              "multicol": {CUDA_MULTICOL_WIDTHS: str(_ALL_WIDTHS), CUDA_MMQ_WIDTHS: "0", CUDA_STREAM_WIDTHS: "0"},
              "mmq": {CUDA_MULTICOL_WIDTHS: "0", CUDA_MMQ_WIDTHS: str(_ALL_WIDTHS), CUDA_STREAM_WIDTHS: "0"},
              "stream": {CUDA_MULTICOL_WIDTHS: "0", CUDA_MMQ_WIDTHS: "0", CUDA_STREAM_WIDTHS: str(_ALL_WIDTHS)}}
_NAMES = ("target", "draft")
_KERNELS = {1: "multi-column kernels", 2: "ggml's kernels"}   # by GGML_CPU_MULTICOL_MIN


@dataclass(frozen=True)
class Step:
    """One measurement of a calibration, announced as it starts: `what` is timed ("target 4
    rows", "draft 2 rows", "tiled matmul floor at 9 rows", "target 1 row on multi-column
    kernels", "batch-shape change"), step `step` (1-based) of the `total` this calibration takes."""

    what: str
    step: int
    total: int


Progress = Callable[[Step], None]
Announce = Callable[[int, int], None]   # (which model, rows): a measured batch is about to run


class _Steps:
    """Numbers the steps of one calibration and hands each to `progress` (None: counts only)."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, what: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(Step(what, self.done, self.total))


def _start(model: LlamaModel) -> None:
    """An empty cache, then the _CONTEXT tokens every measured batch follows."""
    model.clear()
    model.prefill((np.arange(100, 100 + _CONTEXT, dtype=np.int32) % model.vocab_size).tolist(), 0)


def _batch(model: LlamaModel, n: int) -> np.ndarray:
    """The n tokens a measured batch decodes."""
    return (np.arange(n, dtype=np.int32) * 7 + 1000) % model.vocab_size


def measurable(model: LlamaModel, wanted: Sequence[int]) -> list[int]:
    """The batch sizes of `wanted` this model's context and batch can hold after the context."""
    return [n for n in wanted if n <= model.n_batch and n + _CONTEXT <= model.n_ctx]


def measure(models: Sequence[LlamaModel], sizes: Sequence[Sequence[int]],
            reps: int = _REPS, announce: Announce | None = None) -> list[dict[int, float]]:
    """Seconds per decode of n tokens after a short context, for each model and its sizes.

    The models take turns batch by batch, repetition by repetition, so a noisy neighbour slows
    them alike and their ratios (what the budget compares) hold; the fastest repetition counts.
    On a GPU each size is decoded _BURST times in a row and only the last two count: the steady
    cost with llama.cpp's CUDA graph replayed (`measure_switch` prices leaving it).
    announce(i, n) runs before each measured batch: reps * sum(len(measurable(...))) calls.
    Leaves every model's cache empty."""
    plans = []
    for model, wanted in zip(models, sizes):
        ok = measurable(model, wanted)
        _start(model)
        plans.append((model, ok, {n: math.inf for n in ok}))
    positions = np.arange(_CONTEXT, _CONTEXT + max(max(p[1], default=1) for p in plans), dtype=np.int32)
    try:
        for _ in range(reps):
            for i, (model, ok, best) in enumerate(plans):
                burst = _BURST if model.n_gpu_layers != 0 else 1
                for n in ok:
                    if announce is not None:
                        announce(i, n)
                    tokens = _batch(model, n)
                    for b in range(burst):
                        t = time.perf_counter()
                        model.decode(tokens, positions[:n], logits=True)
                        if b >= burst - 2:
                            best[n] = min(best[n], time.perf_counter() - t)
                        model.seq_rm(0, _CONTEXT, -1)
    finally:
        for model, _, _ in plans:
            model.clear()
    return [best for _, _, best in plans]


def tiled_floor(target: LlamaModel, tiled: dict[int, float],
                step: Callable[[str], None] | None = None) -> tuple[int, dict[int, float]]:
    """The fewest batch rows from which ggml's tiled matmul is at least as fast as its row-by-row
    path at every measured size, and the curve that floor gives. `tiled` was measured as ggml
    ships (tiled from TILED_FROM rows). Where the tiled path loses at verify sizes and wins for
    prompts, verifies go row by row and prompts tiled (docs/decisions/0005). step(what) runs
    before each measured batch (_REPS * len(_tiled_sizes(tiled)) calls). Leaves the target's
    cache empty."""
    big = _tiled_sizes(tiled)
    if not big:
        return TILED_FROM, tiled
    announce = None if step is None else (lambda _, n: step(f"tiled matmul floor at {_rows(n)}"))
    with switches({TILED_MIN: str(1 << 30)}):
        rows = measure([target], [big], announce=announce)[0]
    floor = next((s for s in big if all(tiled[n] <= rows[n] for n in big if n >= s)), big[-1] + 1)
    return floor, {n: (tiled[n] if n >= floor else rows.get(n, tiled[n])) for n in tiled}


def one_row_kernels(models: Sequence[LlamaModel],
                    step: Callable[[str], None] | None = None) -> tuple[int, dict[int, list[float]]]:
    """Whether one-row decodes go on packaging/patches' multi-column kernels, as the fewest batch
    rows that take them (GGML_CPU_MULTICOL_MIN): 1 when the target's one-row decode on them (MIN 1)
    takes less than MULTICOL_GAIN of its time on ggml's kernels (MIN 2, as the patch ships), else
    2; with each model's seconds per one-row decode on either side (keys: MIN; inf where a model
    cannot measure one row). The sides take turns, their order reversed every repetition so that
    drift slows them alike, and each side's fastest repetition counts, as in `measure`. The target
    decides; a draft decodes under its choice too (the switch is process-wide), so its one row is
    timed both ways beside it. step(what) runs before each measured decode (2 * _REPS calls a
    model that can measure one row). Leaves every model's cache empty."""
    seconds = {side: [math.inf] * len(models) for side in _KERNELS}
    for rep in range(_REPS):
        for side in (2, 1) if rep % 2 == 0 else (1, 2):
            announce = None if step is None else (
                lambda i, _, side=side: step(f"{_NAMES[i]} 1 row on {_KERNELS[side]}"))
            with switches({MULTICOL_MIN: str(side)}):
                got = measure(models, [(1,)] * len(models), reps=1, announce=announce)
            seconds[side] = [min(s, curve.get(1, math.inf)) for s, curve in zip(seconds[side], got)]
    return (1 if seconds[1][0] < MULTICOL_GAIN * seconds[2][0] else 2), seconds


@dataclass(frozen=True)
class CudaWidths:
    """Which path serves each batch width on a GPU (`cuda_widths`): the masks of widths on the
    multi-column kernels, on mul_mat_q in place of ggml's mat-vec and on the streaming kernel
    (bit n-1: n rows), the seconds of each width on the path chosen, and on every path timed
    (path -> width -> seconds)."""

    multicol: int
    mmq: int
    stream: int
    best: dict[int, float]
    paths: dict[str, dict[int, float]]

    @property
    def masks(self) -> dict[str, int]:
        return {"multicol": self.multicol, "mmq": self.mmq, "stream": self.stream}


def cuda_widths(target: LlamaModel, top: int, step: Callable[[str], None] | None = None) -> CudaWidths:
    """Each batch width 1..min(top, CUDA_WIDEST) timed on each path of CUDA_PATHS that can take
    it (mul_mat_q as a path of its own at 2..8 rows only: from 9 it is ggml's own choice), and
    the cheapest kept; a tie keeps ggml's. The paths take turns repetition by repetition, their
    order reversed every other one, so that drift slows them alike; each path's fastest
    repetition counts, as in `measure`. step(what) runs before each measured batch
    (_REPS * `cuda_width_steps` calls). Leaves the target's cache empty."""
    plan = _cuda_plan(target, top)
    times: dict[str, dict[int, float]] = {name: {n: math.inf for n in widths} for name, widths in plan.items()}
    for rep in range(_REPS):
        for name in plan if rep % 2 == 0 else reversed(plan):
            announce = None if step is None else (lambda _, n, name=name: step(f"target {_rows(n)} on {name}"))
            with switches(CUDA_PATHS[name]):
                got = measure([target], [plan[name]], reps=1, announce=announce)[0]
            times[name] = {n: min(times[name][n], got[n]) for n in plan[name]}
    masks = dict.fromkeys(("multicol", "mmq", "stream"), 0)
    best = {}
    for n in plan["ggml"]:
        name = min((p for p in plan if n in plan[p]), key=lambda p: (times[p][n], p != "ggml"))
        best[n] = times[name][n]
        if name in masks:
            masks[name] |= 1 << (n - 1)
    return CudaWidths(**masks, best=best, paths=times)


def _cuda_plan(target: LlamaModel, top: int) -> dict[str, list[int]]:
    """The widths each path is timed at (CUDA_PATHS' order)."""
    widths = measurable(target, range(1, min(top, CUDA_WIDEST) + 1))
    plan = {"ggml": widths, "multicol": widths, "mmq": [n for n in widths if n in _MMQ_WIDTHS]}
    return plan | ({"stream": widths} if has_cuda_stream_kernel() else {})


def cuda_width_steps(target: LlamaModel, top: int) -> int:
    """The measured batches `cuda_widths` announces."""
    return _REPS * sum(len(w) for w in _cuda_plan(target, top).values())


def _tiled_sizes(curve: dict[int, float]) -> list[int]:
    """The sizes of a curve that ggml as shipped runs tiled: those `tiled_floor` measures again."""
    return [n for n in sorted(curve) if n >= TILED_FROM]


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def measure_switch(model: LlamaModel, big: int, steady: dict[int, float], pairs: int = _SWITCH_PAIRS,
                   step: Callable[[str], None] | None = None) -> float:
    """Seconds a round trip between batches of 1 and `big` tokens costs beyond their steady
    costs (`steady`, from `measure`): on a GPU llama.cpp rebuilds its CUDA graph at each change of
    shape. The median pair counts; step(what) runs before each pair. Leaves the model's cache
    empty."""
    _start(model)
    positions = np.arange(_CONTEXT, _CONTEXT + big, dtype=np.int32)
    extra = []
    try:
        for _ in range(pairs):
            if step is not None:
                step("batch-shape change")
            t = time.perf_counter()
            for n in (1, big):
                model.decode(_batch(model, n), positions[:n], logits=True)
                model.seq_rm(0, _CONTEXT, -1)
            extra.append(time.perf_counter() - t - steady[1] - steady[big])
    finally:
        model.clear()
    return max(0.0, float(np.median(extra)))


def _fingerprint(models: Sequence[LlamaModel]) -> str:
    parts = [_METHOD, platform.machine(), _cpu_name(), lc.__version__,
             lc.llama_print_system_info().decode(errors="replace"), *library_stamps()]
    for model in models:
        st = model.path.stat()
        parts += [str(model.path.resolve()), str(st.st_size), str(int(st.st_mtime)),
                  str(model.n_gpu_layers), str(model.threads_now), str(model.n_batch),
                  "exact" if getattr(model, "exact", False) else "fast",
                  # with hidden states llama.cpp outputs (and copies out) every row of a batch,
                  # which a head's target pays for: another curve
                  "hidden" if model.hidden else "logits"]
        if getattr(model, "kv_type", "f16") != "f16":   # another cell type, other attention costs
            parts.append(f"kv {model.kv_type}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cached_curves(models: Sequence[LlamaModel], sizes: Sequence[Sequence[int]], cache_dir: Path,
                  refresh: bool = False, path: Path | None = None) -> list[dict[int, float]]:
    """`measure(models, sizes)`, from the cache (`path`, default: by fingerprint in `cache_dir`)
    when these models were measured on this machine within MAX_AGE."""
    path = path or cache_path(models, cache_dir)
    curves = _from_cache(models, sizes, {} if refresh else read_json(path))
    return curves if curves is not None else _measured(models, sizes, path)[0]


def _from_cache(models: Sequence[LlamaModel], sizes: Sequence[Sequence[int]],
                data: dict) -> list[dict[int, float]] | None:
    """The curves a cache file's object (`data`) holds for these models, if it is fresh and has
    every size they can measure; None: measure them."""
    try:
        curves = [{int(n): float(s) for n, s in c.items()} for c in data["seconds"]]
        fresh = time.time() - float(data["measured"]) < MAX_AGE
        if fresh and len(curves) == len(models) and all(
                all(n in c for n in measurable(m, want)) for c, want, m in zip(curves, sizes, models)):
            return curves
    except (ValueError, KeyError, TypeError, AttributeError):
        pass   # missing or unreadable: measure again
    return None


def _measured(models: Sequence[LlamaModel], sizes: Sequence[Sequence[int]], path: Path,
              announce: Announce | None = None,
              write: Callable[[Path, dict], None] | None = None) -> tuple[list[dict[int, float]], dict]:
    """Measure the curves and write them to `path` (by `write`, default write_json) as a new cache
    object (returned with them)."""
    curves = measure(models, sizes, announce=announce)
    data = {"models": [str(m.path) for m in models], "measured": time.time(),
            "seconds": _as_json(curves)}
    (write or write_json)(path, data)
    return curves, data


def _keep_nothing(path: Path, data: dict) -> None:
    """calibrate's writer when what it measures is for this run only."""


def _as_json(curves: Sequence[dict[int, float]]) -> list[dict[str, float]]:
    """Cost curves as the cache file holds them (sizes as strings)."""
    return [{str(n): s for n, s in c.items()} for c in curves]


def cache_path(models: Sequence[LlamaModel], cache_dir: Path) -> Path:
    return cache_dir / f"{_fingerprint(models)}.json"


def learnt_path(costs: Costs) -> Path | None:
    """Where the adaptive budget's and the pruning's estimates for the calibrated models on this
    machine are kept between runs: next to their calibration."""
    return costs.file.with_name(costs.file.stem + ".learnt.json") if costs.file else None


def read_json(path: Path) -> dict:
    """A cache file's object; {} when it is missing or unusable (models/own_files.py: not a
    regular file, too big, nested too deep, not JSON): the caller measures again, and its write
    replaces the file."""
    try:
        data = own_files.read_json(path, own_files.CALIBRATION_MAX_BYTES)
    except (FileNotFoundError, own_files.Unreadable):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict) -> None:
    """Replace a cache file atomically; a read-only data dir only costs the cache."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass


def default_cache_dir() -> Path:
    from localspec.models.paths import data_dir

    return data_dir() / "calibration"


def calibrate(target: LlamaModel, draft: LlamaModel | None, max_nodes: int,
              cache_dir: Path | None = None, refresh: bool = False,
              progress: Progress | None = None, keep: bool = True) -> Costs:
    """`_calibrate` with each model's thread count held at what the cores allow when it starts
    (engine/cores.py): the curves are that count's, and the cache is keyed by it. On a CPU a
    batch's cost over one row's depends on the count (docs/decisions/0053), so curves measured
    while another process kept a core busy must not stand for a quiet machine's, nor the other
    way round."""
    with ExitStack() as held:
        for model in (target, draft):
            if model is not None:
                held.enter_context(model.threads_held())
        return _calibrate(target, draft, max_nodes, cache_dir, refresh, progress, keep)


def _calibrate(target: LlamaModel, draft: LlamaModel | None, max_nodes: int,
               cache_dir: Path | None, refresh: bool, progress: Progress | None, keep: bool) -> Costs:
    """Cost curves of the target (batches up to max_nodes + 2: a full tree and its padding) and
    of a GGUF draft; with the target on a GPU, also what a change of batch shape costs
    (`measure_switch`); on a CPU with packaging/patches, ggml's tiled-matmul floor
    (`tiled_floor`, with the multi-column kernels taking up to MULTICOL_WIDEST rows below it) and
    whether one-row decodes take those kernels (`one_row_kernels`, the curves' one-row costs then
    the chosen side's); on a GPU with packaging/patches, the path of each batch width up to
    CUDA_WIDEST (`cuda_widths`, before the curves, which are measured under that choice and hold
    every width it timed), all in `Costs.switches`. The cache file is
    read once; what is measured is added to it (keep False: used for this run only, the file left
    as it was), each batch announced to `progress` first (nothing when everything is cached).
    The process's environment is left as it was."""
    write = write_json if keep else _keep_nothing
    top = max(2, max_nodes + 2)
    sizes = sorted({n for n in SIZES if n <= top} | {top})
    models, wanted = ([target], [sizes]) if draft is None else ([target, draft], [sizes, DRAFT_SIZES])
    path = cache_path(models, cache_dir or default_cache_dir())
    cpu = target.n_gpu_layers == 0 and not exact_in_process()   # exact numerics pin both switches
    steer, one_row = cpu and has_tiled_min_switch(), cpu and has_multicol_kernels()
    per_width = target.n_gpu_layers != 0 and has_cuda_width_switches()
    data = {} if refresh else read_json(path)
    widest = MULTICOL_WIDEST if one_row else None
    if data.get("multicol_max") != widest:   # measured under another bound of the kernels: all again
        data = {}
    if per_width and _cached_widths(data) is None:   # the curves follow the widths' choice: all again
        data = {}
    curves = _from_cache(models, wanted, data)
    cached = curves is not None
    if curves is None:
        data = {}                                  # a new measurement replaces the file's object
    # what the cache lacks, decided before the first step so that each step knows the total
    target_sizes = curves[0] if curves is not None else dict.fromkeys(measurable(target, sizes))
    measure_floor = steer and not isinstance(data.get("tiled_min"), int)
    measure_kernels = one_row and not isinstance(data.get("multicol_min"), int)
    measure_shape = (target.n_gpu_layers != 0 and top in target_sizes
                     and not isinstance(data.get("switch"), (int, float)))
    step = _Steps(progress, (0 if curves is not None else
                             _REPS * sum(len(measurable(m, w)) for m, w in zip(models, wanted))
                             + (cuda_width_steps(target, top) if per_width else 0))
                  + (_REPS * len(_tiled_sizes(target_sizes)) if measure_floor else 0)
                  + (2 * _REPS * sum(len(measurable(m, (1,))) for m in models) if measure_kernels else 0)
                  + (_SWITCH_PAIRS if measure_shape else 0))
    floor = kernels = None
    # a fresh curve is measured as ggml and the patches ship; what they lead to is returned, not left set
    shipped = (({TILED_MIN: str(TILED_FROM)} if steer else {})
               | ({MULTICOL_MIN: "2", MULTICOL_MAX: str(widest)} if one_row else {}))
    # on a GPU each width's path is chosen first, and the curves (the draft's too: the switches are
    # process-wide) are measured under that choice, with the widths the curves do not hold added
    if curves is None and per_width:
        chosen = cuda_widths(target, top, step)
        shipped |= _cuda_switches(chosen.masks)
    elif per_width:
        shipped |= _cuda_switches(_cached_widths(data))
    with switches(shipped):
        if curves is None:
            curves, data = _measured(models, wanted, path,
                                     lambda i, n: step(f"{_NAMES[i]} {_rows(n)}"), write)
            if per_width:
                curves[0] = chosen.best | curves[0]
                data = {**data, "seconds": _as_json(curves), "cuda_widths": {
                    **chosen.masks, "paths": {name: _as_json([c])[0] for name, c in chosen.paths.items()}}}
                write(path, data)
        if steer:
            floor = data.get("tiled_min")
            if measure_floor:
                floor, curves[0] = tiled_floor(target, curves[0], step)
                data = {**data, "tiled_min": floor, "multicol_max": widest, "seconds": _as_json(curves)}
                write(path, data)
        if one_row:
            kernels = data.get("multicol_min")
            if measure_kernels:
                kernels, one = one_row_kernels(models, step)
                for curve, seconds in zip(curves, one[kernels]):
                    if 1 in curve:
                        curve[1] = seconds
                data = {**data, "multicol_min": kernels, "multicol_max": widest,
                        "one_row": {str(k): v for k, v in one.items()},
                        "seconds": _as_json(curves)}
                write(path, data)
        switch = data.get("switch") if target.n_gpu_layers != 0 and top in target_sizes else 0.0
        if measure_shape:
            switch = measure_switch(target, top, curves[0], step=step)
            data = {**data, "switch": switch}
            write(path, data)
    masks = _cached_widths(data) if per_width else {}
    measured = not cached or measure_floor or measure_kernels or measure_shape
    return Costs(curves[0], curves[1] if draft is not None else {}, path if keep or not measured else None,
                 float(switch), floor, kernels,
                 widest, masks.get("multicol"), masks.get("mmq"), masks.get("stream"))


def _cached_widths(data: dict) -> dict[str, int] | None:
    """A cache object's choice of paths by width (`cuda_widths`' masks), None where it has none."""
    masks = data.get("cuda_widths")
    if not isinstance(masks, dict) or not all(isinstance(masks.get(k), int) for k in ("multicol", "mmq", "stream")):
        return None
    return {"multicol": masks["multicol"], "mmq": masks["mmq"], "stream": masks["stream"]}


def _cuda_switches(masks: dict[str, int]) -> dict[str, str]:
    """The switches of a choice of paths by width."""
    return {CUDA_MULTICOL_WIDTHS: str(masks["multicol"]), CUDA_MMQ_WIDTHS: str(masks["mmq"]),
            CUDA_STREAM_WIDTHS: str(masks["stream"])}
