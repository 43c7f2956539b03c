"""Train a draft head (engine/drafters/head.py) for a GGUF target, from text on this machine.

1. `collect`: the target reads the text in chunks (llama.cpp, on the GPU where there is one) and
   hands back, per token, its final hidden state. The labels are the target's own next-token
   choices (greedy, its output matrix applied to those states on the training device): the head
   learns to predict what the target would say, not what the text says.
2. `generate_corpus`: the target's own greedy continuations of the functions in that text
   (signature and docstring): self-distillation, the text the head will draft from.
3. `train`: windows of the text, with every tree level the head drafts unrolled over them at once
   (from the target's states in the first pass, then from the head's own predictions, each pass
   seeing what a node at that depth sees), a loss on the target's choice at every level plus a
   small one pulling each predicted state to the target's. The draft vocabulary is the
   `vocab_size` tokens the target chose most often. Held out: whole files.

Nothing leaves the machine: the text is on it (the files the user names, their chat history,
the Python sources installed: app/head_sources.py); the head is written next to the models. Training wants a GPU; on a CPU it runs, slowly, at a small scale (the tests).
Each phase reports where it stands as `Progress` events, often (every chunk, generation step or
training step: a bar moves smoothly) and cheaply (no GPU sync between milestones); the app turns
them into a line on a terminal or into a log's lines (app/head_progress.py): the engine never
prints.
"""
from __future__ import annotations

import itertools
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Iterable, Iterator, Literal, Sequence

import numpy as np

from localspec.models.head_file import MAX_HEAD_BYTES

Phase = Literal["reading", "generating", "training"]


@dataclass(frozen=True)
class Progress:
    """Where head training stands. `milestone`: a point a log keeps a line for (every 50 chunks
    read, each batch of continuations, each held-out measurement); the events between only move
    a progress bar. `note`: something said once (resumed from a checkpoint, steps fitted to the
    time limit)."""
    phase: Phase
    done: int                  # tokens read or generated; training steps taken
    total: int                 # the phase's target: tokens to read or generate; steps
    rate: float = 0.0          # `done` per second in this phase so far
    loss: float | None = None  # training, at a milestone
    held_out_top1: tuple[float, ...] = ()   # training: the latest held-out measurement, by tree depth
    milestone: bool = False
    note: str = ""


ProgressFn = Callable[[Progress], None]


def _quiet(event: Progress) -> None:
    pass


@dataclass
class Corpus:
    tokens: np.ndarray     # [N] int32, the text's tokens
    hidden: np.ndarray     # [N, d * (1 + taps)] float16, the target's final hidden state after each
                           # token, then the input states of the layers the target was tapped at
    chunk: np.ndarray      # [N] int32, which chunk each token came from (states never cross)
    source: np.ndarray     # [N] int32, which file (the held-out split is by file)

    def last_layer(self, n_taps: int) -> Corpus:
        """This corpus, read at `n_taps` taps, as a corpus of the final states alone (what a head
        without taps trains on): a copy of their columns."""
        d = self.hidden.shape[1] // (1 + n_taps)
        return Corpus(self.tokens, np.ascontiguousarray(self.hidden[:, :d]), self.chunk, self.source)


# Folders below a root never read: caches, other environments' packages (a project's .venv holds
# a copy of site-packages, which is not the user's code), and hidden ones (.git, .venv, .tox).
SKIP_DIRS = frozenset({"__pycache__", "node_modules", "site-packages", "dist-packages"})


def text_files(roots: Iterable[str | Path], suffixes: Sequence[str] = (".py", ".md", ".txt", ".rst"),
               skip_dirs: Collection[str] = SKIP_DIRS) -> list[Path]:
    """The files with one of `suffixes` under each root (a root that is a file: itself), sorted
    per root; folders named in `skip_dirs`, or hidden, below a root are not entered."""
    out: list[Path] = []
    for root in roots:
        root = Path(root).expanduser()
        if root.is_file():
            out.append(root)
            continue
        found = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in skip_dirs and not d.startswith(".")]
            found += [Path(folder, f) for f in names if Path(f).suffix in suffixes]
        out += sorted(p for p in found if p.is_file())
    return out


