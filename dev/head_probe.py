"""How often a draft head's guesses are the target's own choices, on the target's greedy text.

For each prompt the target writes N tokens greedily; then, teacher-forced over prompt + output,
the head is started from the target's hidden state at every generated position and unrolled
`--steps` tokens along the real continuation: the fraction of steps whose top guess is the
target's choice, per unrolled step (what a chain of the head's first guesses would get accepted
at, given the earlier ones were). Runs on a CPU (slowly) or a GPU.

    python dev/head_probe.py --model target.gguf --head head.npz [--workload humaneval --limit 3]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from localspec.app import workloads
from localspec.engine.drafters.head import DraftHead
from localspec.engine.llama_model import LlamaModel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--workload", default="humaneval", choices=["humaneval", "edit", "chat"])
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    m = LlamaModel(args.model, n_ctx=4096, n_batch=2048, n_seq_max=1, hidden=True)
    head = DraftHead(args.head, args.model, n_embd=m.n_embd, vocab_size=m.vocab_size)
    chat = None
    if args.workload != "humaneval":
        from localspec.engine.options import Options
        from localspec.engine.session import Session
        probe = Session(Options(args.model, speculation=False))
        chat = probe.chat_prompt
    prompts = workloads.build(args.workload, args.limit, lambda t: m.tokenize(t, special=False), chat)
    total = np.zeros(args.steps)
    count = np.zeros(args.steps)
    for p in prompts:
        toks = list(p.tokens)
        m.clear()
        m.prefill(toks[:-1], 0)
        out, cur, pos = [], toks[-1], len(toks) - 1
        for _ in range(args.tokens):
            m.decode([cur], [pos], logits=True)
            pos += 1
            cur = int(m.logits()[0].argmax())
            out.append(cur)
        seq = toks + out
        m.clear()
        m.decode(seq, np.arange(len(seq)), logits=True)
        label = m.logits()[:len(seq)].argmax(1)
        states = np.stack([m.hidden_row(i).copy() for i in range(len(seq))])
        hits, n = np.zeros(args.steps), np.zeros(args.steps)
        for t in range(len(toks), len(seq) - args.steps):
            f = torch.from_numpy(states[t - 1]).to(head.device, head.dtype)[None]
            for j in range(args.steps):
                f, logits = head.step(f, [seq[t + j]])
                f = f.clone()
                hits[j] += int(head.vocab[int(logits.argmax())]) == label[t + j]
                n[j] += 1
        total += hits
        count += n
        print(p.name, "top-1 per step", np.round(hits / np.maximum(n, 1), 3))
    print("all", np.round(total / np.maximum(count, 1), 3))


if __name__ == "__main__":
    main()
