"""Does uniform noise on the target's states while training (`head train --noise`, EAGLE's
regulariser against learning the corpus by heart) make a draft head guess better on held-out
files? One corpus (taps_ab.py's: `head train`'s default text less the chat history, read once
with the taps, and the target's continuations) trains two heads with the same seed, held-out
files and number of steps (the first head's in `--minutes`): without noise and with `--noise`.
Prints each head's held-out top-1 by tree depth and which is higher at depth 1; writes both.
Why it is asked: a 2.75M-token head's training loss kept falling while its held-out top-1 gained
one point in the last half of its steps (docs/decisions/0033's last addendum).

    python dev/noise_ab.py TARGET.gguf --out DIR --noise 0.2 [taps_ab.py's corpus flags]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from taps_ab import add_corpus_args, read_corpus, tap_layers, train_pair  # dev/, the script's own folder


def main() -> None:
    ap = argparse.ArgumentParser()
    add_corpus_args(ap)
    ap.add_argument("--noise", type=float, default=0.2, help="the second head's noise (0..1)")
    args = ap.parse_args()
    model, out = Path(args.model), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    taps = tap_layers(args.taps, model)
    corpus = read_corpus(args, model, taps)
    train_pair(args, model, out, [("noise-0.0", "no noise", corpus, {"taps": taps, "noise": 0.0}),
                                  (f"noise-{args.noise}", f"noise {args.noise}", corpus,
                                   {"taps": taps, "noise": args.noise})])


if __name__ == "__main__":
    main()
