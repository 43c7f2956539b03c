"""A Qwen2.5-shaped GGUF with random weights, for timing a model size nobody here can download.

What a decode of n rows costs depends on the model's shape and its weights' types, not on what the
weights say: a file with the hidden size, layers, heads, KV heads and FFN size of a real Qwen2.5,
in Q4_K_M's types, times as the real model does, and its text is noise. Q4_K_M's types follow
llama.cpp's quantizer: Q4_K everywhere but the output (Q6_K), and attn_v and ffn_down in Q6_K on
the layers it gives more bits (the first and last eighth, and every third between). The tokenizer
is copied from a reference GGUF (every `tokenizer.*` field), so prompts tokenize as the real
family's do and the vocabulary, hence the embedding and the output matrix, has its real size.

`--types q5_k_m` writes Q5_K_M's types instead (Q5_K where Q4_K_M has Q4_K), and `--types q8_0`
Q8_0 in every matrix, as llama.cpp's quantizer does for those file types: the streaming kernels'
other types, timed on the same shapes.

The weights are random bytes with the block scales set: a Q4_K or Q5_K block's d and dmin, a Q6_K
block's d and a Q8_0 block's d are small fp16 values (Q6_K's int8 sub-block scales cut to
-16..15), so a weight's spread is ~0.02 and activations, attention scores and logits stay finite
through every layer.
Tensor data is written a slice at a time: a 32B file (~19 GB) never sits in memory.

Usage: python dev/synthetic_target.py --shape tiny|1.5b|7b|14b|32b OUT.gguf [--types q4_k_m|q5_k_m|q8_0]
[--tokenizer-from REF.gguf]
(default reference: the target tools/fetch-bench-models keeps); `--tokenizer-only OUT.gguf` writes
the reference's tokenizer alone, a few MB to carry to a GPU host instead of the reference. `--shape tiny` loads and decodes
on a CPU in seconds (tests/engine/test_synthetic_target.py).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.constants import GGML_QUANT_SIZES

Q4_K, Q5_K, Q6_K = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K
Q8_0, F32 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.F32
REFERENCE = Path.home() / ".cache/localspec-bench/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
# a weight's spread: d of a Q4_K block (its codes times 6-bit scales spread ~260 d, centred by
# dmin = 7.5 d) and of a Q6_K block (codes less 32 times scales of -16..15 spread ~170 d)
Q4_K_D, Q4_K_DMIN, Q6_K_D = 8e-5, 6e-4, 1.2e-4
# Q5_K's codes span 0..31, twice Q4_K's, so half its d keeps the spread and the same dmin the
# centre; a Q8_0 block's int8 codes spread ~74 d
Q5_K_D, Q5_K_DMIN, Q8_0_D = 4e-5, 6e-4, 2.5e-4
K_SCALES = {Q4_K: (Q4_K_D, Q4_K_DMIN), Q5_K: (Q5_K_D, Q5_K_DMIN)}   # a block's d and dmin
SLICE = 32 << 20    # bytes of tensor data generated at a time


@dataclass(frozen=True)
class Types:
    """A file type's tensor types: most matrices, the more-bits layers' attn_v and ffn_down, the
    output matrix."""
    base: GGMLQuantizationType
    wide: GGMLQuantizationType
    output: GGMLQuantizationType
    file_type: LlamaFileType


TYPES = {"q4_k_m": Types(Q4_K, Q6_K, Q6_K, LlamaFileType.MOSTLY_Q4_K_M),
         "q5_k_m": Types(Q5_K, Q6_K, Q6_K, LlamaFileType.MOSTLY_Q5_K_M),
         "q8_0": Types(Q8_0, Q8_0, Q8_0, LlamaFileType.MOSTLY_Q8_0)}


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int


# Qwen2.5's published configurations (hidden_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, intermediate_size); tiny: the smallest that K-quants allow (rows of 256),
# for tests. Every shape keeps an output matrix apart from the embedding, as the reference 1.5B's
# Q4_K_M file does although its model ties them: the 1.5B shape holds the reference's tensors,
# types and sizes, 14 of 28 layers' attn_v and ffn_down in Q6_K (on other layers than here)
SHAPES = {"tiny": Shape(256, 2, 4, 2, 512),
          "1.5b": Shape(1536, 28, 12, 2, 8960),
          "7b": Shape(3584, 28, 28, 4, 18944),
          "14b": Shape(5120, 48, 40, 8, 13824),
          "32b": Shape(5120, 64, 40, 8, 27648)}


def more_bits(layer: int, layers: int) -> bool:
    """The layers llama.cpp's Q4_K_M gives Q6_K in attn_v and ffn_down (its use_more_bits)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensors(shape: Shape, vocab: int, types: Types = TYPES["q4_k_m"]) -> list[tuple[str, GGMLQuantizationType, tuple[int, int]]]:
    """(name, type, (rows, row length)) of every tensor, in file order; a vector is one row."""
    h, kv = shape.hidden, shape.kv_heads * (shape.hidden // shape.heads)
    base = types.base
    out = [("token_embd.weight", base, (vocab, h))]
    for i in range(shape.layers):
        wide = types.wide if more_bits(i, shape.layers) else base
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", F32, (1, h)),
                (b + "attn_q.weight", base, (h, h)), (b + "attn_q.bias", F32, (1, h)),
                (b + "attn_k.weight", base, (kv, h)), (b + "attn_k.bias", F32, (1, kv)),
                (b + "attn_v.weight", wide, (kv, h)), (b + "attn_v.bias", F32, (1, kv)),
                (b + "attn_output.weight", base, (h, h)),
                (b + "ffn_norm.weight", F32, (1, h)),
                (b + "ffn_gate.weight", base, (shape.ffn, h)), (b + "ffn_up.weight", base, (shape.ffn, h)),
                (b + "ffn_down.weight", wide, (h, shape.ffn))]
    out += [("output_norm.weight", F32, (1, h)), ("output.weight", types.output, (vocab, h))]
    return out


