"""A lean decoder step for Qwen2/Llama-family draft models: tree attention over a static KV cache.

transformers' generate() spends most of a small model's step in Python bookkeeping (cache objects,
mask builders, hooks), and its caches assume one linear sequence. A tree drafter needs something
else: evaluate a handful of tree nodes per forward, each attending to the committed prefix plus its
own ancestors, then forget them. So transformers only loads the model (config, safetensors, GGUF
dequantisation) and the forward runs here on the bare weights. The KV cache is one preallocated
tensor addressed by explicit slots and the caller passes the attention mask, so rollback costs
nothing: a slot that no mask row points at is never read.

Every buffer has a fixed size (cache, RoPE tables). On a GPU a forward of a few tokens is launch
bound (~500 kernels for a 24-layer model), so small forwards replay CUDA graphs: the rows are padded
to a bucket (1, 2, 4, ... 32) and the attended slots to a power of two, the inputs are copied into
static buffers, and one graph per (rows, slots) bucket replays the whole forward. Padding rows
write their K/V into a scratch slot past the cache's end and attend to slot 0 only, so they touch
nothing real. The same static path runs without capture on CPU (`static_shapes=True`), which is
how the tests check the padding.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from packaging.version import Version
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM, PreTrainedModel

from localspec.models import safetensors_file
from localspec.models.gguf_file import read_gguf

from .errors import LocalspecError

_MODEL_TYPES = ("qwen2", "llama")
# RoPE variants whose frequencies are fixed; "dynamic" and "longrope" change with sequence length.
_STATIC_ROPE = ("default", "linear", "llama3")
# On CUDA, SDPA's default (cuDNN) builds a plan per new shape, each time the slot count S grows,
# i.e. on nearly every draft step, at several forwards' cost. The memory-efficient kernel takes
# any (n, S) with a mask at no per-shape cost (docs/decisions/0017).
_CUDA_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# Row buckets of the static (graph) path; a larger forward (a prompt's prefill) runs eagerly.
_ROW_BUCKETS = (1, 2, 4, 8, 16, 32)
_MIN_SLOTS = 256   # smallest slot bucket; buckets double up to max_len
_DTYPE_KW = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


@dataclass
class _Static:
    """The inputs and output of one row bucket's forward, at fixed addresses (graph replay reads
    and writes exactly these tensors)."""

    tokens: torch.Tensor      # [rows] int64
    positions: torch.Tensor   # [rows] int64
    slots: torch.Tensor       # [rows] int64
    attend: torch.Tensor      # [rows, max_len] bool
    logits: torch.Tensor      # [rows, V] float32
    used: int = 0             # real rows in the last forward; rows past it are padding


@dataclass
class _Layer:
    """One decoder layer's weights; q/k/v and gate/up are fused so a layer is four matmuls."""

    ln1: torch.Tensor             # [H]
    w_qkv: torch.Tensor           # [(Hq + 2 Hkv) D, H]
    b_qkv: torch.Tensor | None    # [(Hq + 2 Hkv) D]  (Qwen2 has q/k/v biases, Llama none)
    w_o: torch.Tensor             # [H, Hq D]
    b_o: torch.Tensor | None
    ln2: torch.Tensor             # [H]
    w_gu: torch.Tensor            # [2 I, H]  gate rows, then up rows
    b_gu: torch.Tensor | None
    w_down: torch.Tensor          # [H, I]
    b_down: torch.Tensor | None


def _cat_bias(*linears: torch.nn.Linear) -> torch.Tensor | None:
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else lin.weight.new_zeros(lin.out_features)
                      for b, lin in zip(biases, linears)])


