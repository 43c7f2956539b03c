"""GPU probe: a target's ms per batch by width under three dispatches of its matmuls, one process.

* stock: ggml's own kernels (GGML_CUDA_MULTICOL_WIDTHS=0: the tensor-core kernels take nothing);
* fixed: packaging/patches' kernels from MIN to MAX columns (the width switches unset: 6..16);
* calibrated: the choice `localspec calibrate` makes for this model here (calibrate.cuda_widths:
  each width 1..16 on each path, the cheapest kept), run through the calibration itself.

The calibration runs first (its per-path times are printed and kept); then the three dispatches
take turns repetition by repetition at each width, as calibrate.measure times a batch (a burst
of four after a 64-token context, the fastest of the last two, the fastest repetition counts).
Usage: python3 dev/cuda_width_curves.py TARGET.gguf OUT.json [WIDTHS] (default 1,2,4,8,9,12,16,24,32)
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from localspec.engine import calibrate as cal  # llama.cpp before numpy: see engine/native.py
from localspec.engine.llama_model import LlamaModel
from localspec.engine.native import CUDA_MMQ_WIDTHS, CUDA_MULTICOL_WIDTHS, CUDA_STREAM_WIDTHS, gpu_name, switches

REPS = 5


def main(path: str, out: str, widths: str = "1,2,4,8,9,12,16,24,32") -> int:
    sizes = [int(w) for w in widths.split(",")]
    model = LlamaModel(path, n_ctx=512, n_batch=64, n_seq_max=1, n_gpu_layers=-1)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as cache:
        costs = cal.calibrate(model, None, max(sizes) - 2, cache_dir=Path(cache), refresh=True)
        record = json.loads(costs.file.read_text())
    print(f"calibrated in {time.time() - t0:.0f} s: {costs.to_dict()}")
    dispatches = {"stock": {CUDA_MULTICOL_WIDTHS: "0", CUDA_MMQ_WIDTHS: "0", CUDA_STREAM_WIDTHS: "0"},
                  "fixed": {CUDA_MULTICOL_WIDTHS: None, CUDA_MMQ_WIDTHS: None, CUDA_STREAM_WIDTHS: "0"},
                  "calibrated": costs.switches}
    best = {name: dict.fromkeys(sizes, float("inf")) for name in dispatches}
    for rep in range(REPS):
        for name in dispatches if rep % 2 == 0 else reversed(dispatches):
            with switches(dispatches[name]):
                got = cal.measure([model], [sizes], reps=1)[0]
            best[name] = {n: min(best[name][n], got[n]) for n in sizes}
    model.close()
    ms = {name: {n: round(1e3 * s, 3) for n, s in curve.items()} for name, curve in best.items()}
    result = {"model": Path(path).name, "gpu": gpu_name(), "date": time.strftime("%Y-%m-%d"),
              "ms": ms, "calibration": costs.to_dict(),
              "paths_ms": {p: {n: round(1e3 * s, 3) for n, s in c.items()}
                           for p, c in record["cuda_widths"]["paths"].items()}}
    Path(out).write_text(json.dumps(result, indent=1))
    print("width " + " ".join(f"{n:>7}" for n in sizes))
    for name, curve in ms.items():
        print(f"{name:<10} " + " ".join(f"{curve[n]:7.2f}" for n in sizes))
    for name, curve in result["paths_ms"].items():
        print(f"path {name:<8} " + " ".join(f"{n}:{v:.2f}" for n, v in curve.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