def nbytes(kind: GGMLQuantizationType, rows: int, length: int) -> int:
    block, size = GGML_QUANT_SIZES[kind]
    return rows * length // block * size


def blocks(kind: GGMLQuantizationType, count: int, rng: np.random.Generator) -> bytes:
    """`count` blocks of random codes and scales with finite, small fp16 block scales."""
    size = GGML_QUANT_SIZES[kind][1]
    raw = np.frombuffer(rng.bytes(count * size), np.uint8).reshape(count, size).copy()
    if kind in K_SCALES:       # d, dmin, 12 bytes of 6-bit scales and mins, (32 bytes of fifth bits,) codes
        d, dmin = K_SCALES[kind]
        raw[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        raw[:, 2:4] = np.frombuffer(np.float16(dmin).tobytes(), np.uint8)
    elif kind == Q8_0:         # d, 32 int8 codes
        raw[:, 0:2] = np.frombuffer(np.float16(Q8_0_D).tobytes(), np.uint8)
    else:                      # Q6_K: 128 + 64 bytes of codes, 16 int8 scales, d
        raw[:, 192:208] = (raw[:, 192:208].view(np.int8) >> 3).view(np.uint8)
        raw[:, 208:210] = np.frombuffer(np.float16(Q6_K_D).tobytes(), np.uint8)
    return raw.tobytes()


def tokenizer_fields(reference: Path) -> list[tuple[str, object, GGUFValueType, GGUFValueType | None]]:
    """Every `tokenizer.*` field of a GGUF: (key, value, type, element type of an array)."""
    out = []
    for name, field in GGUFReader(reference).fields.items():
        if name.startswith("tokenizer."):
            sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
            out.append((name, field.contents(), field.types[0], sub))
    return out


def write_tokenizer(out: Path, reference: Path) -> None:
    """A GGUF of the reference's tokenizer alone (a few MB, no tensors): what a GPU host needs to
    write the targets there (`--tokenizer-from`) without the reference's weights."""
    w = GGUFWriter(str(out), arch="qwen2")
    for key, value, kind, sub in tokenizer_fields(reference):
        w.add_key_value(key, value, kind, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def write(shape_name: str, out: Path, reference: Path, seed: int = 0, types: str = "q4_k_m") -> None:
    shape = SHAPES[shape_name]
    fields = tokenizer_fields(reference)
    vocab = len(next(value for key, value, _, _ in fields if key == "tokenizer.ggml.tokens"))
    w = GGUFWriter(str(out), arch="qwen2")
    w.add_name(f"localspec synthetic Qwen2.5 {shape_name} {types} (random weights, timing only)")
    w.add_file_type(TYPES[types].file_type)
    w.add_context_length(32768)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    for key, value, kind, sub in fields:
        w.add_key_value(key, value, kind, sub_type=sub)
    plan = tensors(shape, vocab, TYPES[types])
    for name, kind, (rows, length) in plan:
        w.add_tensor_info(name, (rows, length) if rows > 1 else (length,), np.dtype(np.float32),
                          nbytes(kind, rows, length), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    rng = np.random.default_rng(seed)
    for name, kind, (rows, length) in plan:
        w.write_padding(fout, fout.tell())
        if kind == F32:      # norms' weights 1, biases 0
            fout.write(np.full(length, 1.0 if name.endswith("norm.weight") else 0.0, np.float32).tobytes())
            w.write_padding(fout, 4 * length)
            continue
        total = nbytes(kind, rows, length)
        size = GGML_QUANT_SIZES[kind][1]
        left = total // size
        while left:
            count = min(left, SLICE // size)
            fout.write(blocks(kind, count, rng))
            left -= count
        w.write_padding(fout, total)
    w.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES))
    parser.add_argument("--tokenizer-only", action="store_true",
                        help="write the tokenizer alone (no tensors), for --tokenizer-from elsewhere")
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer-from", type=Path, default=REFERENCE,
                        help="a GGUF whose tokenizer the file takes (default: the reference target)")
    parser.add_argument("--types", choices=list(TYPES), default="q4_k_m",
                        help="the file type's tensor types (default Q4_K_M's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.tokenizer_from.is_file():
        print(f"no tokenizer GGUF at {args.tokenizer_from}: run tools/fetch-bench-models, or name one "
              "with --tokenizer-from", file=sys.stderr)
        return 1
    if (args.shape is None) == (not args.tokenizer_only):
        parser.error("give --shape or --tokenizer-only")
    tmp = args.out.with_name(args.out.name + ".part")
    if args.tokenizer_only:
        write_tokenizer(tmp, args.tokenizer_from)
    else:
        write(args.shape, tmp, args.tokenizer_from, args.seed, args.types)
    os.replace(tmp, args.out)
    print(f"{args.out}: {args.out.stat().st_size / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
