"""Deterministic builder of tiny *real* models for fast end-to-end tests, cached on disk.

The engine's interesting bugs live where llama.cpp (the target) meets PyTorch (the draft):
token ids, logits layout, end-of-generation handling, chat templates, vocabulary checks.
Mock models cannot catch those, and the real benchmark pair is gigabytes.  So this module
trains, in under a minute on one CPU core, a pair of genuine Qwen2-architecture models that
share a byte-level BPE vocabulary, exports them to F32 GGUF with its own small exporter, and
keeps the same weights as transformers folders for cross-checks.

Why it is shaped so:

* The corpus is generated in code from a seeded ``random.Random``: no stdlib files (their
  text differs between Python versions), no network.  It is deliberately repetitive and its
  free choices are *geometrically* weighted (each option a third as likely as the one
  before), so the trained models are confident and their top-1 beats top-2 by a clear logit
  margin.  Tests compare greedy token identity; near-ties would let llama.cpp's batch-size
  dependent rounding (~1e-3 in logits with its default F16 KV cache) flip tokens.
* The tokenizer is byte-level BPE (all 256 bytes in the alphabet, so any UTF-8 round-trips)
  with exactly the pipeline of a real Qwen2 ``tokenizer.json``: NFC, the Qwen2 split regex,
  ByteLevel.  Not the GPT-2 regex: transformers 5 forces ``Qwen2Tokenizer`` on every
  ``model_type: qwen2`` folder and that class rebuilds the pipeline with the Qwen2 regex,
  whatever tokenizer.json says.  With the Qwen2 pipeline, tokenizer.json, ``AutoTokenizer``
  and llama.cpp (pre-tokenizer ``qwen2``, as in the real Qwen2.5 GGUFs) all agree.
* The draft is a smaller model trained briefly on the same corpus, so it agrees with the
  target often but not always: speculation has something to accept and something to reject.
* Training is single-threaded, seeded, and leaves torch's global RNG and thread count as it
  found them; on one machine, rebuilds are byte-identical.
* A build writes into a temporary folder, self-checks llama.cpp against PyTorch (logits,
  argmax, tokenization) and only then renames the folder into place, under a file lock.
  The cache key hashes this file and the library versions that shape the artifacts, so any
  change here rebuilds.

Use ``build_tiny_models()`` from tests; ``python -m tests.tiny_models`` builds and prints.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

SEED = 20240611
VOCAB_SIZE = 512
OTHER_VOCAB_SIZE = 300
EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END)
# The split regex of Qwen2's tokenizer.json; llama.cpp's pre-tokenizer "qwen2" implements it.
QWEN2_SPLIT_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
                     r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA_CPP_PRE_TOKENIZER = "qwen2"
CONTEXT_LENGTH = 2048
ROPE_THETA = 10000.0
RMS_EPS = 1e-6

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Self-check: max |llama.cpp - PyTorch| logits, with llama.cpp's default F16 KV cache and with an
# F32 one (then the whole computation is F32 and agreement is ~1e-5); argmax must match always.
LOGITS_TOLERANCE = 2e-2
LOGITS_TOLERANCE_F32_KV = 1e-3
SELF_CHECK_TOKENS = 128
TOKENIZER_PROBES = (
    "def add_3(x):\n    return x + 3\n",
    "for i in range(10):\n\tprint(i)  # tabs, spaces   and   runs\n\n\n",
    f"{IM_START}user\nTranslate hello to French.{IM_END}\n{IM_START}assistant\nBonjour !{IM_END}\n",
    "Grüß Gott, naïve café — こんにちは Привет Γειά σου 😀 ¡Hola!",
    "x1 = 12345678 + 0.5e-3; y's they're WE'LL I'D   \r\n trailing ",
    "  leading spaces\n\n    indented: [1, 2, 3]\t{'k': \"v\"}\n",
)


@dataclass(frozen=True)
class TinyModels:
    target_gguf: Path  # tiny Qwen2-architecture target, F32 GGUF, loads in llama.cpp
    draft_gguf: Path  # smaller Qwen2 draft, same vocabulary, F32 GGUF
    draft_torch: Path  # the draft as a transformers folder (AutoModelForCausalLM)
    target_torch: Path  # the target as a transformers folder (cross-checks)
    other_vocab_gguf: Path  # a tiny model with a different vocabulary size
    other_vocab_torch: Path  # the same, as a transformers folder
    vocab_size: int


@dataclass(frozen=True)
class ModelSpec:
    """Shape and training budget of one tiny model."""

    name: str
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    train_steps: int
    learning_rate: float = 3e-3
    batch_size: int = 16
    seq_len: int = 128


TARGET_SPEC = ModelSpec("target", VOCAB_SIZE, hidden=128, layers=4, heads=4, kv_heads=2,
                        intermediate=256, train_steps=200, learning_rate=5e-3)
DRAFT_SPEC = ModelSpec("draft", VOCAB_SIZE, hidden=64, layers=2, heads=4, kv_heads=2,
                       intermediate=128, train_steps=80)
# Trained too (2 s), though only its vocabulary matters: an untrained model's near-tied logits
# would make the argmax self-check flaky.
OTHER_SPEC = ModelSpec("other-vocab", OTHER_VOCAB_SIZE, hidden=32, layers=1, heads=2, kv_heads=1,
                       intermediate=64, train_steps=100, learning_rate=1e-2)


# --------------------------------------------------------------------------------------------
# Corpus: seeded, synthetic, repetitive.
# --------------------------------------------------------------------------------------------

_SKEW = 3.0  # each option is this much less likely than the one before: clear modes, no ties


class _Picker:
    """Seeded choices, geometrically weighted by `_SKEW` in the order the options are listed."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def pick(self, options):
        weights = [_SKEW ** -i for i in range(len(options))]
        u = self._rng.random() * sum(weights)
        for option, weight in zip(options, weights):
            u -= weight
            if u < 0:
                return option
        return options[-1]

    def chance(self, p: float) -> bool:
        return self._rng.random() < p


