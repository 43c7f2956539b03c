"""The tiny real models (tests/tiny_models.py) that end-to-end tests stand on: are they sound?

The `tiny` fixture (conftest.py) builds them once: about 45 s on one CPU core, then cached
under .cache/tiny-models/.  Run with `-s` to see the measured numbers (logit differences,
greedy margins, draft/target agreement).
"""
from __future__ import annotations

import json
import multiprocessing
import random
import time
import unicodedata
from pathlib import Path

import numpy as np
import pytest

import tiny_models
from tiny_models import (
    EOS_TOKEN,
    IM_END,
    IM_START,
    OTHER_VOCAB_SIZE,
    TOKENIZER_PROBES,
    VOCAB_SIZE,
    TinyModels,
    build_corpus,
    build_tiny_models,
    cache_key,
    compare_logits,
    compare_tokenization,
    held_out_corpus,
    llama_logits,
    load_llama,
    load_torch,
    torch_logits,
)

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")

NAMES = ("target", "draft", "other-vocab")


def _paths(tiny: TinyModels, name: str) -> tuple[Path, Path]:
    return {
        "target": (tiny.target_gguf, tiny.target_torch),
        "draft": (tiny.draft_gguf, tiny.draft_torch),
        "other-vocab": (tiny.other_vocab_gguf, tiny.other_vocab_torch),
    }[name]


@pytest.fixture(scope="module")
def torch_pair(tiny):
    """(target model, draft model, shared tokenizer), loaded through the Auto* classes."""
    target, tokenizer = load_torch(tiny.target_torch)
    draft, _ = load_torch(tiny.draft_torch)
    return target, draft, tokenizer


def _held_out_ids(tokenizer, n_docs: int = 40) -> list[int]:
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    ids: list[int] = []
    for doc in held_out_corpus(n_docs):
        ids += tokenizer(doc, add_special_tokens=False)["input_ids"] + [eos]
    return ids