def collect(model, texts: Iterable[tuple[int, str]], max_tokens: int, chunk: int = 512,
            progress: ProgressFn = _quiet) -> Corpus:
    """Run the target (a TrainingModel opened with hidden=True) over `texts` ((file id, text)
    pairs), `chunk` tokens at a time from an empty cache, until `max_tokens`."""
    if not model.hidden:
        raise ValueError("collect() needs the target opened with hidden=True")
    d = model.n_feature   # the final state, and the taps' layer inputs after it
    tokens = np.zeros(max_tokens, np.int32)
    hidden = np.zeros((max_tokens, d), np.float16)
    chunk_of = np.zeros(max_tokens, np.int32)
    source = np.zeros(max_tokens, np.int32)
    n = c = 0
    chunk = min(chunk, model.n_batch, model.n_ctx)
    t0 = time.time()
    for file_id, text in texts:
        ids = model.tokenize(text, special=False, add_bos=False)
        for a in range(0, len(ids) - 8, chunk):
            part = ids[a:a + chunk]
            m = min(len(part), max_tokens - n)
            if m < 8:
                break
            part = part[:m]
            model.clear()
            model.decode(part, np.arange(m, dtype=np.int32), logits=True)
            model.hidden_rows_to(hidden[n:n + m])
            tokens[n:n + m] = part
            chunk_of[n:n + m] = c
            source[n:n + m] = file_id
            n += m
            c += 1
            progress(Progress("reading", n, max_tokens, n / max(time.time() - t0, 1e-9), milestone=c % 50 == 0))
        if n >= max_tokens - 8:
            break
    model.clear()
    return Corpus(tokens[:n], hidden[:n], chunk_of[:n], source[:n])


_DEF = re.compile(r"^\s*(async\s+)?def \w+\(.*\).*:\s*$")


def function_prompts(texts: Iterable[tuple[int, str]], context_lines: int = 30) -> Iterator[tuple[int, str]]:
    """Completion prompts from code: a function's signature and docstring with the lines before
    it, cut where the body starts (what a code assistant is asked to write; HumanEval's shape,
    drawn from the user's own code), with the id of the file each came from."""
    for file_id, text in texts:
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
            yield file_id, "\n".join(lines[max(0, i - context_lines):end + 1]) + "\n"