_NUMBERS = ("1", "2", "3", "10", "5", "4", "7", "100", "42", "9")
_COLLECTIONS = (("items", "item"), ("values", "value"), ("numbers", "number"), ("words", "word"),
                ("rows", "row"), ("names", "name"))
_CLASSES = (("Point", ("x", "y")), ("User", ("name", "age")), ("Color", ("red", "green", "blue")),
            ("Box", ("width", "height")), ("Node", ("value", "next")))
_PEOPLE = ("Alice", "Bob", "Carol", "Dave", "Erin", "Zoë", "José")
_CAPITALS = (("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"),
             ("Germany", "Berlin"), ("Egypt", "Cairo"))
_HELLOS = (("French", "Bonjour !"), ("Spanish", "¡Hola!"), ("German", "Grüß Gott!"),
           ("Japanese", "こんにちは!"), ("Russian", "Привет!"), ("Greek", "Γειά σου!"))
_SYSTEM_PROMPT = "You are a helpful assistant."


def _code_add(p: _Picker) -> str:
    n = p.pick(_NUMBERS)
    return f"def add_{n}(x):\n    return x + {n}\n"


def _code_total(p: _Picker) -> str:
    many, one = p.pick(_COLLECTIONS)
    return (f"def total({many}):\n    result = 0\n    for {one} in {many}:\n"
            f"        result += {one}\n    return result\n")


def _code_largest(p: _Picker) -> str:
    many, one = p.pick(_COLLECTIONS)
    return (f"def largest({many}):\n    best = {many}[0]\n    for {one} in {many}:\n"
            f"        if {one} > best:\n            best = {one}\n    return best\n")


def _code_divisible(p: _Picker) -> str:
    k = p.pick(("2", "3", "5", "7", "10"))
    return (f"def divisible_by_{k}(n):\n    if n % {k} == 0:\n        return True\n"
            f"    return False\n")


def _code_class(p: _Picker) -> str:
    name, fields = p.pick(_CLASSES)
    args = ", ".join(fields)
    body = "".join(f"        self.{f} = {f}\n" for f in fields)
    return f"class {name}:\n    def __init__(self, {args}):\n{body}"


def _code_loop(p: _Picker) -> str:
    n = p.pick(_NUMBERS)
    return f"for i in range({n}):\n    print(i)\n"


