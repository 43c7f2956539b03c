"""Whether torch.compile (inductor) makes a draft head's step cheaper: the head's step as it runs
today against the same step compiled, one row and eight, with the top guesses compared.

On a GPU a head step is ~40 small kernels replayed from a CUDA graph (their cost:
docs/decisions/0031): fused by inductor into fewer, the replay should shrink. Here the compiled
step is captured in a CUDA graph the way `DraftHead._capture` captures the eager one. On a CPU
both run eagerly.

The compiled function is `DraftHead._run` without its `inference_mode` decorator, called under
`no_grad`: inductor fails on the head's inference tensors (0031). Compiling takes seconds a
shape, so a run would need inductor's cache before this could be the default.

    python dev/head_compile_probe.py --model target.gguf --head head.npz [--rows 1,8] [--reps 100]
"""
from __future__ import annotations

import argparse
import time

from localspec.engine.llama_model import LlamaModel  # llama.cpp before torch: the GPU host needs it

import numpy as np  # noqa: E402
import torch  # noqa: E402

from localspec.engine.drafters.head import TREE, WINDOW, DraftHead  # noqa: E402

from head_step_probe import fastest  # noqa: E402  (dev/, the script's own folder)


def graphed(fn, args: tuple):
    """`fn(*args)` captured in a CUDA graph (warm-up on a side stream first, as DraftHead does):
    (replay, outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn(*args)
    return graph.replay, outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--mode", default="max-autotune-no-cudagraphs", help="torch.compile's mode")
    args = ap.parse_args()
    meta = LlamaModel(args.model, n_ctx=256, n_seq_max=1, n_gpu_layers=0, hidden=True)
    n_embd, vocab = meta.n_embd, meta.vocab_size
    meta.close()
    head = DraftHead(args.head, args.model, n_embd=n_embd, vocab_size=vocab, int8=False)
    cuda = head.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    run = DraftHead._run.__wrapped__   # without inference_mode (see above)
    eager = lambda f, idx, m: run(head, f, idx, m)  # noqa: E731
    compiled = torch.compile(eager, mode=args.mode, dynamic=False)
    print(f"head {args.head} on {head.device} ({head.dtype}); compile mode {args.mode}")
    print(f"{'rows':>4} {'eager':>8} {'compiled':>9} {'compile s':>9}  guesses equal  (ms, fastest of {args.reps})")
    with torch.no_grad():
        for n in (int(x) for x in args.rows.split(",")):
            f = torch.ones(n, n_embd, device=head.device, dtype=head.dtype)
            idx = torch.from_numpy(np.stack([head._slots([(1000 + 7 * i) % vocab for i in range(n)]),
                                             np.arange(n) + WINDOW, WINDOW + np.arange(n)])).to(head.device)
            mask = np.zeros((n, WINDOW + TREE), bool)
            mask[:, :WINDOW] = True
            mask[np.arange(n), WINDOW + np.arange(n)] = True
            m = torch.from_numpy(mask).to(head.device)
            t = time.perf_counter()
            compiled(f, idx, m)
            sync()
            took = time.perf_counter() - t
            if cuda:
                step_e, out_e = graphed(eager, (f, idx, m))
                step_c, out_c = graphed(compiled, (f, idx, m))
            else:
                step_e, step_c = (lambda: eager(f, idx, m)), (lambda: compiled(f, idx, m))
                out_e, out_c = eager(f, idx, m), compiled(f, idx, m)
            t_e, t_c = fastest(step_e, args.reps, sync), fastest(step_c, args.reps, sync)
            same = bool((out_e[3] == out_c[3]).all())
            print(f"{n:>4} {1e3 * t_e:8.3f} {1e3 * t_c:9.3f} {took:9.1f}  {same}")


if __name__ == "__main__":
    main()