def _bias(lin: torch.nn.Linear) -> torch.Tensor | None:
    return None if lin.bias is None else lin.bias.detach()


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: normalise in fp32, cast back, then scale (one fused kernel, not six ops)."""
    return weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [n, heads, D]; cos/sin: [n, 1, D]. Rotates the two halves of each head (HF layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # rotate_half
    return x * cos + rotated * sin


def rope_inv_freq(config, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [D/2] and the cos/sin scale, from either config style (4.x or 5.x)."""
    params = getattr(config, "rope_parameters", None)  # transformers >= 5
    if params is None:  # 4.x: rope_theta plus an optional rope_scaling dict
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _STATIC_ROPE:
        raise LocalspecError(
            "Unsupported draft model",
            f"its RoPE scaling is '{rope_type}'; the PyTorch draft supports {', '.join(_STATIC_ROPE)}",
            "Use a draft model without that rope scaling (e.g. Qwen2.5-Coder-0.5B), or the GGUF draft stage",
        )
    if rope_type == "default":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim  # [D/2]
        return 1.0 / (float(params["rope_theta"]) ** exponents), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return inv_freq.float(), float(scale)


def _unsupported(model_type: str) -> LocalspecError:
    return LocalspecError(
        "Unsupported draft model",
        f"model type {model_type}; the PyTorch draft runs {', '.join(_MODEL_TYPES)} models with "
        "SiLU MLPs and full attention",
        "Use a Qwen2/Qwen2.5 or Llama draft model sharing the target's vocabulary")


def load_causal_lm(path: Path, dtype: torch.dtype) -> PreTrainedModel:
    """A transformers model from a folder (config.json + safetensors) or a .gguf file."""
    if not path.exists():
        raise LocalspecError("Draft model not found", f"{path} does not exist",
                             "Download the draft model, or pass the folder holding its config.json "
                             "and *.safetensors (or its .gguf file)")
    kwargs: dict = {_DTYPE_KW: dtype, "local_files_only": True}
    if path.is_file():
        if path.suffix != ".gguf":
            raise LocalspecError("Not a draft model", f"{path} is a file but not a .gguf",
                                 "Pass a .gguf file, or a folder with config.json and *.safetensors")
        folder, kwargs["gguf_file"] = path.parent, path.name
        fix = "Check the file is a complete Qwen2/Llama GGUF; loading GGUF in PyTorch needs " \
              "`pip install gguf accelerate`"
        try:
            read_gguf(path)   # the header, validated in linear time, before transformers parses it
        except LocalspecError as err:
            raise LocalspecError("Could not load the draft model", f"{err.title}: {err.cause}",
                                 err.fix) from None
    else:
        if not (path / "config.json").exists():     # anything else there: read_config says what
            raise LocalspecError("Not a draft model folder", f"{path} has no config.json",
                                 "Pass the folder holding the model's config.json and *.safetensors "
                                 "(as downloaded from Hugging Face), or a .gguf file")
        folder, fix = path, "Re-download the draft model; the folder needs config.json and *.safetensors"
        shape = safetensors_file.read_config(folder)   # before transformers allocates what it says
        if shape.model_type not in _MODEL_TYPES:
            raise _unsupported(f"'{shape.model_type}'")
        safetensors_file.check_weights(folder, shape)
    try:
        return AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except (OSError, ValueError, ImportError, KeyError, RuntimeError) as e:
        raise LocalspecError("Could not load the draft model", f"{path}: {e}", fix) from e