_CODE_SNIPPETS = (_code_add, _code_total, _code_divisible, _code_largest, _code_class, _code_loop)


def _python_document(p: _Picker) -> str:
    parts = [p.pick(_CODE_SNIPPETS)(p) for _ in range(p.pick((1, 2, 3)))]
    return "\n\n".join(parts)


def _exchange(p: _Picker) -> tuple[str, str]:
    kind = p.pick(("code", "hello", "capital", "translate", "count"))
    if kind == "code":
        n = p.pick(_NUMBERS)
        return (f"Write a function that adds {n} to a number.",
                f"Here you go:\n\n```python\ndef add_{n}(x):\n    return x + {n}\n```")
    if kind == "hello":
        name = p.pick(_PEOPLE)
        return f"Say hello to {name}.", f"Hello, {name}! How can I help you today?"
    if kind == "capital":
        country, city = p.pick(_CAPITALS)
        return f"What is the capital of {country}?", f"The capital of {country} is {city}."
    if kind == "translate":
        language, word = p.pick(_HELLOS)
        return f"Translate hello to {language}.", word
    n = int(p.pick(("3", "5", "4", "7", "2", "9")))
    return f"Count to {n}.", ", ".join(str(i) for i in range(1, n + 1)) + "."


def _chat_document(p: _Picker) -> str:
    turns = []
    if p.chance(0.3):
        turns.append(f"{IM_START}system\n{_SYSTEM_PROMPT}{IM_END}\n")
    for _ in range(p.pick((1, 2))):
        question, answer = _exchange(p)
        turns.append(f"{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n{answer}{IM_END}\n")
    return "".join(turns)


def build_corpus(seed: int = SEED, n_docs: int = 3000) -> list[str]:
    """`n_docs` synthetic documents: 3/4 Python-like code, 1/4 ChatML exchanges."""
    p = _Picker(seed)
    return [p.pick((_python_document, _chat_document))(p) for _ in range(n_docs)]


def held_out_corpus(n_docs: int = 40) -> list[str]:
    """Documents from the same distribution but a different seed, for agreement tests."""
    return build_corpus(seed=SEED + 1, n_docs=n_docs)


# --------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE with the Qwen2 pre-tokenizer.
# --------------------------------------------------------------------------------------------

def _strip_specials(docs: list[str]) -> list[str]:
    """Split documents on special tokens so BPE never learns merges across them."""
    pattern = "|".join(re.escape(t) for t in SPECIAL_TOKENS)
    return [piece for doc in docs for piece in re.split(pattern, doc) if piece]


def train_tokenizer(docs: list[str], vocab_size: int):
    """Byte-level BPE with the Qwen2 pipeline (what transformers' Qwen2Tokenizer rebuilds)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_strip_specials(docs), trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"BPE produced {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok


def _fast_tokenizer(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=CONTEXT_LENGTH,
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------------------------
# Models: Qwen2ForCausalLM, trained briefly on the packed corpus.
# --------------------------------------------------------------------------------------------

def _make_model(spec: ModelSpec, tok, seed: int):
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos, im_end = tok.token_to_id(EOS_TOKEN), tok.token_to_id(IM_END)
    config = Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=CONTEXT_LENGTH,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        rms_norm_eps=RMS_EPS,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, eos], pad_token_id=eos, bos_token_id=None, do_sample=False)
    return model


def _token_stream(docs: list[str], tok) -> tuple[np.ndarray, np.ndarray]:
    """All documents packed into one id stream, each ended by <|endoftext|>; plus doc starts."""
    eos = tok.token_to_id(EOS_TOKEN)
    ids, starts = [], []
    for enc in tok.encode_batch(docs):
        starts.append(len(ids))
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64), np.asarray(starts, dtype=np.int64)


def _train(model, spec: ModelSpec, stream: np.ndarray, starts: np.ndarray, seed: int) -> float:
    """AdamW with warmup + cosine decay on windows that begin at document starts."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(seed)
    usable = starts[starts + spec.seq_len + 1 <= len(stream)]
    data = torch.from_numpy(stream)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, betas=(0.9, 0.95),
                            weight_decay=0.0)
    warmup = max(1, spec.train_steps // 10)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, spec.train_steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(spec.train_steps):
        offsets = rng.choice(usable, size=spec.batch_size)
        batch = torch.stack([data[o:o + spec.seq_len + 1] for o in offsets])
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, spec.vocab_size), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    return loss.item()


