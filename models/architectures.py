"""Which GGUF architectures localspec can generate text with, read from `general.architecture`
before a file is imported or loaded.

llama.cpp loads more than localspec can run: encoders that make embeddings (BERT and its kin),
an encoder-decoder (T5), image and audio parts, diffusion models, and recurrent models. Each would
be imported, listed as fitting, and fail (or crash) at its first run. localspec decodes one token
after another against a KV cache it rewinds after every draft and every turn, so it refuses:

* models with no decoder that predicts the next token (encoders, image and audio parts, drafts
  that need a target of their own);
* T5's encoder-decoder (generation starts from an encoded input, which localspec never makes);
* diffusion models (they fill whole blocks at once, not the next token);
* recurrent models (Mamba, RWKV): their state has no cells to rewind.

An architecture this llama.cpp does not know at all is refused too: ARCHITECTURES is its list
(LLM_ARCH_NAMES in llama.cpp's src/llama-arch.cpp, of the llama-cpp-python version that
packaging/build-llama-wheel.sh pins); update it with that pin.
"""
from __future__ import annotations

from localspec.models.errors import LocalspecError
from localspec.models.gguf_file import GGUFInfo

ARCHITECTURES = frozenset("""
clip llama llama4 deci falcon grok gpt2 gptj gptneox mpt baichuan starcoder refact bert modern-bert
nomic-bert nomic-bert-moe neo-bert jina-bert-v2 jina-bert-v3 eurobert bloom stablelm qwen qwen2
qwen2moe qwen2vl qwen3 qwen3moe qwen3next qwen3vl qwen3vlmoe qwen35 qwen35moe qwen4exp phi2 phi3
phimoe plamo plamo2 plamo3 codeshell orion internlm2 minicpm minicpm3 gemma gemma2 gemma3 gemma3n
gemma4 gemma4-assistant gemma-embedding starcoder2 mamba mamba2 maple jamba falcon-h1 xverse
command-r cohere2 cohere2moe dbrx olmo olmo2 olmoe muse-glimmer openelm arctic deepseek deepseek2
deepseek2-ocr deepseek32 deepseek4 chatglm glm4 glm4moe glm-dsa bitnet t5 t5encoder jais jais2
nemotron nemotron_h nemotron_h_moe exaone exaone4 exaone-moe rwkv6 rwkv6qwen2 rwkv7 arwkv7 granite
granitemoe granitehybrid graniteswitch granite_swa chameleon wavtokenizer-dec plm bailingmoe
bailingmoe2 bailingmoe3 dots1 dots3note arcee afmoe laguna ernie4_5 ernie4_5-moe hunyuan-moe
hunyuan-dense hunyuan_vl hy_v3 hy_v4 smollm3 gpt-oss lfm2 lfm2moe dream smallthinker llada
llada-moe seed_oss grovemoe apertus minimax-01 hrm_text minimax-m2 minimax-m3 cogvlm rnd1
pangu-embedded mistral3 eagle3 dflash mistral4 paddleocr mimo2 step35 spark2_5 llama-embed
maincoder kimi-linear kimi-k3 glm5-next talkie mellum
""".split())

_NO_NEXT_TOKEN = "makes embeddings or encodes input; it has no decoder that writes text"
REFUSED: dict[str, str] = {
    **{a: _NO_NEXT_TOKEN for a in ("bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert",
                                   "jina-bert-v2", "jina-bert-v3", "eurobert", "gemma-embedding",
                                   "t5encoder")},
    "clip": "is an image encoder (a vision model's part), not a text model",
    "wavtokenizer-dec": "is an audio decoder (a speech model's part), not a text model",
    **{a: "is a draft for another model (it needs that model's hidden states to run)"
       for a in ("eagle3", "dflash")},
    "t5": "is an encoder-decoder; localspec runs decoder-only models",
    **{a: "is a diffusion model (it fills blocks at once); localspec runs models that write the "
          "next token" for a in ("dream", "llada", "llada-moe", "rnd1")},
    **{a: "is recurrent: its state has no cache cells to rewind, which speculative decoding and "
          "each chat turn need" for a in ("mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7")},
}


def why_not_runnable(architecture: str) -> str | None:
    """Why localspec cannot generate text with a GGUF of `architecture`, or None where it can."""
    if architecture in REFUSED:
        return f"its architecture '{architecture}' {REFUSED[architecture]}"
    if architecture not in ARCHITECTURES:
        return f"its architecture '{architecture}' is not one this llama.cpp build can load"
    return None


def check_runnable(info: GGUFInfo) -> None:
    """LocalspecError naming the file, the architecture and the fix where localspec cannot
    generate text with it (a target or a draft alike)."""
    why = why_not_runnable(info.architecture)
    if why:
        raise LocalspecError("Not a text model localspec can run", f"'{info.path}': {why}",
                             "Use a GGUF of a decoder-only text model (Llama, Qwen, Mistral, Gemma, "
                             "Phi, ...); `localspec pull --help` names tested ones")