def _decoder_layer(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                   mask: torch.Tensor, kv: torch.Tensor, ln1: torch.Tensor, w_qkv: torch.Tensor,
                   b_qkv: torch.Tensor | None, w_o: torch.Tensor, b_o: torch.Tensor | None,
                   ln2: torch.Tensor, w_gu: torch.Tensor, b_gu: torch.Tensor | None,
                   w_down: torch.Tensor, b_down: torch.Tensor | None, hq: int, hkv: int, s: int,
                   eps: float, fused: bool) -> torch.Tensor:
    """One decoder layer over n rows: writes their K/V into `kv` ([2, Hkv, slots, D]) at `slots`,
    attends to slots 0..s-1 under `mask` ([g n, s] additive). A plain function of tensors so that
    torch.compile makes one fused version of it for all layers of a shape.

    fused=False: attention as two batched matmuls and a softmax instead of SDPA. For a few query
    rows that is faster on a GPU: the memory-efficient kernel runs one block per KV head (2 for
    the 0.5B draft), which leaves most of the GPU idle (docs/decisions/0017)."""
    n, d = h.shape[0], kv.shape[-1]
    g = hq // hkv
    x = _rms(h, ln1, eps)
    qkv = F.linear(x, w_qkv, b_qkv).view(n, hq + 2 * hkv, d)
    qk = _rope(qkv[:, :hq + hkv], cos, sin)      # [n, Hq + Hkv, D]: q and k rotated at once
    q, k, v = qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv:]
    kv[0].index_copy_(1, slots, k.transpose(0, 1))  # K[:, slots] = k  ([Hkv, n, D])
    kv[1].index_copy_(1, slots, v.transpose(0, 1))  # V[:, slots] = v
    qg = q.reshape(n, hkv, g, d).permute(1, 2, 0, 3).reshape(1, hkv, g * n, d)
    if fused:
        o = F.scaled_dot_product_attention(
            qg, kv[0, None, :, :s], kv[1, None, :, :s], attn_mask=mask)  # [1, Hkv, g n, D]
    else:
        scores = torch.baddbmm(mask.float(), qg[0].float(),               # [Hkv, g n, S]
                               kv[0, :, :s].float().transpose(1, 2), alpha=d ** -0.5)
        o = torch.bmm(torch.softmax(scores, dim=-1).to(h.dtype), kv[1, :, :s])
    o = o.reshape(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, hq * d)  # [n, Hq D]
    h = h + F.linear(o, w_o, b_o)
    x = _rms(h, ln2, eps)
    gate, up = F.linear(x, w_gu, b_gu).chunk(2, dim=-1)  # [n, I] each
    return h + F.linear(F.silu(gate) * up, w_down, b_down)


