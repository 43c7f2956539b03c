"""Where an engine's verify costs more than the calibration's batch of the same size.

The calibration (engine/calibrate.py) times a batch of n tokens in one sequence after a short
context, every row with logits. The engine's verify of an n-node tree (engine/target.py) adds:
one sequence per leaf (seq_cp of the context to each, every node carrying the ids of the paths
through it), padding rows and sequences (shapes.py), hidden states and the taps' layer inputs
when a head drafts, a longer context, and the rollback (keep_path). This times each addition on
its own, one target, alternated round by round, so the gap splits into its parts.

Usage: python3 dev/verify_gap_probe.py TARGET.gguf [--nodes 12] [--contexts 300,700]
       [--taps 2,14] [--rounds 40]
Prints, per context, ms per verify (median) for:
  calib        n tokens in sequence 0, logits for every row (what calibrate measures)
  calib+hid    the same with hidden states (and taps) handed back
  tree         the n-node tree as Target.verify decodes it, unpadded, rollback timed apart
  tree+pad     padded as a GPU engine pads it (STABLE: nodes + 2 rows, sequences topped up)
  tree+bucket  padded to the next bucket, rows only (BUCKETS)
  tree+hid     tree+pad with hidden states (and taps) on, as the head configuration runs
  tree+hid+rd  tree+hid reading every row's hidden state (the head's next input), as it does
and the rollback's ms (Target.commit) after a tree.

--bookkeeping instead runs rounds as an engine does (verify a tree, commit its first node, the
context growing) and prints the ms per round spent in the cache's sequence operations alone
(seq_cp, seq_rm, seq_keep, drop_padding; the CPU-side part of a round that grows with the
context, docs/decisions/0035), split into the verify's and the commit's.
"""
from __future__ import annotations

import argparse
import statistics
import time

from localspec.engine.llama_model import LlamaModel  # llama.cpp before numpy: the GPU host needs it

import numpy as np  # noqa: E402

from localspec.engine.shapes import bucket  # noqa: E402
from localspec.engine.target import Target  # noqa: E402
from localspec.engine.tree import DraftTree  # noqa: E402


def head_like_tree(nodes: int, root: int, vocab: int) -> DraftTree:
    """A tree shaped as a head grows one: top-3 at the root, top-2 under the best child at each
    level after, the rest of the nodes down the best path (a few leaves, a long spine)."""
    tree = DraftTree(nodes + 1)
    tree.reset(root)
    rng = np.random.default_rng(0)
    spine, width = 0, 3
    while tree.n < nodes:
        first = -1
        for _ in range(min(width, nodes - tree.n)):
            child = tree.add(spine, int(rng.integers(100, vocab - 100)), -0.5, 0)
            first = child if first < 0 else first
        spine, width = first, 2 if tree.n < nodes // 2 else 1
    return tree


KV_OPS = ("seq_cp", "seq_rm", "seq_keep", "drop_padding")


