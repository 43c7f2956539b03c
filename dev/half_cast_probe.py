"""ms to keep a batch of hidden states as float16, numpy's cast against native.to_half (ggml's
vectorised conversion), for the shapes `head train` converts: a text chunk's 512 rows and a
generation step's 256, at the reference target's width with taps 2 and 14 (3 x 1536) and without.
(docs/decisions/0036)

    .venv/bin/python dev/half_cast_probe.py [--reps 30]
"""
from __future__ import annotations

import argparse
import statistics
import time

from localspec.engine import native  # llama.cpp's libraries before numpy (native.py)

import numpy as np  # noqa: E402


def ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for rows, width in ((512, 4608), (256, 4608), (512, 1536), (256, 1536)):
        src = rng.standard_normal((rows, width)).astype(np.float32) * 8
        out = np.empty((rows, width), np.float16)

        def cast() -> None:
            out[...] = src

        def to_half() -> None:
            native.to_half(src, out)

        a, b = ms(cast, args.reps), ms(to_half, args.reps)
        print(f"{rows:4d} x {width:5d}: numpy {a:7.3f} ms, to_half {b:6.3f} ms ({a / b:5.1f}x)", flush=True)


if __name__ == "__main__":
    main()