# --------------------------------------------------------------------------------------------
# GGUF export: F32, arch "qwen2", byte-level BPE vocabulary (llama.cpp's tokenizer model "gpt2").
# --------------------------------------------------------------------------------------------

def _tokenizer_tables(tok) -> tuple[list[str], list[int], list[str]]:
    """Tokens (byte-level unicode strings, by id), token types, and merges from tokenizer.json."""
    from gguf import TokenType

    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = [""] * tok.get_vocab_size()
    for text, i in vocab.items():
        tokens[i] = text
    for added in spec["added_tokens"]:
        tokens[added["id"]] = added["content"]
    specials = {tok.token_to_id(t) for t in SPECIAL_TOKENS}
    types = [int(TokenType.CONTROL if i in specials else TokenType.NORMAL) for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, types, merges


def _gguf_tensors(model) -> dict[str, np.ndarray]:
    """HF Qwen2 parameter names -> llama.cpp tensor names.  NEOX rope: no q/k permutation."""
    sd = {k: v.detach().to("cpu").float().numpy() for k, v in model.state_dict().items()}
    out = {
        "token_embd.weight": sd["model.embed_tokens.weight"],
        "output_norm.weight": sd["model.norm.weight"],
        "output.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"]),
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for layer in range(model.config.num_hidden_layers):
        for hf, gg in per_layer.items():
            out[f"blk.{layer}.{gg}"] = sd[f"model.layers.{layer}.{hf}"]
    return {name: np.ascontiguousarray(t, dtype=np.float32) for name, t in out.items()}


def export_gguf(model, tok, path: Path, name: str) -> None:
    import gguf

    cfg = model.config
    tokens, types, merges = _tokenizer_tables(tok)
    w = gguf.GGUFWriter(str(path), arch="qwen2")
    w.add_name(f"localspec-tiny-{name}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(LLAMA_CPP_PRE_TOKENIZER)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.token_to_id(EOS_TOKEN))
    w.add_eos_token_id(tok.token_to_id(EOS_TOKEN))
    w.add_eot_token_id(tok.token_to_id(IM_END))
    w.add_pad_token_id(tok.token_to_id(EOS_TOKEN))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for tensor_name, data in _gguf_tensors(model).items():
        w.add_tensor(tensor_name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def save_torch_folder(model, tok, folder: Path) -> None:
    """config.json + model.safetensors + generation_config.json + tokenizer files."""
    model.save_pretrained(folder, safe_serialization=True)
    _fast_tokenizer(tok).save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))  # the exact trained tokenizer, whatever the wrapper


# --------------------------------------------------------------------------------------------
# Self-check: llama.cpp must reproduce PyTorch's logits and tokenization.
# --------------------------------------------------------------------------------------------

def load_llama(gguf_path: Path, n_ctx: int = 512, f32_kv_cache: bool = False):
    """A CPU llama-cpp-python model that keeps the logits of every evaluated position.

    llama.cpp's KV cache is F16 by default, which alone moves logits by ~1e-3; with an F32
    cache the F32 GGUF reproduces PyTorch to ~1e-5, which is what proves the exporter exact.
    No operation is offloaded either: a CUDA build otherwise runs a long batch's matmuls on the
    GPU even with every layer on the CPU, and its numerics moved the F32 check to 6e-3 (H200).
    """
    import llama_cpp

    kv = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if f32_kv_cache else {}
    return llama_cpp.Llama(str(gguf_path), n_ctx=n_ctx, n_gpu_layers=0, logits_all=True,
                           op_offload=False, verbose=False, **kv)