def generate_corpus(model, prompts: Iterable[tuple[int, str]], max_tokens: int, gen_tokens: int = 128,
                    prompt_tokens: int = 384, progress: ProgressFn = _quiet,
                    seconds: float | None = None) -> Corpus:
    """The target's own greedy continuations of `prompts`, `model.n_seq_max` at a time in one
    batch per step (a TrainingModel opened with hidden=True and greedy_on_device=True: each step's
    next tokens are chosen where the model runs, and no row's logits are copied out): per token
    fed, the hidden state after it. A head trained on these sees what it will draft from: the
    target's own text. `seconds`: stop there with what is written (each continuation so far is
    whole text). The last event's note says where the time went: the prompts' prefill, the
    steps, the rest."""
    if not model.hidden:
        raise ValueError("generate_corpus() needs the target opened with hidden=True")
    width, d = model.n_seq_max, model.n_feature
    tokens = np.zeros(max_tokens, np.int32)
    hidden = np.zeros((max_tokens, d), np.float16)
    chunk_of = np.zeros(max_tokens, np.int32)
    source_of = np.zeros(max_tokens, np.int32)
    n = c = 0
    t0 = time.time()
    spent = {"prefill": 0.0, "steps": 0.0}
    out_of_time = False
    # a target that ends nearly every continuation at once would walk every prompt there is:
    # four times the prompts the tokens asked for fill, at most
    source = itertools.islice(prompts, max(width, 4 * max_tokens // max(gen_tokens, 1)))
    while n < max_tokens and not out_of_time:
        group, files = [], []
        for file_id, text in source:
            ids = model.tokenize(text, special=False, add_bos=False)[-prompt_tokens:]
            if len(ids) >= 8:
                group.append(ids)
                files.append(file_id)
            if len(group) == width:
                break
        if not group:
            break
        model.clear()
        t = time.perf_counter()
        model.prefill_many([ids[:-1] for ids in group])
        spent["prefill"] += time.perf_counter() - t
        g = len(group)
        cur = np.asarray([ids[-1] for ids in group], np.int32)
        pos = np.asarray([len(ids) - 1 for ids in group], np.int32)
        seqs = [(s,) for s in range(g)]
        fed = np.zeros((gen_tokens, g), np.int32)               # what each row was fed, step by step
        states = np.zeros((gen_tokens, g, d), np.float16)       # and the state after it
        length = np.zeros(g, np.int64)                          # steps a row was alive for
        alive = np.ones(g, bool)
        for step in range(gen_tokens):
            t = time.perf_counter()
            model.decode(cur, pos, seqs, logits=True)
            model.hidden_rows_to(states[step])
            nxt = model.sampled(range(g))
            spent["steps"] += time.perf_counter() - t
            fed[step] = cur
            length += alive
            alive &= ~np.fromiter(map(model.is_eog, nxt.tolist()), bool, g)
            cur = nxt
            pos += 1
            now = n + int(length.sum())
            progress(Progress("generating", min(now, max_tokens), max_tokens, now / max(time.time() - t0, 1e-9)))
            if not alive.any() or int(pos.sum()) + 2 * g >= model.n_ctx:   # the shared cache is full
                break
            if seconds is not None and time.time() - t0 >= seconds:
                out_of_time = True
                break
        for r in range(g):
            m = min(int(length[r]), max_tokens - n)
            if m < 2:
                continue
            tokens[n:n + m] = fed[:m, r]
            hidden[n:n + m] = states[:m, r]
            chunk_of[n:n + m] = c
            source_of[n:n + m] = files[r]
            n += m
            c += 1
        progress(Progress("generating", n, max_tokens, n / max(time.time() - t0, 1e-9), milestone=True))
    model.clear()
    total = time.time() - t0
    progress(Progress("generating", n, max_tokens, n / max(total, 1e-9), milestone=True, note=(
        f"{total:.0f} s generating: prompts {spent['prefill']:.1f} s, steps {spent['steps']:.1f} s, "
        f"the rest {total - spent['prefill'] - spent['steps']:.1f} s"
        + (" (stopped at the time limit)" if out_of_time else ""))))
    return Corpus(tokens[:n], hidden[:n], chunk_of[:n], source_of[:n])


def save_corpus(path: Path, corpus: Corpus, meta: dict) -> None:
    """Keep what the target read and wrote (its states included) for another training run on
    the same text: uncompressed, written to a temporary file renamed over `path`."""
    import json

    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, tokens=corpus.tokens, hidden=corpus.hidden, chunk=corpus.chunk, source=corpus.source,
                 meta=np.array(json.dumps(meta)))
    tmp.replace(path)


def load_corpus(path: Path, target_id: str) -> tuple[Corpus, dict]:
    """A corpus `save_corpus` wrote for the target whose fingerprint is `target_id`, and its meta."""
    import zipfile

    from localspec.models.own_files import Unreadable, open_regular, parse_json

    from .errors import LocalspecError

    fix = "Delete it (the next run reads the text again), or name another --corpus"
    try:
        with open_regular(path) as fh:       # a regular file only: it is read whole
            size = os.fstat(fh.fileno()).st_size
            if size > _memory_bytes():
                raise LocalspecError("Training corpus is bigger than this machine's memory",
                                     f"'{path}' is {size / 2**30:.1f} GiB, and it is loaded whole", fix)
            with np.load(fh, allow_pickle=False) as z:
                meta = parse_json(path, str(z["meta"]))
                corpus = Corpus(z["tokens"], z["hidden"], z["chunk"], z["source"])
        n = len(corpus.tokens)
        if not (len(corpus.hidden) == len(corpus.chunk) == len(corpus.source) == n) or corpus.hidden.ndim != 2:
            raise ValueError("its arrays disagree in length")
    except Unreadable as err:
        raise LocalspecError("Not a usable training corpus", str(err), fix) from None
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError) as err:
        raise LocalspecError("Not a usable training corpus", f"'{path}': {type(err).__name__}: {err}",
                             fix) from None
    if not isinstance(meta, dict) or meta.get("target_id") != target_id:
        raise LocalspecError("Training corpus of another target", f"'{path}' holds another model's states",
                             "Delete it, or name another --corpus for this model")
    return corpus, meta


