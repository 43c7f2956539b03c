"""ms of a target's decode steps by KV cache type (f16 against q8_0), at growing contexts.

For each context length, every KV type's model holds the same context (source text of this
checkout, tokenized), then, alternated type by type so the machine's drift hits both: a one-row
decode step, a 16-row batch in one sequence (a verify's shape), and the prefill of 256 new tokens
(a conversation turn). Each is undone (cells trimmed) before the next. Prints medians and the
q8_0/f16 ratio; --json writes them. What chose the default KV type: docs/decisions/0046.

    python dev/kv_type_probe.py MODEL.gguf [--contexts 1024 4096 16384] [--reps 15]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from localspec.engine.llama_model import KV_TYPES, LlamaModel

ROOT = Path(__file__).resolve().parents[1]


def source_tokens(model: LlamaModel, n: int) -> list[int]:
    text = "\n".join(p.read_text() for p in sorted((ROOT / "engine").glob("*.py")))
    tokens = model.tokenize(text)
    while len(tokens) < n:
        tokens += tokens
    return tokens[:n]


def timed(fn) -> float:
    began = time.perf_counter()
    fn()
    return (time.perf_counter() - began) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    n_ctx = max(args.contexts) + 512
    models = {kv: LlamaModel(args.model, n_ctx=n_ctx, n_seq_max=1, n_threads=args.threads,
                             n_gpu_layers=args.gpu_layers, kv_type=kv) for kv in KV_TYPES}
    first = next(iter(models.values()))
    tokens = source_tokens(first, n_ctx)
    out: list[dict] = []
    for context in args.contexts:
        for model in models.values():
            model.clear()
            model.prefill(tokens[:context], 0)
        times = {kv: {"step": [], "rows16": [], "prefill256": []} for kv in models}
        for _ in range(args.reps):
            for kv, model in models.items():
                t = times[kv]
                row = np.asarray(tokens[context:context + 1], np.int32)
                t["step"].append(timed(lambda: model.decode(row, [context], logits=False)))
                model.trim(context)
                rows = np.asarray(tokens[context:context + 16], np.int32)
                pos = np.arange(context, context + 16, dtype=np.int32)
                t["rows16"].append(timed(lambda: model.decode(rows, pos, logits=True)))
                model.trim(context)
                t["prefill256"].append(timed(lambda: model.prefill(tokens[context:context + 256], context)))
                model.trim(context)
        for kv in models:
            med = {k: statistics.median(v) for k, v in times[kv].items()}
            out.append({"context": context, "kv_type": kv, **med})
            print(f"context {context:6d} {kv:5s}  step {med['step']:7.2f} ms  16 rows "
                  f"{med['rows16']:7.2f} ms  prefill 256 {med['prefill256']:8.1f} ms", flush=True)
        f16, q8 = out[-2], out[-1]
        print(f"context {context:6d} q8_0/f16  step {q8['step'] / f16['step']:.3f}  16 rows "
              f"{q8['rows16'] / f16['rows16']:.3f}  prefill {q8['prefill256'] / f16['prefill256']:.3f}",
              flush=True)
    for model in models.values():
        model.close()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