def _chat_prompt(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------------------
# Files, metadata, vocabularies
# ------------------------------------------------------------------------------------------

def test_layout(tiny):
    assert tiny.vocab_size == VOCAB_SIZE
    for name in NAMES:
        gguf_path, folder = _paths(tiny, name)
        assert gguf_path.is_file() and gguf_path.suffix == ".gguf"
        for file in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
            assert (folder / file).is_file(), folder / file
    assert tiny.target_gguf.parent.name == cache_key()


@pytest.mark.parametrize("name", NAMES)
def test_gguf_metadata_and_tensors(tiny, name):
    import gguf

    gguf_path, folder = _paths(tiny, name)
    config = json.loads((folder / "config.json").read_text())
    reader = gguf.GGUFReader(gguf_path)
    meta = {key: field.contents() for key, field in reader.fields.items()}
    tokens = meta["tokenizer.ggml.tokens"]
    expected = {
        "general.architecture": "qwen2",
        "general.file_type": int(gguf.LlamaFileType.ALL_F32),
        "qwen2.context_length": config["max_position_embeddings"],
        "qwen2.embedding_length": config["hidden_size"],
        "qwen2.block_count": config["num_hidden_layers"],
        "qwen2.feed_forward_length": config["intermediate_size"],
        "qwen2.attention.head_count": config["num_attention_heads"],
        "qwen2.attention.head_count_kv": config["num_key_value_heads"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.eos_token_id": tokens.index(EOS_TOKEN),
        "tokenizer.ggml.eot_token_id": tokens.index(IM_END),
    }
    assert {key: meta[key] for key in expected} == expected
    assert meta["qwen2.rope.freq_base"] == pytest.approx(10000.0)
    assert meta["qwen2.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert config["max_position_embeddings"] >= 2048
    assert "add_generation_prompt" in meta["tokenizer.chat_template"]

    types = meta["tokenizer.ggml.token_type"]
    specials = {tokens.index(t) for t in (EOS_TOKEN, IM_START, IM_END)}
    assert [i for i, t in enumerate(types) if t == int(gguf.TokenType.CONTROL)] == sorted(specials)
    assert all(t == int(gguf.TokenType.NORMAL) for i, t in enumerate(types) if i not in specials)

    per_layer = ["attn_norm.weight", "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias",
                 "attn_v.weight", "attn_v.bias", "attn_output.weight", "ffn_norm.weight",
                 "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
    names = {f"blk.{i}.{t}" for i in range(config["num_hidden_layers"]) for t in per_layer}
    names |= {"token_embd.weight", "output_norm.weight", "output.weight"}
    assert {t.name for t in reader.tensors} == names
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert embd.data.shape == (len(tokens), config["hidden_size"])


def test_vocab_sizes_match_for_the_pair_and_differ_for_other_vocab(tiny):
    sizes = {}
    for name in NAMES:
        gguf_path, folder = _paths(tiny, name)
        llm = load_llama(gguf_path)
        try:
            sizes[name] = llm.n_vocab()
        finally:
            llm.close()
        assert json.loads((folder / "config.json").read_text())["vocab_size"] == sizes[name]
    assert sizes == {"target": VOCAB_SIZE, "draft": VOCAB_SIZE, "other-vocab": OTHER_VOCAB_SIZE}
    # Same vocabulary, not merely the same size.
    same = [(getattr(tiny, f"{m}_torch") / "tokenizer.json").read_bytes() for m in ("target", "draft")]
    assert same[0] == same[1]


@pytest.mark.parametrize("name", NAMES)
def test_special_tokens_in_llama_cpp(tiny, name):
    gguf_path, folder = _paths(tiny, name)
    _, tokenizer = load_torch(folder)
    eos, im_start, im_end = tokenizer.convert_tokens_to_ids([EOS_TOKEN, IM_START, IM_END])
    llm = load_llama(gguf_path)
    try:
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        assert llama_cpp.llama_vocab_eos(vocab) == eos
        assert llama_cpp.llama_vocab_eot(vocab) == im_end
        assert not llama_cpp.llama_vocab_get_add_bos(vocab)
        eog = [t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)]
        assert eog == sorted([eos, im_end])
        assert all(llama_cpp.llama_vocab_is_control(vocab, t) for t in (eos, im_start, im_end))
        assert llm.tokenize(f"{IM_START}user\n".encode(), add_bos=False, special=True)[0] == im_start
    finally:
        llm.close()


# ------------------------------------------------------------------------------------------
# llama.cpp against PyTorch
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_llama_cpp_logits_match_pytorch(tiny, name):
    gguf_path, folder = _paths(tiny, name)
    model, tokenizer = load_torch(folder)
    ids = _held_out_ids(tokenizer, n_docs=12)[:256]
    # compare_logits raises on a tolerance breach or on any argmax difference.
    f16 = compare_logits(gguf_path, model, ids)
    f32 = compare_logits(gguf_path, model, ids, f32_kv_cache=True)
    print(f"\n{name}: {len(ids)} positions, max|llama.cpp - torch| = {f16:.2e} (F16 KV cache), "
          f"{f32:.2e} (F32 KV cache)")
    assert f32 < 1e-4


def test_llama_cpp_logits_do_not_depend_on_batch_size(tiny, torch_pair):
    ids = _held_out_ids(torch_pair[2], n_docs=4)[:96]
    whole = llama_logits(tiny.target_gguf, ids)
    llm = llama_cpp.Llama(str(tiny.target_gguf), n_ctx=512, n_batch=1, n_ubatch=1,
                          logits_all=True, verbose=False)
    try:
        llm.eval(ids)
        one_by_one = np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()
    assert (whole.argmax(-1) == one_by_one.argmax(-1)).all()
    assert np.abs(whole - one_by_one).max() < 1e-3


def _llama_greedy(gguf_path: Path, prompt: list[int], max_tokens: int = 64):
    """Greedy reply decoded one token per llama_decode, up to and including an EOG token;
    also the top-1 minus top-2 logit margin at every step."""
    llm = load_llama(gguf_path)
    try:
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        reply, margins = [], []
        llm.eval(prompt)
        for _ in range(max_tokens):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            top2 = np.sort(row)[-2:]
            margins.append(float(top2[1] - top2[0]))
            reply.append(int(row.argmax()))
            if llama_cpp.llama_vocab_is_eog(vocab, reply[-1]):
                break
            llm.eval([reply[-1]])
        return reply, margins
    finally:
        llm.close()


def test_greedy_chat_reply_matches_transformers_and_ends_with_im_end(tiny, torch_pair):
    target, _, tokenizer = torch_pair
    prompt = _chat_prompt(tokenizer, "Say hello to Bob.")
    reply, margins = _llama_greedy(tiny.target_gguf, prompt)
    with torch.no_grad():
        out = target.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)
    assert out[0, len(prompt):].tolist() == reply
    assert reply[-1] == tokenizer.convert_tokens_to_ids(IM_END)
    print(f"\ngreedy reply {tokenizer.decode(reply)!r}, smallest top-1/top-2 margin {min(margins):.3f}")


CHAT_QUESTIONS = ("Say hello to Bob.", "Write a function that adds 2 to a number.",
                  "What is the capital of Japan?", "Count to 5.", "Translate hello to Greek.")


@pytest.mark.parametrize("question", CHAT_QUESTIONS)
def test_greedy_path_survives_batched_verification(tiny, torch_pair, question):
    """What speculative decoding relies on: re-scoring the greedy path in one batch picks the
    same tokens.  llama.cpp's single-token path differs from its batched one by ~1e-3 (F16 KV
    cache), so the target must be confident along its greedy paths."""
    tokenizer = torch_pair[2]
    prompt = _chat_prompt(tokenizer, question)
    reply, margins = _llama_greedy(tiny.target_gguf, prompt)
    batched = llama_logits(tiny.target_gguf, prompt + reply)
    assert batched[len(prompt) - 1:-1].argmax(-1).tolist() == reply
    assert reply[-1] == tokenizer.convert_tokens_to_ids(IM_END)
    print(f"\n{question!r} -> {tokenizer.decode(reply)!r}: smallest margin {min(margins):.3f}")
    assert min(margins) > 0.01


# ------------------------------------------------------------------------------------------
# Tokenization
# ------------------------------------------------------------------------------------------

def _random_texts(n: int, seed: int = 0) -> list[str]:
    """Seeded NFC strings over ASCII, Latin, Greek, Cyrillic, CJK, emoji, controls, combiners."""
    ranges = [(0x20, 0x7E), (0x00, 0x1F), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF),
              (0x400, 0x4FF), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xACFF),
              (0x2000, 0x206F), (0x1F300, 0x1F64F)]
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        chars = (chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 16)))
        texts.append(unicodedata.normalize("NFC", "".join(chars)))
    return texts