class TorchLM:
    """The model's weights, a static KV cache of `max_len` slots, and one tree-attention forward."""

    def __init__(self, model: PreTrainedModel, *, max_len: int, device: torch.device,
                 dtype: torch.dtype, static_shapes: bool | None = None,
                 compile: bool | None = None) -> None:
        cfg = model.config
        if cfg.model_type not in _MODEL_TYPES or cfg.hidden_act != "silu" \
                or getattr(cfg, "use_sliding_window", False):
            raise _unsupported(f"'{cfg.model_type}' (activation {cfg.hidden_act})")
        self.device, self.dtype, self.max_len = device, dtype, max_len
        self.vocab_size = int(cfg.vocab_size)
        self.eps = float(cfg.rms_norm_eps)
        self.n_heads, self.n_kv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.group = self.n_heads // self.n_kv  # query heads per KV head
        first = model.model.layers[0].self_attn
        self.head_dim = first.q_proj.out_features // self.n_heads

        def put(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().to(device=device, dtype=dtype)

        self.embed = put(model.model.embed_tokens.weight)   # [V, H]
        head = model.lm_head.weight
        tied = head.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        self.lm_head = self.embed if tied else put(head)    # [V, H]; one copy when tied
        self.norm = put(model.model.norm.weight)             # [H]
        self.layers: list[_Layer] = []
        for layer in model.model.layers:
            at, mlp = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                ln1=put(layer.input_layernorm.weight),
                w_qkv=put(torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])),
                b_qkv=put(_cat_bias(at.q_proj, at.k_proj, at.v_proj)),
                w_o=put(at.o_proj.weight), b_o=put(_bias(at.o_proj)),
                ln2=put(layer.post_attention_layernorm.weight),
                w_gu=put(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                b_gu=put(_cat_bias(mlp.gate_proj, mlp.up_proj)),
                w_down=put(mlp.down_proj.weight), b_down=put(_bias(mlp.down_proj)),
            ))
        inv_freq, scale = rope_inv_freq(cfg, self.head_dim)
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # [max_len, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)                                     # [max_len, D]
        self.cos = (emb.cos() * scale).to(device=device, dtype=dtype)               # [max_len, D]
        self.sin = (emb.sin() * scale).to(device=device, dtype=dtype)               # [max_len, D]
        # K and V of every layer: [L, 2, Hkv, max_len + 1, D]; slot s holds whatever token was
        # written there. Slot max_len is scratch: the static path's padding rows write into it.
        self.cache = torch.zeros(len(self.layers), 2, self.n_kv, max_len + 1, self.head_dim,
                                 device=device, dtype=dtype)
        self.static_shapes = device.type == "cuda" if static_shapes is None else static_shapes
        self._graphed = device.type == "cuda" and self.static_shapes
        self._static: dict[int, _Static] = {}                       # by row bucket
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # by (rows, slots) bucket
        self._pool = None                                           # the graphs' shared memory pool
        # On a GPU the static path's layer is compiled (torch.compile fuses its ~30 small kernels;
        # one compiled version serves all layers of a shape). LOCALSPEC_TORCH_COMPILE=0 turns it off.
        if compile is None:
            compile = device.type == "cuda" and os.environ.get("LOCALSPEC_TORCH_COMPILE", "1") != "0"
        self._compiled_layer = (torch.compile(_decoder_layer, dynamic=True, fullgraph=True)
                                if compile and self.static_shapes else None)

    @classmethod
    def load(cls, path: str | Path, *, max_len: int = 4096, device: str | None = None,
             dtype: torch.dtype | None = None, static_shapes: bool | None = None,
             compile: bool | None = None) -> TorchLM:
        dev = torch.device(device) if device is not None else default_device()
        dt = dtype if dtype is not None else default_dtype(dev)
        model = load_causal_lm(Path(path).expanduser(), dt)
        return cls(model, max_len=max_len, device=dev, dtype=dt,   # the HF model is dropped here
                   static_shapes=static_shapes, compile=compile)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                attend: torch.Tensor, *, last_only: bool = False) -> torch.Tensor:
        """Write the n tokens' K/V into `slots`; token i attends to the slots where attend[i] is True.

        tokens, positions, slots: [n] int64; attend: [n, S] bool over slots 0..S-1 (each row must
        include the token's own slot). Returns fp32 logits [n, V], or [1, V] for the last token;
        on the static path they live in a buffer the next forward overwrites (clone to keep them).
        """
        n = tokens.shape[0]
        if self.static_shapes and n <= _ROW_BUCKETS[-1]:
            logits = self._forward_static(tokens, positions, slots, attend)
            return logits[n - 1:n] if last_only else logits
        dev = self.device
        tokens, positions, slots = (t.to(dev, non_blocking=True) for t in (tokens, positions, slots))
        attend = attend.to(dev, non_blocking=True)
        n, s, g = tokens.shape[0], attend.shape[1], self.group
        cos = self.cos[positions].unsqueeze(1)  # [n, 1, D]
        sin = self.sin[positions].unsqueeze(1)  # [n, 1, D]
        # GQA without copying K/V: the g query heads sharing a KV head become g*n query rows of it.
        # The boolean mask becomes an additive one once here, not inside SDPA in every layer.
        mask = torch.zeros(g * n, s, device=dev, dtype=self.dtype).masked_fill_(
            ~attend.repeat(g, 1), float("-inf"))  # [g n, S]; row j*n + i is token i's
        h = F.embedding(tokens, self.embed)     # [n, H]
        with self._sdpa_backends():
            h = self._layers(h, cos, sin, slots, mask, s)
        if last_only:
            h = h[-1:]
        return F.linear(_rms(h, self.norm, self.eps), self.lm_head).float()  # [n, V]

    def _forward_static(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                        attend: torch.Tensor) -> torch.Tensor:
        """`forward` through fixed shapes: rows padded to a bucket, slots to a power of two."""
        n, s = tokens.shape[0], attend.shape[1]
        rows = next(b for b in _ROW_BUCKETS if b >= n)
        width = min(self.max_len, max(_MIN_SLOTS, 1 << (s - 1).bit_length()))
        st = self._static.get(rows) or self._new_static(rows)
        st.tokens[:n].copy_(tokens, non_blocking=True)
        st.positions[:n].copy_(positions, non_blocking=True)
        st.slots[:n].copy_(slots, non_blocking=True)
        st.attend[:n, :s].copy_(attend, non_blocking=True)
        if s < width:
            st.attend[:n, s:width] = False
        if n < st.used:
            self._pad(st, n)   # last forward's extra rows would rewrite their (real) slots
        st.used = n
        if self._graphed:
            graph = self._graphs.get((rows, width)) or self._capture(st, rows, width)
            graph.replay()
        else:
            self._checked_step(st, rows, width)
        return st.logits[:n]

    def _new_static(self, rows: int) -> _Static:
        dev = self.device
        st = _Static(tokens=torch.zeros(rows, dtype=torch.int64, device=dev),
                     positions=torch.zeros(rows, dtype=torch.int64, device=dev),
                     slots=torch.zeros(rows, dtype=torch.int64, device=dev),
                     attend=torch.zeros(rows, self.max_len, dtype=torch.bool, device=dev),
                     logits=torch.zeros(rows, self.vocab_size, dtype=torch.float32, device=dev))
        self._pad(st, 0)
        self._static[rows] = st
        return st

    def _pad(self, st: _Static, n: int) -> None:
        """Rows n.. become padding: token 0 at position 0, written to the scratch slot, seeing
        slot 0 only (always inside the attended width, so no row is fully masked)."""
        st.tokens[n:] = 0
        st.positions[n:] = 0
        st.slots[n:] = self.max_len
        st.attend[n:] = False
        st.attend[n:, 0] = True

    def _static_step(self, st: _Static, rows: int, width: int) -> None:
        mask = torch.zeros(self.group * rows, width, device=self.device, dtype=torch.float32)
        mask.masked_fill_(~st.attend[:, :width].repeat(self.group, 1), float("-inf"))
        cos = self.cos[st.positions].unsqueeze(1)
        sin = self.sin[st.positions].unsqueeze(1)
        h = F.embedding(st.tokens, self.embed)
        h = self._layers(h, cos, sin, st.slots, mask, width, fused=False)
        st.logits.copy_(F.linear(_rms(h, self.norm, self.eps), self.lm_head))

    def _checked_step(self, st: _Static, rows: int, width: int) -> None:
        """`_static_step`, falling back to the uncompiled layer for good if compiling fails (no
        C compiler for Triton, an op inductor does not take): slower, never wrong."""
        try:
            self._static_step(st, rows, width)
        except Exception as err:  # any compiler failure
            if self._compiled_layer is None:
                raise
            warnings.warn(f"torch.compile of the draft failed, running it uncompiled: {err}",
                          stacklevel=2)
            self._compiled_layer = None
            self._static_step(st, rows, width)

    def _capture(self, st: _Static, rows: int, width: int) -> torch.cuda.CUDAGraph:
        """Record `_static_step` for this bucket. The warm-up runs execute, so the real rows are
        saved and every row padded first: warm-up writes land in the scratch slot only."""
        saved = [t.clone() for t in (st.tokens, st.positions, st.slots, st.attend)]
        self._pad(st, 0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._checked_step(st, rows, width)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._static_step(st, rows, width)
        for t, v in zip((st.tokens, st.positions, st.slots, st.attend), saved):
            t.copy_(v)
        self._graphs[(rows, width)] = graph
        return graph

    def _sdpa_backends(self) -> contextlib.AbstractContextManager:
        return sdpa_kernel(_CUDA_SDPA) if self.device.type == "cuda" else contextlib.nullcontext()

    def _layers(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                mask: torch.Tensor, s: int, fused: bool = True) -> torch.Tensor:
        step = self._compiled_layer if not fused and self._compiled_layer is not None else _decoder_layer
        for layer, kv in zip(self.layers, self.cache):
            h = step(h, cos, sin, slots, mask, kv, layer.ln1, layer.w_qkv, layer.b_qkv, layer.w_o,
                     layer.b_o, layer.ln2, layer.w_gu, layer.b_gu, layer.w_down, layer.b_down,
                     self.n_heads, self.n_kv, s, self.eps, fused)
        return h  # [n, H]

    def close(self) -> None:
        """Free the weights and the cache (GPU memory goes back at once)."""
        self.layers.clear()
        self._graphs.clear()
        self._static.clear()
        self.cache = self.embed = self.lm_head = torch.empty(0)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
