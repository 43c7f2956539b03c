"""Train a draft head (engine/drafters/head.py) for a GGUF target, from text on this machine.

1. `collect`: the target reads the text in chunks (llama.cpp, on the GPU where there is one) and
   hands back, per token, its final hidden state. The labels are the target's own next-token
   choices (greedy, its output matrix applied to those states on the training device): the head
   learns to predict what the target would say, not what the text says.
2. `train`: the head is unrolled `steps` tokens from each sampled position, as it runs when it
   drafts (from the target's state at the first, then from its own predictions), with a loss on
   the target's choice at every step plus a small one pulling each predicted state to the
   target's. The draft vocabulary is the `vocab_size` tokens the target chose most often.

Nothing leaves the machine: the text is the user's (files they name); the head is written next
to the models. Training wants a GPU; on a CPU it runs, slowly, at a small scale (the tests).
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np


@dataclass
class Corpus:
    tokens: np.ndarray     # [N] int32, the text's tokens
    hidden: np.ndarray     # [N, d] float16, the target's final hidden state after each token
    chunk: np.ndarray      # [N] int32, which chunk each token came from (states never cross)


def text_files(roots: Iterable[str | Path], suffixes: Sequence[str] = (".py", ".md", ".txt", ".rst")
               ) -> list[Path]:
    out: list[Path] = []
    for root in roots:
        root = Path(root).expanduser()
        if root.is_file():
            out.append(root)
        elif root.is_dir():
            out += sorted(p for p in root.rglob("*") if p.suffix in suffixes and p.is_file())
    return out


def collect(model, texts: Iterable[str], max_tokens: int, chunk: int = 512,
            progress: Callable[[str], None] = lambda s: None) -> Corpus:
    """Run the target (a LlamaModel opened with hidden=True) over `texts`, `chunk` tokens at a
    time from an empty cache, until `max_tokens`."""
    if not model.hidden:
        raise ValueError("collect() needs the target opened with hidden=True")
    d = model.n_embd
    tokens = np.zeros(max_tokens, np.int32)
    hidden = np.zeros((max_tokens, d), np.float16)
    chunk_of = np.zeros(max_tokens, np.int32)
    n = c = 0
    chunk = min(chunk, model.n_batch, model.n_ctx)
    t0 = time.time()
    for text in texts:
        ids = model.tokenize(text, special=False, add_bos=False)
        for a in range(0, len(ids) - 8, chunk):
            part = ids[a:a + chunk]
            m = min(len(part), max_tokens - n)
            if m < 8:
                break
            part = part[:m]
            model.clear()
            model.decode(part, np.arange(m, dtype=np.int32), logits=True)
            for i in range(m):
                hidden[n + i] = model.hidden_row(i)
            tokens[n:n + m] = part
            chunk_of[n:n + m] = c
            n += m
            c += 1
            if c % 50 == 0:
                progress(f"collected {n} tokens ({n / (time.time() - t0):.0f}/s)")
        if n >= max_tokens - 8:
            break
    model.clear()
    return Corpus(tokens[:n], hidden[:n], chunk_of[:n])


_DEF = re.compile(r"^\s*(async\s+)?def \w+\(.*\).*:\s*$")


def function_prompts(texts: Iterable[str], context_lines: int = 30) -> Iterator[str]:
    """Completion prompts from code: a function's signature and docstring with the lines before
    it, cut where the body starts (what a code assistant is asked to write; HumanEval's shape,
    drawn from the user's own code)."""
    for text in texts:
        lines = text.split("\n")
        for i, line in enumerate(lines[:-1]):
            if not _DEF.match(line):
                continue
            doc = lines[i + 1].strip()
            quote = doc[:3]
            if quote not in ('"""', "'''"):
                continue
            end = i + 1
            if not (len(doc) > 3 and doc.endswith(quote) and len(doc) >= 6):
                end = next((j for j in range(i + 2, min(len(lines), i + 40)) if quote in lines[j]), -1)
            if end < 0:
                continue
            yield "\n".join(lines[max(0, i - context_lines):end + 1]) + "\n"


def generate_corpus(model, prompts: Iterable[str], max_tokens: int, gen_tokens: int = 128,
                    prompt_tokens: int = 384, progress: Callable[[str], None] = lambda s: None,
                    out_all: np.ndarray | None = None) -> Corpus:
    """The target's own greedy continuations of `prompts`, `model.n_seq_max` at a time in one
    batch per step (a LlamaModel opened with hidden=True): per token fed, the hidden state after
    it. A head trained on these sees what it will draft from: the target's own text. `out_all`:
    the target's output matrix (`target_tables`), when the caller has it dequantised already."""
    if not model.hidden:
        raise ValueError("generate_corpus() needs the target opened with hidden=True")
    import torch

    from .drafters.head import target_tables

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if out_all is None:
        _, out_all, _ = target_tables(model.path, None)
    out_t = torch.from_numpy(out_all).to(dev)                                # [V, d] f32
    del out_all
    width, d = model.n_seq_max, model.n_embd
    tokens = np.zeros(max_tokens, np.int32)
    hidden = np.zeros((max_tokens, d), np.float16)
    chunk_of = np.zeros(max_tokens, np.int32)
    n = c = 0
    t0 = time.time()
    source = iter(prompts)
    state = np.zeros((width, d), np.float32)
    while n < max_tokens:
        group = []
        for text in source:
            ids = model.tokenize(text, special=False, add_bos=False)[-prompt_tokens:]
            if len(ids) >= 8:
                group.append(ids)
            if len(group) == width:
                break
        if not group:
            break
        model.clear()
        for seq, ids in enumerate(group):
            model.prefill(ids[:-1], 0, seq=seq)
        cur = [ids[-1] for ids in group]
        pos = [len(ids) - 1 for ids in group]
        fed = [[] for _ in group]
        states = [[] for _ in group]
        alive = [True] * len(group)
        for _ in range(gen_tokens):
            model.decode(cur, np.asarray(pos, np.int32), [(s,) for s in range(len(group))], logits=True)
            for r in range(len(group)):
                state[r] = model.hidden_row(r)
            nxt = (torch.from_numpy(state[:len(group)]).to(dev) @ out_t.T).argmax(-1).tolist()
            for r in range(len(group)):
                if alive[r]:
                    fed[r].append(cur[r])
                    states[r].append(state[r].astype(np.float16))
                    alive[r] = not model.is_eog(nxt[r])
            cur = nxt
            pos = [p + 1 for p in pos]
            if not any(alive) or sum(pos) + 2 * len(group) >= model.n_ctx:   # the shared cache is full
                break
        for r in range(len(group)):
            m = min(len(fed[r]), max_tokens - n)
            if m < 2:
                continue
            tokens[n:n + m] = fed[r][:m]
            hidden[n:n + m] = np.stack(states[r][:m])
            chunk_of[n:n + m] = c
            n += m
            c += 1
        progress(f"generated {n} tokens ({n / (time.time() - t0):.0f}/s)")
    model.clear()
    return Corpus(tokens[:n], hidden[:n], chunk_of[:n])


def join(*corpora: Corpus) -> Corpus:
    """One corpus of several (chunk ids kept apart)."""
    base, parts = 0, []
    for cp in corpora:
        parts.append(cp.chunk + base)
        base += int(cp.chunk.max()) + 1 if cp.chunk.size else 0
    return Corpus(np.concatenate([cp.tokens for cp in corpora]), np.concatenate([cp.hidden for cp in corpora]),
                  np.concatenate(parts))


def train(corpus: Corpus, target_gguf: Path, out: Path, *, vocab_size: int = 32768,
          steps: int = 3000, batch: int = 1024, unroll: int = 4, lr: float = 1e-3,
          feature_weight: float = 0.1, device: str | None = None, seed: int = 0,
          progress: Callable[[str], None] = lambda s: None, meta: dict | None = None,
          tables: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> dict:
    """Train a head on `corpus` and write it to `out`; what training measured (how often the
    head's top guess is the target's choice on held-out chunks, per unrolled step). `tables`:
    `target_tables(target_gguf, None)`, when the caller has them dequantised already."""
    import torch
    import torch.nn.functional as F

    from localspec.models.head_file import save_head

    from .drafters.head import HeadNet, target_tables

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    n, d = corpus.hidden.shape
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    emb, out_all, norm = tables if tables is not None else target_tables(target_gguf, None)
    full_vocab = emb.shape[0]
    H = torch.from_numpy(corpus.hidden).to(dev)                              # [N, d] f16
    with torch.no_grad():   # the target's choice after each token: its output matrix on its state
        out_all_t = torch.from_numpy(out_all).to(dev)                        # f32: near-ties hold
        label = torch.cat([(H[a:a + 4096].float() @ out_all_t.T).argmax(-1)
                           for a in range(0, n, 4096)]).cpu().numpy()
        del out_all_t
    # the draft vocabulary: the target's most frequent choices (ascending ids)
    counts = np.bincount(label, minlength=full_vocab)
    k = min(vocab_size, int((counts > 0).sum()))
    vocab = np.sort(np.argsort(-counts, kind="stable")[:k]).astype(np.int64)
    out_rows = out_all[vocab]
    del out_all
    sub = np.full(full_vocab, -100, np.int64)                  # target id -> draft index (or ignore)
    sub[vocab] = np.arange(k)
    # starts s: state h[s-1], then tokens s..s+unroll-1, all inside one chunk
    ok = np.zeros(n, bool)
    if n > unroll:
        ok[1:n - unroll + 1] = corpus.chunk[:n - unroll] == corpus.chunk[unroll:]
    starts = np.flatnonzero(ok)
    if starts.size < 16:
        raise ValueError(f"too little text to train on: {n} tokens")
    # held out: whole chunks (every 50th), so the accuracy it reports is on text never trained on
    chunks = np.unique(corpus.chunk)
    out_chunks = chunks[torch.randperm(chunks.size, generator=gen).numpy()[:max(1, chunks.size // 50)]]
    is_held = np.isin(corpus.chunk[starts], out_chunks)
    held, starts = starts[is_held], starts[~is_held]
    if held.size < 8 or starts.size < 16:
        raise ValueError(f"too little text to train on and check: {n} tokens in {chunks.size} chunks")

    X = torch.from_numpy(corpus.tokens.astype(np.int64)).to(dev)             # [N]
    Y = torch.from_numpy(sub[label]).to(dev)                          # [N] draft index
    E = torch.from_numpy(emb).to(dev, dtype)                                 # [V, d]
    out_w = torch.from_numpy(out_rows).to(dev, dtype)                        # [V_sub, d]
    net = HeadNet(d).to(dev)
    with torch.no_grad():
        net.norm.copy_(torch.from_numpy(norm))
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, i / steps))))
    starts_t = torch.from_numpy(starts).to(dev)

    def unrolled(s: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        f = H[s - 1].to(dtype)
        states, logits = [], []
        for j in range(unroll):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                f = net(f, E[X[s + j]])
                states.append(f)
                logits.append((f.to(dtype) @ out_w.T).float())
        return states, logits

    t0 = time.time()
    for step in range(steps):
        s = starts_t[torch.randint(0, starts_t.numel(), (batch,), device=dev)]
        states, logits = unrolled(s)
        loss = 0.0
        for j in range(unroll):
            y = Y[s + j]
            loss = loss + F.cross_entropy(logits[j], y, ignore_index=-100)
            loss = loss + feature_weight * F.smooth_l1_loss(states[j].float(), H[s + j].float())
        opt.zero_grad(set_to_none=True)
        (loss / unroll).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 200 == 0 or step == steps - 1:
            progress(f"step {step}/{steps} loss {float(loss.detach()) / unroll:.3f} ({time.time() - t0:.0f} s)")
    net.eval()
    with torch.no_grad():
        s = torch.from_numpy(held).to(dev)
        _, logits = unrolled(s)
        acc = []
        for j in range(unroll):   # the target's choice is the head's top guess
            acc.append(round(float((logits[j].argmax(-1) == Y[s + j]).float().mean()), 4))
    info = {"n_embd": d, "vocab_size": full_vocab, "draft_vocab": k, "tokens": int(n),
            "steps": steps, "unroll": unroll, "held_out_top1": acc, **(meta or {})}
    save_head(Path(out), net.arrays(), vocab, info)
    return info