def _memory_bytes() -> int:
    """This machine's physical memory: the most a corpus loaded whole could take."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def join(*corpora: Corpus) -> Corpus:
    """One corpus of several (chunk ids kept apart)."""
    base, parts = 0, []
    for cp in corpora:
        parts.append(cp.chunk + base)
        base += int(cp.chunk.max()) + 1 if cp.chunk.size else 0
    return Corpus(np.concatenate([cp.tokens for cp in corpora]), np.concatenate([cp.hidden for cp in corpora]),
                  np.concatenate(parts), np.concatenate([cp.source for cp in corpora]))


def _bf16_faster(d: int) -> bool:
    """Whether this CPU multiplies in bfloat16 faster than in float32, timed on a matmul of the
    head's size (CPUs with AMX or AVX-512 BF16 do, several times; others are slower in it)."""
    import torch

    x, w = torch.randn(512, d), torch.randn(d, 4 * d)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = x.to(dtype), w.to(dtype)
        a @ b
        t = time.perf_counter()
        for _ in range(3):
            a @ b
        best[dtype] = time.perf_counter() - t
    return best[torch.bfloat16] < 0.8 * best[torch.float32]


def _pass_masks(length: int, passes: int, device) -> list:
    """For each unrolled pass j (1-based), which keys of passes 1..j a query may see: [L, j*L].

    Pass 1 is the committed context (the target's true states): causal. Pass j >= 2 at position t
    is a tree node j-1 levels below the pair at t-j+1, so it sees pass 1 up to t-j+1 and, of pass
    i = 2..j, only position t-j+i: its own ancestors and itself, as when drafting."""
    import torch

    t = torch.arange(length, device=device)[:, None]
    p = torch.arange(length, device=device)[None, :]
    masks = []
    for j in range(1, passes + 1):
        blocks = [p <= t - j + 1] + [p == t - j + i for i in range(2, j + 1)]
        masks.append(torch.cat(blocks, dim=1))
    return masks


