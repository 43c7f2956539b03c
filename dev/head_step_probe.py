"""Where a draft head's step goes: the whole step as the adaptive budget measures it, against its
parts, for a few row counts.

On a fast GPU a head's step costs more beside the target's than the issue allows, and more than
its kernels should (docs/decisions/0031 has the figures). This times, fastest of REPS each:
  step      `DraftHead.step` and the read-back greedy drafting does (what `measure` times)
  inputs    the host side alone: embedding slots, the mask, the pinned buffers' fill
  replay    the CUDA graph's replay alone, synchronised (GPU; eager `_run` on a CPU)
  readback  copying the step's top guesses back to the host
so that what the step costs beyond its kernels can be told from the kernels themselves.

    python dev/head_step_probe.py --model target.gguf --head head.npz [--rows 1,4,8] [--reps 50]
"""
from __future__ import annotations

import argparse
import time

from localspec.engine.llama_model import LlamaModel  # llama.cpp before torch: the GPU host needs it

import numpy as np  # noqa: E402
import torch  # noqa: E402

from localspec.engine.drafters.head import _BUCKETS, DraftHead, window_rows  # noqa: E402


def fastest(fn, reps: int, sync) -> float:
    """Seconds of `fn()` between two `sync()`s, fastest of `reps` after one warm-up call (the
    head probes' timer)."""
    best = float("inf")
    for rep in range(reps + 1):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        if rep:
            best = min(best, time.perf_counter() - t)
    return best


def numerics(name: str) -> dict:
    """DraftHead's keywords for --numerics (the head probes')."""
    if name == "auto":
        return {}
    return {"int8": True} if name == "int8" else {"dtype": getattr(torch, name), "int8": False}


@torch.inference_mode()   # as DraftHead.step runs: its graph buffers are inference tensors
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--numerics", default="auto", choices=["auto", "float32", "bfloat16", "int8"],
                    help="the head's numerics (auto: as a run picks them here)")
    ap.add_argument("--rows", default="1,4,8")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    meta = LlamaModel(args.model, n_ctx=256, n_seq_max=1, n_gpu_layers=0, hidden=True)
    n_embd, vocab = meta.n_embd, meta.vocab_size
    meta.close()
    head = DraftHead(args.head, args.model, n_embd=n_embd, vocab_size=vocab, **numerics(args.numerics))
    cuda = head.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    print(f"head {args.head} on {head.device} ({head.dtype}{', int8 weights' if head.int8 else ''}), graphs {head.graphs}")
    print(f"{'rows':>4} {'step':>8} {'inputs':>8} {'replay':>8} {'readback':>9}  (ms, fastest of {args.reps})")
    for n in (int(x) for x in args.rows.split(",")):
        f = torch.ones(n, n_embd, device=head.device, dtype=head.dtype)
        tokens = [(1000 + 7 * i) % vocab for i in range(n)]
        pos, slots, mask = window_rows(n)

        def step():
            _, _, probs, top = head.step(f, tokens, pos, slots, mask)
            torch.cat([probs, top.float()], 1).cpu()

        step()   # a graph for this size is captured by now
        t_step = fastest(step, args.reps, sync)
        if cuda and head.graphs:
            g = head._graphs[next(b for b in _BUCKETS if b >= n)]
            t_inputs = fastest(lambda: head._graph_inputs(g, f, head._slots(tokens), pos, slots, mask),
                               args.reps, sync)
            graph, _, _, outs = g
            t_replay = fastest(graph.replay, args.reps, sync)
            probs, top = outs[2][:n], outs[3][:n]
        else:
            t_inputs = fastest(lambda: head._slots(tokens), args.reps, sync)
            idx = torch.from_numpy(np.stack([head._slots(tokens), pos, slots]))
            m = torch.from_numpy(mask)
            t_replay = fastest(lambda: head._run(f, idx, m), args.reps, sync)
            _, _, probs, top = head._run(f, idx, m)
        t_back = fastest(lambda: torch.cat([probs, top.float()], 1).cpu(), args.reps, sync)
        print(f"{n:>4} {1e3 * t_step:8.3f} {1e3 * t_inputs:8.3f} {1e3 * t_replay:8.3f} {1e3 * t_back:9.3f}")


if __name__ == "__main__":
    main()
