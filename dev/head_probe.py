"""How often a draft head's guesses are the target's own choices, on the target's greedy text.

For each prompt the target writes N tokens greedily; then, teacher-forced over prompt + output,
the true (state, token) pairs fill the head's cache, and from every generated position the head
is unrolled `--steps` tokens along the real continuation on its own predicted states: the
fraction of steps whose top guess is the target's choice, per unrolled step (what a chain of the
head's first guesses would get accepted at, given the earlier ones were). Runs on a CPU (slowly)
or a GPU; `--numerics` compares a CPU's float32, bfloat16 and int8 weights.

    python dev/head_probe.py --model target.gguf --head head.npz [--workload humaneval --limit 3]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from localspec.app import workloads
from localspec.engine.drafters.head import TREE, WINDOW, DraftHead
from localspec.engine.llama_model import LlamaModel

from head_step_probe import numerics  # dev/, the script's own folder


def unrolled_hits(head: DraftHead, states: np.ndarray, seq: list[int], label: np.ndarray, first: int,
                  steps: int, top: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Teacher-forced: the true pairs (state at p, token p+1) go into the head's cache in one
    causal step; from each generated position the head is then unrolled `steps` pairs along the
    real text on its own predicted states, each level seeing the cache up to where it started
    and its own row, as a tree node does. (hits, counts) per level, and the first level's hits
    within its top 1..`top` guesses (what a root with that many children would catch)."""
    n = len(seq) - 1
    pos = np.arange(n)
    mask = np.zeros((n, WINDOW + TREE), bool)
    mask[:, :n] = np.tril(np.ones((n, n), bool))
    f = torch.from_numpy(states[:n]).to(head.device, head.dtype)
    state, logits, _, _ = head.step(f, seq[1:], pos, pos % WINDOW, mask)
    guess = head.vocab[logits.argmax(1).cpu().numpy()]          # row p: the token at p + 2
    hits, count = np.zeros(steps), np.zeros(steps)
    starts = np.arange(first - 1, n - steps)                   # rows whose token p + 1 is generated
    hits[0], count[0] = (guess[starts] == label[starts + 1]).sum(), len(starts)
    ranked = head.vocab[logits[starts].topk(top, dim=1).indices.cpu().numpy()]   # [rows, top]
    within = np.cumsum(ranked == label[starts + 1][:, None], axis=1).astype(bool).sum(0)
    per = (TREE - 1) // max(1, steps - 1)                      # rows a chunk, a tree slot each level
    for chunk in np.array_split(starts, max(1, -(-len(starts) // per))):
        rows = len(chunk)
        prev = state[chunk].clone()
        m = np.zeros((rows, WINDOW + TREE), bool)
        m[:, :n] = pos[None, :] <= chunk[:, None]
        for j in range(1, steps):
            slots = WINDOW + (j - 1) * rows + np.arange(rows)
            m[np.arange(rows), slots] = True                   # itself, and its levels before
            p = chunk + j
            out, lg, _, _ = head.step(prev, [seq[i + 1] for i in p], p, slots, m)
            prev = out.clone()
            g = head.vocab[lg.argmax(1).cpu().numpy()]
            hits[j] += (g == label[p + 1]).sum()
            count[j] += rows
    return hits, count, within


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--numerics", default="auto", choices=["auto", "float32", "bfloat16", "int8"],
                    help="the head's numerics (auto: as a run picks them here)")
    ap.add_argument("--workload", default="humaneval", choices=["humaneval", "edit", "chat"])
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    m = LlamaModel(args.model, n_ctx=4096, n_batch=2048, n_seq_max=1, hidden=True)
    head = DraftHead(args.head, args.model, n_embd=m.n_embd, vocab_size=m.vocab_size, **numerics(args.numerics))
    chat = None
    if args.workload != "humaneval":
        from localspec.engine.options import Options
        from localspec.engine.session import Session
        probe = Session(Options(args.model, speculation=False))
        chat = probe.chat_prompt
    prompts = workloads.build(args.workload, args.limit, lambda t: m.tokenize(t, special=False), chat)
    total = np.zeros(args.steps)
    count = np.zeros(args.steps)
    within = 0.0   # becomes unrolled_hits' top-k counts
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
        hits, n, top = unrolled_hits(head, states, seq, label, len(toks), args.steps)
        total += hits
        count += n
        within += top
        print(p.name, "top-1 per step", np.round(hits / np.maximum(n, 1), 3))
    print("all", np.round(total / np.maximum(count, 1), 3))
    print("first level, the target's choice within the top 1..4 guesses", np.round(within / max(count[0], 1), 3))


if __name__ == "__main__":
    main()