def load_torch(folder: Path):
    """(model, tokenizer) from a transformers folder, exactly as engine code would load them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def llama_logits(gguf_path: Path, ids: list[int], f32_kv_cache: bool = False) -> np.ndarray:
    llm = load_llama(gguf_path, n_ctx=max(512, len(ids)), f32_kv_cache=f32_kv_cache)
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


def torch_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float().numpy()


def compare_logits(gguf_path: Path, model, ids: list[int], f32_kv_cache: bool = False) -> float:
    """Max |llama.cpp - PyTorch| over all positions; raises if too large or any argmax differs."""
    ours, theirs = llama_logits(gguf_path, ids, f32_kv_cache), torch_logits(model, ids)
    if ours.shape != theirs.shape:
        raise AssertionError(f"{gguf_path.name}: logits shape {ours.shape} != {theirs.shape}")
    diff = float(np.abs(ours - theirs).max())
    flips = np.flatnonzero(ours.argmax(-1) != theirs.argmax(-1))
    tolerance = LOGITS_TOLERANCE_F32_KV if f32_kv_cache else LOGITS_TOLERANCE
    if diff > tolerance or flips.size:
        raise AssertionError(f"{gguf_path.name} (f32_kv_cache={f32_kv_cache}): llama.cpp vs "
                             f"PyTorch max|diff|={diff:.2e} (tolerance {tolerance:.0e}), "
                             f"argmax differs at positions {flips.tolist()}")
    return diff


def compare_tokenization(gguf_path: Path, folder: Path, texts=TOKENIZER_PROBES) -> None:
    """tokenizer.json, AutoTokenizer and llama.cpp give the same ids, and all decode back."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(folder)
    llm = load_llama(gguf_path)
    try:
        for text in texts:
            ids = {
                "tokenizer.json": raw.encode(text).ids,
                type(auto).__name__: auto(text, add_special_tokens=False)["input_ids"],
                "llama.cpp": llm.tokenize(text.encode("utf-8"), add_bos=False, special=True),
            }
            if len({tuple(v) for v in ids.values()}) != 1:
                raise AssertionError(f"{gguf_path.name}: tokenizers disagree on {text!r}: {ids}")
            decoded = {
                "tokenizer.json": raw.decode(ids["llama.cpp"], skip_special_tokens=False),
                "llama.cpp": llm.detokenize(ids["llama.cpp"], special=True).decode("utf-8"),
            }
            if any(d != text for d in decoded.values()):
                raise AssertionError(f"{gguf_path.name}: {text!r} does not round-trip: {decoded}")
    finally:
        llm.close()


def self_check(models: TinyModels) -> dict[str, dict[str, float]]:
    """Tokenization and logits of every GGUF against its transformers folder; raises on failure."""
    text = EOS_TOKEN.join(held_out_corpus(8))
    report = {}
    for name, gguf_path, folder in (("target", models.target_gguf, models.target_torch),
                                    ("draft", models.draft_gguf, models.draft_torch),
                                    ("other-vocab", models.other_vocab_gguf, models.other_vocab_torch)):
        compare_tokenization(gguf_path, folder)
        model, tokenizer = load_torch(folder)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:SELF_CHECK_TOKENS]
        report[name] = {
            "f16_kv_cache": compare_logits(gguf_path, model, ids),
            "f32_kv_cache": compare_logits(gguf_path, model, ids, f32_kv_cache=True),
        }
    return report


# --------------------------------------------------------------------------------------------
# Build + cache.
# --------------------------------------------------------------------------------------------

_MANIFEST = "manifest.json"  # written last: a folder with a manifest is complete
_LAYOUT = {
    "target_gguf": "target.gguf",
    "draft_gguf": "draft.gguf",
    "draft_torch": "draft",
    "target_torch": "target",
    "other_vocab_gguf": "other-vocab.gguf",
    "other_vocab_torch": "other-vocab",
}
_KEY_DISTRIBUTIONS = ("torch", "transformers", "tokenizers", "gguf", "llama_cpp_python", "numpy")