def bookkeeping(model: LlamaModel, target: Target, nodes: int, contexts: list[int], rounds: int) -> None:
    """ms per round in the cache's sequence operations, the verify's and the commit's."""
    spent = {"verify": 0.0, "commit": 0.0}
    phase = ["verify"]
    for name in KV_OPS:                                  # timed wrappers on this instance
        op = getattr(model, name)

        def timed(*a, _op=op, **k):
            t = time.perf_counter()
            _op(*a, **k)
            spent[phase[0]] += time.perf_counter() - t
        setattr(model, name, timed)
    vocab = model.vocab_size
    model.set_hidden(False)
    for context in contexts:
        target.reset()
        prompt = list((np.arange(context) * 7919 % (vocab - 200) + 100).astype(np.int32))
        target.prefill(prompt[:-1])
        root = int(prompt[-1])
        for key in spent:
            spent[key] = 0.0
        for _ in range(rounds):
            tree = head_like_tree(nodes, root, vocab)
            phase[0] = "verify"
            target.verify(tree, min(nodes + 2, target.room), True)
            phase[0] = "commit"
            target.commit(tree, [1])                     # the first guess right: 2 tokens kept
            root = (root * 31 + 7) % (vocab - 200) + 100
        print(f"  context {context}: KV bookkeeping per round {1e3 * spent['verify'] / rounds:.3f} ms "
              f"in the verify, {1e3 * spent['commit'] / rounds:.3f} ms in the commit "
              f"({rounds} rounds of {nodes} nodes, padded)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--contexts", default="300,700")
    ap.add_argument("--taps", default="2,14")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--bookkeeping", action="store_true")
    ap.add_argument("--n-ctx", type=int, default=4096, help="the context's cells (each sequence operation scans them all)")
    args = ap.parse_args()
    taps = tuple(int(t) for t in args.taps.split(",") if t) if args.taps != "none" else ()
    nodes = args.nodes
    model = LlamaModel(args.target, n_ctx=args.n_ctx, n_seq_max=nodes + 2, n_pad_seqs=nodes + 2,
                       n_batch=512, hidden=True, taps=taps)
    target = Target(model)
    vocab = model.vocab_size
    print(f"{args.target}: {nodes} nodes, taps {list(taps)}, offloaded layers {model.n_gpu_layers}, "
          f"{model.n_threads} threads", flush=True)
    if args.bookkeeping:
        bookkeeping(model, target, nodes, [int(c) for c in args.contexts.split(",")], args.rounds)
        model.close()
        return
    for context in (int(c) for c in args.contexts.split(",")):
        target.reset()
        model.set_hidden(False)
        prompt = list((np.arange(context) * 7919 % (vocab - 200) + 100).astype(np.int32))
        target.prefill(prompt[:-1])
        root = int(prompt[-1])
        tree = head_like_tree(nodes, root, vocab)
        flat = np.asarray(tree.tokens[:tree.n])
        pos = np.arange(target.n_past, target.n_past + tree.n, dtype=np.int32)
        times: dict[str, list[float]] = {}
        rollback: list[float] = []

        def calib(hidden: bool) -> float:
            t = time.perf_counter()
            model.decode(flat, pos, None, logits=True)
            _ = model.logits()[:tree.n]
            if hidden:
                _ = model.hidden_rows()
            spent = time.perf_counter() - t
            model.seq_rm(0, target.n_past, -1)
            return spent

        def verify(pad_to: int, top_up: bool, hidden: bool, read: bool) -> float:
            t = time.perf_counter()
            rows = target.verify(tree, pad_to, top_up)
            _ = int(np.argmax(rows[0]))
            if read:
                _ = model.hidden_rows()[:tree.n].copy()
            spent = time.perf_counter() - t
            t = time.perf_counter()
            target.commit(tree, [])          # the root alone stays: one cell more of context
            rollback.append(time.perf_counter() - t)
            target.n_past -= 1                   # and goes again, from every sequence
            model.seq_rm(-1, target.n_past, -1)
            if hasattr(target, "_tagged"):       # a Target that keeps the paths' tags (0035)
                np.minimum(target._tagged, target.n_past, out=target._tagged)
            return spent

        stable = min(nodes + 2, target.room)
        buck = bucket(tree.n, nodes + 1)
        variants = {
            "calib": lambda: calib(False),
            "calib+hid": lambda: calib(True),
            "tree": lambda: verify(0, True, False, False),
            "tree+pad": lambda: verify(stable, True, False, False),
            "tree+bucket": lambda: verify(buck, False, False, False),
            "tree+hid": lambda: verify(stable, True, True, False),
            "tree+hid+rd": lambda: verify(stable, True, True, True),
        }
        # blocks of 10 calls a variant, the last 8 counted (a GPU replays its CUDA graph only
        # after two calls of one shape), blocks alternated so drift hits every variant alike
        for block in range(1 + max(1, args.rounds // 8)):
            for name, run in variants.items():
                model.set_hidden("hid" in name)   # once a block: a switch rebuilds llama.cpp's graph
                spent = [run() for _ in range(10)][2:]
                if block:
                    times.setdefault(name, []).extend(spent)
        print(f"  context {context}: tree of {tree.n} nodes, {len(tree.layout().leaf_seq)} leaves, "
              f"padded {stable} (STABLE) / {buck} (BUCKETS)")
        for name, ts in times.items():
            print(f"    {name:12s} {1e3 * statistics.median(ts):7.3f} ms")
        print(f"    {'rollback':12s} {1e3 * statistics.median(rollback):7.3f} ms", flush=True)
    model.close()


if __name__ == "__main__":
    main()
