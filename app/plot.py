"""Draw bench.json as a PNG, in its own process.

The bench runs this as a child process: matplotlib's native libraries crashed (SIGSEGV at import)
when loaded into a process that already holds llama.cpp's CUDA libraries on the GPU host.
"""
from __future__ import annotations

import sys
from pathlib import Path

from localspec.models.own_files import Unreadable, read_json


def plot(report: dict, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([r["config"] for r in rows], [r["tok_s"] for r in rows], color="#4a7")
    ax.set_ylabel("tokens / s")
    ax.set_title(f"localspec bench: {report.get('workload', '')} {report['prompts']} prompts, "
                 f"T={report['temperature']}")
    for i, r in enumerate(rows):
        if r["speedup"]:
            ax.text(i, r["tok_s"], f"{r['speedup']:.2f}x", ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m localspec.app.plot BENCH_JSON OUT_PNG", file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: pip install -e '.[bench]' for the PNG plot", file=sys.stderr)
        return 3
    try:    # the bench.json this run wrote: its figures and traces, megabytes at most
        report = read_json(Path(argv[0]), 256 << 20)
    except (Unreadable, FileNotFoundError) as err:
        print(f"cannot plot: {err}", file=sys.stderr)
        return 2
    plot(report, Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
