"""Where a draft head's round goes on this machine: `localspec bench` under cProfile, then the
functions a head round calls (the head's, tree growth's, and torch's own calls from them), by
their own time, and what `HeadDrafter.propose` spends in each callee. On a GPU a `.cpu()` or
`.item()` waits for the kernels queued before it: its time is the GPU's, the rest the host's.

    python dev/head_round_profile.py [--top 30] -- bench --model T.gguf --head H.npz
        --workload humaneval --limit 10 --configs head-chain-2 --out DIR
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

from localspec.app.cli import main as cli


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- then localspec's arguments")
    args = ap.parse_args()
    argv = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    prof = cProfile.Profile()
    rc = prof.runcall(cli, argv)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(r"drafters/(head|grow)|tree\.py|TensorBase|torch\._C|built-in method torch", args.top)
    stats.sort_stats("cumulative").print_callees(
        r"drafters/head\.py:\d+\((propose|evaluate_root|evaluate|_insert|_take|step|_graph_inputs|_dists)\)")
    print(out.getvalue())
    sys.exit(rc)


if __name__ == "__main__":
    main()