def cache_key() -> str:
    """Short hash of this file plus the versions of the libraries that shape or check the models."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256(Path(__file__).read_bytes())
    for dist in _KEY_DISTRIBUTIONS:
        try:
            h.update(f"{dist}={version(dist)};".encode())
        except PackageNotFoundError:
            h.update(f"{dist}=none;".encode())
    return h.hexdigest()[:12]


def default_cache_root() -> Path:
    return Path(__file__).resolve().parent.parent / ".cache" / "tiny-models"


def _models_at(folder: Path) -> TinyModels:
    return TinyModels(**{field: folder / rel for field, rel in _LAYOUT.items()},
                      vocab_size=VOCAB_SIZE)


def _log(msg: str) -> None:
    print(f"[tiny_models] {msg}", file=sys.stderr, flush=True)


@contextmanager
def _isolated_torch():
    """Single-threaded, quiet torch whose global RNG and thread count are restored afterwards.

    One thread: these matrices are too small to gain much from two, and torch's spinning
    OpenMP threads slow down ~6x when another process (a parallel pytest) shares the cores.
    """
    import torch
    from transformers.utils import logging as hf_logging

    threads, bars = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)
        if bars:
            hf_logging.enable_progress_bar()


def _build_into(folder: Path) -> dict:
    """Train, export and self-check every model into `folder`; return the manifest."""
    with _isolated_torch():
        return _build_models_into(folder)


def _build_models_into(folder: Path) -> dict:
    t0 = time.perf_counter()
    corpus = build_corpus()
    tokenizers = {VOCAB_SIZE: train_tokenizer(corpus, VOCAB_SIZE),
                  OTHER_VOCAB_SIZE: train_tokenizer(corpus, OTHER_VOCAB_SIZE)}
    streams = {size: _token_stream(corpus, tok) for size, tok in tokenizers.items()}
    _log(f"corpus: {len(corpus)} docs, {len(streams[VOCAB_SIZE][0])} tokens")

    losses = {}
    for seed, spec in enumerate((TARGET_SPEC, DRAFT_SPEC, OTHER_SPEC), start=SEED):
        t = time.perf_counter()
        tok = tokenizers[spec.vocab_size]
        model = _make_model(spec, tok, seed)
        losses[spec.name] = round(_train(model, spec, *streams[spec.vocab_size], seed=seed), 4)
        export_gguf(model, tok, folder / f"{spec.name}.gguf", spec.name)
        save_torch_folder(model, tok, folder / spec.name)
        _log(f"{spec.name}: final train loss {losses[spec.name]:.3f} ({time.perf_counter() - t:.1f}s)")

    diffs = self_check(_models_at(folder))
    _log(f"self-check passed; llama.cpp vs PyTorch logits max|diff|: {diffs}")
    return {"key": cache_key(), "vocab_size": VOCAB_SIZE, "other_vocab_size": OTHER_VOCAB_SIZE,
            "final_train_loss": losses, "logits_max_abs_diff": diffs,
            "build_seconds": round(time.perf_counter() - t0, 1)}


def build_tiny_models(cache_dir: Path | None = None) -> TinyModels:
    """Return the tiny models, building them (well under a minute of CPU) unless cached.

    They live in ``<cache_dir>/<cache_key()>``, ``cache_dir`` defaulting to
    ``<repo>/.cache/tiny-models``.  Concurrent builders serialise on a file lock, and the
    finished folder appears in one rename, so a reader never sees a half-built one.
    """
    from filelock import FileLock

    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    final = root / cache_key()
    if (final / _MANIFEST).is_file():
        return _models_at(final)
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"{final.name}.lock")):
        if not (final / _MANIFEST).is_file():  # nobody built it while we waited
            _build_atomically(final)
    return _models_at(final)


def _build_atomically(final: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-building-", dir=final.parent))
    t0 = time.perf_counter()
    try:
        _log(f"building into {final} ...")
        manifest = _build_into(tmp)
        (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it private
        try:
            os.rename(tmp, final)
        except OSError:  # a stale incomplete `final`, or a racer that bypassed the lock won
            if (final / _MANIFEST).is_file():
                return
            shutil.rmtree(final)
            os.rename(tmp, final)
        _log(f"built in {time.perf_counter() - t0:.1f}s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> None:
    """`python -m tests.tiny_models [CACHE_DIR]`: build (or find) the models, print the paths."""
    models = build_tiny_models(Path(argv[0]) if argv else None)
    for field, value in asdict(models).items():
        print(f"{field:18} {value}")


if __name__ == "__main__":
    main(sys.argv[1:])