@pytest.mark.parametrize("name", NAMES)
def test_tokenizers_agree_and_round_trip(tiny, name):
    gguf_path, folder = _paths(tiny, name)
    texts = list(TOKENIZER_PROBES) + held_out_corpus(5) + _random_texts(300)
    compare_tokenization(gguf_path, folder, texts)  # raises with the offending text


def test_chat_template_is_the_same_in_gguf_and_transformers(tiny, torch_pair):
    import jinja2

    _, _, tokenizer = torch_pair
    llm = load_llama(tiny.target_gguf)
    try:
        template = llm.metadata["tokenizer.chat_template"]
    finally:
        llm.close()
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Count to 3."}]
    for gen in (False, True):
        ours = jinja2.Template(template).render(messages=messages, add_generation_prompt=gen)
        theirs = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        assert ours == theirs
    assert ours.endswith(f"{IM_END}\n{IM_START}assistant\n")


# ------------------------------------------------------------------------------------------
# Draft against target
# ------------------------------------------------------------------------------------------

def test_draft_agrees_with_target_on_a_decent_fraction(torch_pair):
    target, draft, tokenizer = torch_pair
    ids = _held_out_ids(tokenizer)
    agree = total = 0
    for start in range(0, len(ids) - 1, 256):
        window = ids[start:start + 256]
        t = torch_logits(target, window).argmax(-1)
        d = torch_logits(draft, window).argmax(-1)
        agree += int((t == d).sum())
        total += len(window)
    fraction = agree / total
    print(f"\ndraft/target greedy agreement on {total} held-out positions: {fraction:.1%}")
    assert 0.5 <= fraction <= 0.98


# ------------------------------------------------------------------------------------------
# Cache and builder
# ------------------------------------------------------------------------------------------

def test_corpus_is_deterministic_and_has_both_genres():
    a, b = build_corpus(n_docs=200), build_corpus(n_docs=200)
    assert a == b
    assert any(doc.startswith("def ") for doc in a)
    assert any(doc.startswith(f"{IM_START}user\n") and f"{IM_START}assistant\n" in doc for doc in a)
    assert held_out_corpus(5) != a[:5]


def test_cache_hit_is_fast_and_returns_the_same_models(tiny):
    t0 = time.perf_counter()
    again = build_tiny_models()
    assert time.perf_counter() - t0 < 2.0
    assert again == tiny
    manifest = json.loads((tiny.target_gguf.parent / "manifest.json").read_text())
    assert manifest["key"] == cache_key()


def _fake_build_into(folder: Path) -> dict:
    """Stands in for the minute-long build in the race test: slow enough to overlap."""
    time.sleep(0.5)
    for rel in tiny_models._LAYOUT.values():
        (folder / rel).mkdir() if "." not in rel else (folder / rel).write_bytes(b"")
    with open(folder.parent / "builds.log", "a") as log:
        log.write(f"{folder.name}\n")
    return {"key": cache_key()}


def _race(root: str, results) -> None:
    tiny_models._build_into = _fake_build_into  # forked child: patch only our own copy
    results.put(str(build_tiny_models(Path(root)).target_gguf))


def test_concurrent_builders_build_once_and_atomically(tmp_path):
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), results)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    paths = {results.get(timeout=5) for _ in procs}
    assert paths == {str(tmp_path / cache_key() / "target.gguf")}
    assert len((tmp_path / "builds.log").read_text().splitlines()) == 1
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in (cache_key(), "builds.log")
                 and not p.name.endswith(".lock")]
    assert leftovers == []
