"""Projection: what the engine would gain on a bigger target, from the reference target's drafts
and the bigger shape's measured cost curve (issue 46's projection table).

The reference target runs here (a CPU is enough) through `localspec bench`'s own loop, but every
llama.cpp decode is priced, not timed: the engine's clock (time.perf_counter, which its policy,
its stopwatch and bench's tok/s all read) moves by the curve's milliseconds for the batch's width
instead of the real decode's. So the adaptive budget learns, prunes and picks its trees against
the bigger shape's costs, as it would on that GPU, and bench's tok/s columns are the projection.
What is not priced (drafting, the walk over the logits, bookkeeping) runs on this machine's
clock, as measured here: on the GPU's host it is at most this.

Assumptions, stated with every table made from it:
* the bigger target accepts the drafts as often as the reference target does (its greedy text
  differs; a larger model of the family is usually no harder to predict);
* a batch's cost is the curve's at its width (padding included), a change of width costs half
  the curve's `switch` (a round trip's extra), and widths past the curve's last are priced by
  ggml's own cost at the widest grown by `--beyond` (from 0044's H200 curves past 16 rows).

Usage: python3 dev/shape_projection.py CURVES.json --model TARGET.gguf [--draft DRAFT.gguf
--draft-curve BENCH.json] --workload W --limit N --configs plain,adaptive-nomodel --out DIR
CURVES.json: dev/cuda_width_curves.py's output (its calibration: the widths' chosen costs).
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

from localspec.engine import build  # llama.cpp before numpy: see engine/native.py
from localspec.engine.costs import Costs
from localspec.engine.llama_model import LlamaModel, padded_rows
from localspec.engine.config import SamplingParams

from localspec.app import bench


def _read(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


class PricedClock:
    """time.perf_counter as the engine will read it: the real clock plus what the priced decodes
    added over their real time."""

    def __init__(self) -> None:
        self.real = time.perf_counter
        self.offset = 0.0

    def __call__(self) -> float:
        return self.real() + self.offset


def price(curve: dict[int, float], n: int, past: tuple[float, float]) -> float:
    """Milliseconds a batch of n rows costs on `curve` (ms by width): the measured width, else
    linear between the two measured around it, else past the widest w as `past` = (base, beyond)
    says: base * (1 + beyond * (n - w) / w), and no less than the widest's cost. Past the widest
    the calibrated kernels take no batch, so the base is ggml's own cost at the widest."""
    if n in curve:
        return curve[n]
    widths = sorted(curve)
    if n > widths[-1]:
        last = widths[-1]
        base, beyond = past
        return max(curve[last], base * (1 + beyond * (n - last) / last))
    hi = next(w for w in widths if w > n)
    lo = max((w for w in widths if w < n), default=hi)
    if lo == hi:
        return curve[hi]
    return curve[lo] + (curve[hi] - curve[lo]) * (n - lo) / (hi - lo)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("curves")
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--draft-curve", help="a bench.json whose calibration.draft_ms prices the draft's decodes")
    ap.add_argument("--workload", default="humaneval")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--configs", default="plain,adaptive-nomodel")
    ap.add_argument("--beyond", type=float, default=0.25,
                    help="past the curve's widest w, ggml's cost there grows by this much for every w rows more "
                         "(0.25: 0044's H200 curves from 16 to 24 and 32 rows, 7B and 32B alike)")
    ap.add_argument("--path", default="calibrated",
                    help="which curve of CURVES.json: calibrated (each width's cheapest path, as the "
                         "engine's calibration picks) or one path of its paths_ms (ggml: stock dispatch)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    record = _read(args.curves)
    cal = record["calibration"]
    chosen = cal["target_ms"] if args.path == "calibrated" else record["paths_ms"][args.path]
    target_ms = {int(n): float(v) for n, v in chosen.items()}
    switch_ms = float(cal.get("switch_ms", 0.0))
    widest = max(target_ms)
    past = (float(record.get("paths_ms", {}).get("ggml", {}).get(str(widest), target_ms[widest])), args.beyond)
    draft_ms = ({int(n): float(v) for n, v in _read(args.draft_curve)["calibration"]["draft_ms"].items()}
                if args.draft_curve else {})
    model_path = Path(args.model).resolve()
    draft_path = Path(args.draft).resolve() if args.draft else None
    if draft_path is not None and not draft_ms:
        sys.exit("--draft needs --draft-curve: a draft's decodes are priced too")

    clock = PricedClock()
    last_width: dict[Path, int] = {}
    real_decode = LlamaModel.decode

    def priced_decode(self, tokens, positions, seq_ids=None, *, logits=True, pad_to=0, top_up=True):
        began = clock.real()
        real_decode(self, tokens, positions, seq_ids, logits=logits, pad_to=pad_to, top_up=top_up)
        spent = clock.real() - began
        rows = padded_rows(len(tokens), pad_to, top_up)
        path = Path(self.path).resolve()
        curve = target_ms if path == model_path else draft_ms if path == draft_path else None
        if curve:
            ms = price(curve, rows, past if curve is target_ms else (curve[max(curve)], args.beyond))
            if path == model_path and last_width.get(path, rows) != rows:
                ms += switch_ms / 2
            last_width[path] = rows
            clock.offset += ms / 1e3 - spent

    # the engine's costs: the shape's curve, as its calibration on that GPU gave them
    top = max(bench.largest_tree(args.configs.split(",")) + 2, max(target_ms))
    curve_s = {n: price(target_ms, n, past) / 1e3 for n in sorted(set(target_ms) | {24, 32, top})
               if n <= top}
    costs = Costs(curve_s, {n: v / 1e3 for n, v in draft_ms.items()}, None, switch_ms / 1e3)
    build.calibrate = lambda *a, **k: costs
    LlamaModel.decode = priced_decode
    time.perf_counter = clock

    names = args.configs.split(",")
    prompts, store, learnt = bench.bench_inputs(model_path, args.workload, args.limit, [], 0, None)
    try:
        report = bench.run_bench(model_path, draft_path, prompts, names, args.max_tokens, SamplingParams(),
                                 4096, store=store, check=False,
                                 progress=lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        store.close()
    report["workload"] = args.workload
    report["ngram_source"] = learnt
    report["projection"] = {"curves": Path(args.curves).name, "gpu": record.get("gpu"),
                            "shape": record.get("model"), "path": args.path, "target_ms": target_ms, "switch_ms": switch_ms,
                            "draft_ms": draft_ms, "past_widest": {"base_ms": past[0], "beyond": past[1]},
                            "priced": "every llama.cpp decode; the rest as timed on this machine"}
    print(bench.format_table(report))
    for path in bench.write_outputs(report, Path(args.out), plot=False):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