def held_out_split(source: np.ndarray, chunk: np.ndarray, gen) -> tuple[np.ndarray, int, str]:
    """Which corpus positions the held-out check reads ([N] bool), how many groups they are, and
    of what ("40 files", "3 chunks of one file"): whole files (one in 20, at least one, drawn by
    the torch.Generator `gen`), so the accuracy training reports is on text the head never saw,
    not on positions interleaved with training ones; from one file, its last chunks (one in 20,
    at least one). `source` and `chunk` [N]: each position's file and chunk."""
    import torch

    by_file = np.unique(source).size > 1
    group = source if by_file else chunk
    groups = np.unique(group)
    if by_file:
        held = groups[torch.randperm(groups.size, generator=gen).numpy()[:max(1, groups.size // 20)]]
    else:
        held = groups[-max(1, groups.size // 20):]
    return np.isin(group, held), held.size, f"{groups.size} {'files' if by_file else 'chunks of one file'}"



# A checkpoint holds the head's float32 weights and Adam's two moments: three times the float32
# head, six times the float16 file's arrays (models/head_file.MAX_HEAD_BYTES)
MAX_CHECKPOINT_BYTES = 6 * MAX_HEAD_BYTES


def _read_checkpoint(path: Path | None, dev, unusable: Callable[[str], None]) -> dict | None:
    """A training checkpoint's saved state, or None where there is none or it cannot be used
    (`unusable` is told why: it only saves steps, so training starts over)."""
    import pickle

    import torch

    from localspec.models.own_files import Unreadable, open_regular

    if path is None:
        return None
    try:
        with open_regular(path) as fh:       # a regular file of bounded size only
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_CHECKPOINT_BYTES:
                raise Unreadable(path, f"is {size / 2**30:.1f} GiB, more than a head's training state")
            saved = torch.load(fh, map_location=dev, weights_only=False)
        if not isinstance(saved, dict):
            raise ValueError("not a checkpoint of this trainer")
        return saved
    except FileNotFoundError:
        return None
    except Unreadable as err:
        unusable(err.why)
    except (OSError, RuntimeError, EOFError, ValueError, TypeError, pickle.UnpicklingError) as err:
        unusable(f"{type(err).__name__}: {err}")
    return None


def train(corpus: Corpus, target_gguf: Path, out: Path, *, vocab_size: int = 8192,
          steps: int = 3000, batch: int = 32, length: int = 256, passes: int = 3, lr: float = 1e-3,
          feature_weight: float = 0.1, ff: int | None = None, noise: float = 0.0, taps: Sequence[int] = (),
          device: str | None = None, seed: int = 0,
          progress: ProgressFn = _quiet, meta: dict | None = None,
          tables: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
          checkpoint: Path | None = None, checkpoint_every: int = 500, seconds: float | None = None) -> dict:
    """Train a head on `corpus` and write it to `out`; what training measured (how often the
    head's top guess is the target's choice on held-out files, per tree depth). `tables`:
    `target_tables(target_gguf, None)`, when the caller has them dequantised already.

    Each step takes `batch` windows of `length` pairs inside one chunk, and unrolls `passes`
    tree levels over them at once (a pass's input state is the previous pass's prediction, its
    attention what a node at that depth sees: `_pass_masks`): the loss is the target's choice at
    every level, plus a small pull of each predicted state to the target's. `checkpoint`: where
    the model and optimiser are saved every `checkpoint_every` steps and resumed from (the same
    corpus and settings only); removed when the head is written. `seconds`: a time limit for the
    steps, which lowers `steps` to what the first ones' speed says fits (the learning rate's
    schedule follows). `noise`: uniform noise of this fraction of the states' RMS added to the
    target's states the first level reads while training (EAGLE's regulariser: drafting reads
    predicted states, never the exact ones). `taps`: the target layers whose input states the
    corpus holds after each final state (the target was opened with them): the head learns to mix
    them into the states it reads (`HeadNet.fuse`)."""
    import torch
    import torch.nn.functional as F

    from localspec.models import heads
    from localspec.models.head_file import save_head

    from .drafters.head import target_tables
    from .drafters.head_net import HeadNet, HeadShape, attend

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    n, wide = corpus.hidden.shape
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    emb, out_all, norm = tables if tables is not None else target_tables(target_gguf, None)
    full_vocab, d = emb.shape
    if wide != d * (1 + len(taps)):
        raise ValueError(f"the corpus holds {wide} numbers a token; a target {d} wide read at "
                         f"{len(taps)} taps gives {d * (1 + len(taps))}")
    H = torch.from_numpy(corpus.hidden).to(dev)                              # [N, wide] f16
    with torch.no_grad():   # the target's choice after each token: its output matrix on its state
        out_all_t = torch.from_numpy(out_all).to(dev)                        # f32: near-ties hold
        label = torch.cat([(H[a:a + 4096, :d].float() @ out_all_t.T).argmax(-1)
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
    # windows: pairs s..s+L-1 need states and tokens s..s+L; a window runs past its chunk's end,
    # where its pairs are masked (never seen, never scored), so it may start anywhere with two
    # pairs left in the chunk (`length`: at most the longest chunk's)
    starts_all = np.flatnonzero(np.r_[True, corpus.chunk[1:] != corpus.chunk[:-1]])
    ends_all = np.r_[starts_all[1:], n]
    length = int(max(2, min(length, (ends_all - starts_all).max() - 1)))
    ok = np.zeros(n, bool)
    for a, b in zip(starts_all, ends_all):
        ok[a:b - 2] = True
    is_held, n_held, groups = held_out_split(corpus.source, corpus.chunk, gen)
    train_starts, held_starts = np.flatnonzero(ok & ~is_held), np.flatnonzero(ok & is_held)
    if train_starts.size < 16 or held_starts.size < 4:
        raise ValueError(f"too little text to train on and check: {n} tokens in {groups}")

    X = torch.from_numpy(corpus.tokens.astype(np.int64)).to(dev)             # [N]
    C = torch.from_numpy(corpus.chunk.astype(np.int64)).to(dev)              # [N]
    Y = torch.from_numpy(sub[label]).to(dev)                                 # [N] draft index
    E = torch.from_numpy(emb).to(dev, dtype)                                 # [V, d]
    out_w = torch.from_numpy(out_rows).to(dev, dtype)                        # [V_sub, d]
    shape = HeadShape.for_target(d, ff, tuple(taps))
    net = HeadNet(shape).to(dev)
    with torch.no_grad():
        net.norm.copy_(torch.from_numpy(norm))
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    plan = {"steps": steps}   # lowered once by `seconds`; the schedule reads it

    def lr_at(i: int) -> float:
        warm = max(1, plan["steps"] // 20)
        return min(1.0, (i + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, i / plan["steps"])))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    mixed = dev.type == "cuda" or _bf16_faster(d)   # bfloat16 matmuls, float32 weights and optimiser
    masks = _pass_masks(length, passes, dev)
    offs = torch.arange(length + 1, device=dev)
    weights = [0.8 ** j for j in range(passes)]   # deeper levels matter less: fewer rounds reach them

    rms = float(H[:min(n, 65536), :d].float().pow(2).mean().sqrt())

    def unrolled(s: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Per pass, logits [B, L, V_sub]; the windows' labels [B, L] and chunk ids [B, L+1]."""
        at = (s[:, None] + offs).clamp(max=n - 1)                            # [B, L+1]
        seg = C[at]
        same = seg[:, :, None] == seg[:, None, :length]                      # [B, L+1, L]
        pos = offs[:length].expand(len(s), -1)
        e = E[X[at[:, 1:]]]                                                  # [B, L, d] token after
        f = H[at[:, :-1]].to(dtype)                                          # [B, L, wide] true states
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=mixed):
            f = net.fuse(f).to(dtype)                                        # [B, L, d]
        if noise > 0 and net.training:
            f = f + (torch.rand_like(f, dtype=torch.float32) * 2 - 1).to(dtype) * (noise * rms)
        keys, vals, logits, states = [], [], [], []
        for j in range(passes):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=mixed):
                u = net.inputs(f, e)
                q, kk, vv = net.qkv(u, pos)
                keys.append(kk)
                vals.append(vv)
                # a key of another chunk is never seen (padded windows), on top of the tree mask
                seen = masks[j][None] & same[:, :length].repeat(1, 1, j + 1)
                nxt = net.finish(u, attend(q, torch.cat(keys, 1), torch.cat(vals, 1), seen))
                logits.append((nxt.to(dtype) @ out_w.T).float())
            f = torch.cat([f[:, :1], nxt[:, :-1].to(dtype)], dim=1)          # pass j+1 at t: from t-1
            states.append(nxt)
        return logits, states, at, seg

    def losses(s: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        logits, states, at, seg = unrolled(s)
        total, hits = 0.0, []
        t = offs[:length]
        for j in range(passes):
            # pass j (0-based) at t predicts the target's choice after token t+1, from the chain
            # started at t-j: all of it in the window's chunk
            valid = (seg[:, 1:] == seg[:, :1]) & (t >= j)[None]
            y = torch.where(valid, Y[at[:, 1:]], -100)
            total = total + weights[j] * F.cross_entropy(logits[j].flatten(0, 1), y.flatten(), ignore_index=-100)
            diff = F.smooth_l1_loss(states[j].float(), H[at[:, 1:], :d].float(), reduction="none").mean(-1)
            total = total + weights[j] * feature_weight * (diff * valid).sum() / valid.sum().clamp(min=1)
            # a choice outside the draft vocabulary is a miss: the head can never draft it
            hits.append(((logits[j].argmax(-1) == y) & (y >= 0)).sum() / valid.sum().clamp(min=1))
        return total, hits

    def held_out() -> list[float]:
        net.eval()
        with torch.no_grad():
            pick = torch.from_numpy(held_starts[np.linspace(0, held_starts.size - 1, min(256, held_starts.size))
                                                .astype(np.int64)]).to(dev)
            _, hits = losses(pick)
        net.train()
        return [round(float(h), 4) for h in hits]

    target_id = heads.target_id(target_gguf)
    settings = {"tokens": int(n), "steps": steps, "batch": batch, "length": length, "passes": passes,
                "draft_vocab": k, "shape": shape.to_json(), "seed": seed, "target_id": target_id,
                "noise": noise}
    first = 0
    saved = _read_checkpoint(checkpoint, dev, lambda why: progress(Progress(
        "training", first, steps, note=f"{checkpoint} cannot be resumed from ({why}): starting over")))
    if saved is not None:
        if saved.get("settings") == settings:
            net.load_state_dict(saved["net"])
            opt.load_state_dict(saved["opt"])
            sched.load_state_dict(saved["sched"])
            first = int(saved["step"])
            progress(Progress("training", first, steps, note=f"resumed at step {first} from {checkpoint}"))
        else:
            progress(Progress("training", first, steps,
                              note=f"{checkpoint} was made with other settings or text: starting over"))
    train_t = torch.from_numpy(train_starts).to(dev)
    t0 = t_start = time.time()
    acc: list[float] = []
    step = first
    while step < plan["steps"]:
        if step in (first + 10, first + 40) and dev.type == "cuda":
            torch.cuda.synchronize()   # the steps queued so far, done: the clock is true
        if step == first + 10:
            t_warm = time.time()   # the first steps compile and allocate: timed apart
        if seconds is not None and step == first + 40:   # the speed is known: fit the steps in
            rate = 30 / max(time.time() - t_warm, 1e-9)
            fit = step + int(rate * max(seconds - (time.time() - t_start), 0))
            if fit < plan["steps"]:
                plan["steps"] = max(step + 1, fit)
                progress(Progress("training", step, plan["steps"], rate, held_out_top1=tuple(acc),
                                  note=f"{plan['steps']} steps fit in {seconds:.0f} s ({rate:.1f} steps/s)"))
        steps = plan["steps"]
        s = train_t[torch.randint(0, train_t.numel(), (batch,), device=dev)]
        loss, _ = losses(s)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        step = done = step + 1
        rate = (done - first) / max(time.time() - t0, 1e-9)   # (no GPU sync here: the queue runs on)
        if done % checkpoint_every != 0 and done != steps and done != first + 100:   # (a first look early)
            progress(Progress("training", done, steps, rate, held_out_top1=tuple(acc)))
        else:
            acc = held_out()
            progress(Progress("training", done, steps, rate, float(loss.detach()), tuple(acc), milestone=True))
            if checkpoint is not None and done < steps and done % checkpoint_every == 0:
                tmp = checkpoint.with_name(checkpoint.name + ".tmp")
                torch.save({"settings": settings, "net": net.state_dict(), "opt": opt.state_dict(),
                            "sched": sched.state_dict(), "step": done}, tmp)
                tmp.replace(checkpoint)
    if not acc:
        acc = held_out()
    info = {"n_embd": d, "vocab_size": full_vocab, "draft_vocab": k, "tokens": int(n),
            "vocab_coverage": round(float(counts[vocab].sum() / max(1, counts.sum())), 4),
            "steps": plan["steps"], "passes": passes, "shape": shape.to_json(), "target_id": target_id,
            "noise": noise,
            "held_out": f"{n_held} of {groups}", "held_out_top1": acc, **(meta or {})}
    save_head(Path(out), net.arrays(), vocab, info)
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)
    return info
