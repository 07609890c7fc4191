#!/usr/bin/env python3
"""The `hybrid` architecture of docs/HYBRID.md written in plain PyTorch: benchmark peer and oracle.

  .venv/bin/python bench/hybrid_torch.py train    [--steps N] [--seqs 256,64] [--batch 8]
  .venv/bin/python bench/hybrid_torch.py generate [--contexts 256,2048,8192]
  (run them under `taskset -c 0`; each prints one JSON object)

The module (HybridConfig, HybridLM) follows the spec, not corelm's code: a corelm config.json +
model.safetensors load into it with load_state_dict (parameter names are Hugging Face Llama's plus
`self_attn.decay` and `self_attn.out_norm.weight` on linear-attention layers), so
tests/oracle can compare corelm's hybrid against it through `logits_and_grads`. Layer kinds:
  full_attention     Llama GQA attention with RoPE (rotate-half convention, theta from config)
  sliding_attention  the same, query i sees keys j with i - W <= j <= i (W + 1 keys, as
                     transformers 4.40 Mistral; checked in tests/oracle/torch_hybrid_selfcheck.py)
  linear_attention   log-decay linear attention, no RoPE; chunked parallel form (chunk 64) in the
                     model, a naive per-token recurrence kept beside it for the self-check
With bos_isolation, doc ids are the running count of BOS tokens along a row: attention never
crosses documents and the linear state is zeroed where the doc id changes.

Decoding (`HybridLM.prefill` / `HybridLM.step`) keeps a fixed-size state per sliding or linear
layer: a ring of the last W + 1 keys/values, or the d_state x head_dim recurrent matrix; a full
layer keeps a growing KV cache. The `generate` benchmark sets it against the "published reference
generator" that re-runs the whole context window at every step.
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field

# One compute thread in every BLAS/OpenMP layer torch may use (set before torch loads them).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

LAYER_KINDS = ("full_attention", "sliding_attention", "linear_attention")
LINEAR_CHUNK = 64


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@dataclass
class HybridConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size / num_attention_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    layer_types: list = field(default_factory=list)  # empty: every layer full attention
    sliding_window: int = 0
    linear_attention_state_size: int = 0
    bos_isolation: bool = False
    bos_token_id: int = -1
    initializer_range: float = 0.02

    def __post_init__(self):
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if not self.layer_types:
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types lists {len(self.layer_types)} layers, num_hidden_layers is "
                             f"{self.num_hidden_layers}")
        for i, kind in enumerate(self.layer_types):
            if kind not in LAYER_KINDS:
                raise ValueError(f"layer_types[{i}] = {kind!r}: expected one of {LAYER_KINDS}")
        if "sliding_attention" in self.layer_types and self.sliding_window <= 0:
            raise ValueError("sliding_attention layers need sliding_window > 0")
        if "linear_attention" in self.layer_types and self.linear_attention_state_size <= 0:
            raise ValueError("linear_attention layers need linear_attention_state_size > 0")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.bos_isolation and self.bos_token_id < 0:
            raise ValueError("bos_isolation needs a bos_token_id")

    @classmethod
    def from_dict(cls, d):
        """From a corelm (or HF Llama/Mistral) config.json dict. Mistral without layer_types:
        every layer slides, as corelm reads it. Attention biases (Qwen2) are not modelled."""
        if d.get("model_type") == "qwen2" or d.get("attention_bias") or d.get("mlp_bias"):
            raise ValueError("hybrid_torch models no biases (Qwen2 / attention_bias / mlp_bias configs)")
        types = d.get("layer_types") or []
        window = d.get("sliding_window") or 0
        if not types and d.get("model_type") == "mistral" and window:
            types = ["sliding_attention"] * d["num_hidden_layers"]
        if "sliding_attention" not in types:
            window = 0  # Qwen2 writes sliding_window even when nothing slides
        bos = d.get("bos_token_id")
        return cls(hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
                   num_hidden_layers=d["num_hidden_layers"], num_attention_heads=d["num_attention_heads"],
                   num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
                   vocab_size=d["vocab_size"], head_dim=d.get("head_dim") or 0,
                   rope_theta=float(d.get("rope_theta", 10000.0)), rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
                   tie_word_embeddings=bool(d.get("tie_word_embeddings", True)), layer_types=types,
                   sliding_window=window, linear_attention_state_size=d.get("linear_attention_state_size") or 0,
                   bos_isolation=bool(d.get("bos_isolation", False)),
                   bos_token_id=-1 if bos is None else int(bos),
                   initializer_range=float(d.get("initializer_range", 0.02)))

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            return cls.from_dict(json.load(f))


def preset(name, bos_isolation=False):
    """The two shapes the benchmarks compare (docs/HYBRID.md; `tiny` as in corelm's presets)."""
    common = dict(hidden_size=256, intermediate_size=640, num_hidden_layers=6, vocab_size=16384,
                  bos_token_id=1, bos_isolation=bos_isolation)
    if name == "hybrid":
        kinds = ["linear_attention", "sliding_attention", "sliding_attention",
                 "linear_attention", "sliding_attention", "linear_attention"]
        return HybridConfig(num_attention_heads=2, num_key_value_heads=1, head_dim=32, layer_types=kinds,
                            sliding_window=256, linear_attention_state_size=32, **common)
    if name == "tiny":
        return HybridConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=64, **common)
    raise ValueError(f"unknown preset {name!r} (hybrid, tiny)")


def doc_ids_of(ids, cfg):
    """[B, T] running count of BOS tokens (bos_isolation), else None."""
    if not cfg.bos_isolation:
        return None
    return torch.cumsum((ids == cfg.bos_token_id).to(torch.int64), dim=1)


# ---------------------------------------------------------------------------------------------
# Ops
# ---------------------------------------------------------------------------------------------
def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_cos_sin(positions, dim, theta):
    """cos, sin [len(positions), dim] of HF Llama's rotary embedding (f32, rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = torch.outer(positions.float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attention_mask(q_pos, k_pos, window, q_doc=None, k_doc=None):
    """[Tq, Tk] (or [B, Tq, Tk] with docs) bool: query at q_pos sees key at k_pos."""
    diff = q_pos[:, None] - k_pos[None, :]
    visible = diff >= 0
    if window > 0:
        visible = visible & (diff <= window)
    if q_doc is not None:
        visible = visible & (q_doc[:, :, None] == k_doc[:, None, :])
    return visible


def masked_attention(q, k, v, visible):
    """Softmax attention with an explicit mask. q [B, Hq, Tq, D], k/v [B, Hkv, Tk, D];
    visible [Tq, Tk] or [B, Tq, Tk]."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = visible if visible.dim() == 2 else visible[:, None]
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


def causal_attention(q, k, v, window=0, doc=None, block=None):
    """Causal (window 0) or sliding-window attention over one sequence, q/k/v [B, H, T, D].

    With a window and T well beyond it, queries go in blocks of `block` (default W + 1) against
    only the keys their band can reach, so memory and work are O(T·W), not O(T²); the result is
    the same masked softmax (the self-check compares it with one T × T mask)."""
    t = q.shape[2]
    pos = torch.arange(t)
    if window <= 0 or block == 0:
        return masked_attention(q, k, v, attention_mask(pos, pos, window, doc, doc))
    block = block or window + 1
    if t <= 2 * block:
        return masked_attention(q, k, v, attention_mask(pos, pos, window, doc, doc))
    outs = []
    for q0 in range(0, t, block):
        q1 = min(t, q0 + block)
        k0 = max(0, q0 - window)
        qd = None if doc is None else doc[:, q0:q1]
        kd = None if doc is None else doc[:, k0:q1]
        visible = attention_mask(pos[q0:q1], pos[k0:q1], window, qd, kd)
        outs.append(masked_attention(q[:, :, q0:q1], k[:, :, k0:q1], v[:, :, k0:q1], visible))
    return torch.cat(outs, dim=2)


def linear_attention_naive(q, k, v, log_decay, doc=None, scale=1.0, initial_state=None):
    """The definition, one token at a time. q [B, Hq, T, ds], k [B, Hkv, T, ds], v [B, Hkv, T, dv],
    log_decay a [Hkv, ds] (<= 0). S_t = diag(exp(a)) S_{t-1} + k_t v_tᵀ (zeroed first where the doc
    id changes), o_t = scale · S_tᵀ q_t, query head h reads kv head h // (Hq / Hkv).
    Returns (o [B, Hq, T, dv], S_{T-1} [B, Hkv, ds, dv])."""
    b, hq, t_len, ds = q.shape
    hkv, dv = k.shape[1], v.shape[-1]
    group = hq // hkv
    decay = torch.exp(log_decay)[None, :, :, None]
    state = q.new_zeros(b, hkv, ds, dv) if initial_state is None else initial_state
    outs = []
    for t in range(t_len):
        carried = decay * state
        if doc is not None and t > 0:
            carried = carried * (doc[:, t] == doc[:, t - 1]).to(q.dtype)[:, None, None, None]
        state = carried + k[:, :, t, :, None] * v[:, :, t, None, :]
        per_q_head = state.repeat_interleave(group, dim=1)
        outs.append(scale * (q[:, :, t, None, :] @ per_q_head)[:, :, 0])
    return torch.stack(outs, dim=2), state


def linear_attention_chunked(q, k, v, log_decay, doc=None, scale=1.0, initial_state=None, chunk=LINEAR_CHUNK):
    """The same function in chunks of `chunk` positions (same arguments and results as
    linear_attention_naive). Inside a chunk the outputs are one masked attention-like product
    A[t, r] = Σ_c q_tc k_rc exp((t - r) a_c) (t >= r, same doc) times v; the state entering the
    chunk reaches position t decayed by exp((t + 1) a); the state leaving it is the entering one
    decayed by exp(L a) plus Σ_r exp((L - 1 - r) a) k_r v_rᵀ. Every exponent is <= 0, so nothing
    overflows however strong a learned decay gets (the per-pair decay tensor [L, L, ds] is built
    explicitly instead of splitting exp((t - r) a) into exp(t a) · exp(-r a))."""
    b, hq, t_len, ds = q.shape
    hkv, dv = k.shape[1], v.shape[-1]
    group = hq // hkv
    a = log_decay  # [Hkv, ds]
    state = q.new_zeros(b, hkv, ds, dv) if initial_state is None else initial_state
    outs = []
    for s0 in range(0, t_len, chunk):
        s1 = min(t_len, s0 + chunk)
        n = s1 - s0
        pos = torch.arange(n, dtype=q.dtype)
        lag = (pos[:, None] - pos[None, :])
        causal = (lag >= 0).to(q.dtype)  # [n, n]
        pair_decay = torch.exp(lag.clamp(min=0)[None, :, :, None] * a[:, None, None, :]) * causal[None, :, :, None]
        in_decay = torch.exp((pos + 1)[None, :, None] * a[:, None, :])  # [Hkv, n, ds]
        out_decay = torch.exp((n - 1 - pos)[None, :, None] * a[:, None, :])  # [Hkv, n, ds]
        qc = q[:, :, s0:s1].reshape(b, hkv, group, n, ds)
        kc, vc = k[:, :, s0:s1], v[:, :, s0:s1]
        # Intra-chunk scores [B, Hkv, G, n, n].
        weighted_q = qc[:, :, :, :, None, :] * pair_decay[None, :, None]  # [B, Hkv, G, n, n, ds]
        scores = (weighted_q * kc[:, :, None, None, :, :]).sum(-1)
        carry_in = carry_out = keep = None
        if doc is not None:
            d = doc[:, s0:s1]
            scores = scores * (d[:, :, None] == d[:, None, :]).to(q.dtype)[:, None, None]
            prev = doc[:, s0 - 1] if s0 > 0 else d[:, 0]  # the initial state belongs to doc[:, 0]
            carry_in = (d == prev[:, None]).to(q.dtype)  # [B, n]: the entering state reaches t
            carry_out = (d[:, -1] == prev).to(q.dtype)  # [B]: ... and the chunk's end
            keep = (d == d[:, -1:]).to(q.dtype)  # [B, n]: k_r v_rᵀ survives to the chunk's end
        out = scores @ vc[:, :, None]  # [B, Hkv, G, n, dv]
        inter = (qc * in_decay[None, :, None]) @ state[:, :, None]
        if carry_in is not None:
            inter = inter * carry_in[:, None, None, :, None]
        out = out + inter
        outs.append(scale * out.reshape(b, hq, n, dv))
        kd = kc * out_decay[None]
        if keep is not None:
            kd = kd * keep[:, None, :, None]
            state = state * carry_out[:, None, None, None]
        state = torch.exp(n * a)[None, :, :, None] * state + kd.transpose(-1, -2) @ vc
    return torch.cat(outs, dim=2), state


# ---------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class SoftmaxAttention(nn.Module):
    """Full (window 0) or sliding-window GQA attention with RoPE."""

    def __init__(self, cfg, window):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.hq, self.hkv, self.d, self.window = cfg.num_attention_heads, cfg.num_key_value_heads, d, window
        self.q_proj = nn.Linear(h, self.hq * d, bias=False)
        self.k_proj = nn.Linear(h, self.hkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.hkv * d, bias=False)
        self.o_proj = nn.Linear(self.hq * d, h, bias=False)

    def qkv(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.hq, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.hkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.hkv, self.d).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, doc, want_state=False):
        q, k, v = self.qkv(x, cos, sin)
        o = causal_attention(q, k, v, self.window, doc)
        out = self.o_proj(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))
        if not want_state:
            return out, None
        return out, self.cache_from_prefill(k, v, doc)

    def cache_from_prefill(self, k, v, doc):
        """Full layers: every key; sliding layers: a ring of W + 1 slots, position p in slot
        p mod (W + 1), with the slot's position and doc id kept for masking."""
        b, t = k.shape[0], k.shape[2]
        doc = doc if doc is not None else torch.zeros(b, t, dtype=torch.int64)
        if self.window <= 0:
            return {"k": k.detach(), "v": v.detach(), "pos": torch.arange(t), "doc": doc}
        slots = self.window + 1
        ring = {"k": k.new_zeros(b, self.hkv, slots, self.d), "v": v.new_zeros(b, self.hkv, slots, self.d),
                "pos": torch.full((slots,), -1, dtype=torch.int64), "doc": torch.zeros(b, slots, dtype=torch.int64)}
        for p in range(max(0, t - slots), t):
            s = p % slots
            ring["k"][:, :, s], ring["v"][:, :, s] = k[:, :, p].detach(), v[:, :, p].detach()
            ring["pos"][s], ring["doc"][:, s] = p, doc[:, p]
        return ring

    def step(self, x, cos, sin, doc, p, cache):
        """One new position p for every row: x [B, 1, H], doc [B, 1]."""
        q, k, v = self.qkv(x, cos, sin)
        if self.window <= 0:
            for key, new in (("k", k), ("v", v)):
                cache[key] = torch.cat((cache[key], new), dim=2)
            cache["pos"] = torch.cat((cache["pos"], torch.tensor([p])))
            cache["doc"] = torch.cat((cache["doc"], doc), dim=1)
        else:
            s = p % (self.window + 1)
            cache["k"][:, :, s], cache["v"][:, :, s] = k[:, :, 0], v[:, :, 0]
            cache["pos"][s], cache["doc"][:, s] = p, doc[:, 0]
        visible = cache["pos"] >= 0  # ring slots not yet written hold position -1
        if self.window > 0:
            visible = visible & (p - cache["pos"] <= self.window)
        visible = visible[None, None, :] & (cache["doc"][:, None, :] == doc[:, :, None])  # [B, 1, S]
        o = masked_attention(q, cache["k"], cache["v"], visible)
        return self.o_proj(o.transpose(1, 2).reshape(x.shape[0], 1, -1))


class LinearAttention(nn.Module):
    """Log-decay linear attention (docs/HYBRID.md): no RoPE, per-head RMSNorm on the output."""

    def __init__(self, cfg):
        super().__init__()
        h, d, ds = cfg.hidden_size, cfg.head_dim, cfg.linear_attention_state_size
        self.hq, self.hkv, self.d, self.ds = cfg.num_attention_heads, cfg.num_key_value_heads, d, ds
        self.q_proj = nn.Linear(h, self.hq * ds, bias=False)
        self.k_proj = nn.Linear(h, self.hkv * ds, bias=False)
        self.v_proj = nn.Linear(h, self.hkv * d, bias=False)
        self.o_proj = nn.Linear(self.hq * d, h, bias=False)
        self.decay = nn.Parameter(decay_init(self.hkv, ds))  # w; the log-decay is a = -exp(w)
        self.out_norm = RMSNorm(d, cfg.rms_norm_eps)

    def qkv(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.hq, self.ds).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.hkv, self.ds).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.hkv, self.d).transpose(1, 2)
        return q, k, v

    def finish(self, o, b, t):
        return self.o_proj(self.out_norm(o).transpose(1, 2).reshape(b, t, -1))

    def forward(self, x, cos, sin, doc, want_state=False, naive=False):
        q, k, v = self.qkv(x)
        run = linear_attention_naive if naive else linear_attention_chunked
        o, state = run(q, k, v, -torch.exp(self.decay), doc, scale=self.ds ** -0.5)
        out = self.finish(o, x.shape[0], x.shape[1])
        if not want_state:
            return out, None
        last_doc = doc[:, -1] if doc is not None else torch.zeros(x.shape[0], dtype=torch.int64)
        return out, {"S": state.detach(), "doc": last_doc}

    def step(self, x, cos, sin, doc, p, cache):
        q, k, v = self.qkv(x)
        decay = torch.exp(-torch.exp(self.decay))[None, :, :, None]
        same = (doc[:, 0] == cache["doc"]).to(x.dtype)[:, None, None, None] if p > 0 else 1.0
        cache["S"] = decay * cache["S"] * same + k[:, :, 0, :, None] * v[:, :, 0, None, :]
        cache["doc"] = doc[:, 0].clone()
        S = cache["S"].repeat_interleave(self.hq // self.hkv, dim=1)
        o = (self.ds ** -0.5) * (q @ S)  # [B, Hq, 1, d]
        return self.finish(o, x.shape[0], 1)


def decay_init(hkv, ds):
    """w per channel c: lambda_c = 1 - 2^-(1 + 9c/(ds - 1)) (half-lives 1 to ~700 tokens),
    w_c = log(-log lambda_c), the same for every kv head (docs/HYBRID.md)."""
    c = torch.arange(ds, dtype=torch.float64)
    lam = 1.0 - torch.pow(2.0, -(1.0 + 9.0 * c / max(ds - 1, 1)))
    return torch.log(-torch.log(lam)).float().repeat(hkv, 1)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg, kind):
        super().__init__()
        self.kind = kind
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if kind == "linear_attention":
            self.self_attn = LinearAttention(cfg)
        else:
            self.self_attn = SoftmaxAttention(cfg, cfg.sliding_window if kind == "sliding_attention" else 0)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, doc, want_state=False):
        mixed, state = self.self_attn(self.input_layernorm(x), cos, sin, doc, want_state)
        x = x + mixed
        return x + self.mlp(self.post_attention_layernorm(x)), state

    def step(self, x, cos, sin, doc, p, cache):
        x = x + self.self_attn.step(self.input_layernorm(x), cos, sin, doc, p, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Layer(cfg, kind) for kind in cfg.layer_types])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class HybridLM(nn.Module):
    """state_dict() keys: model.embed_tokens.weight, model.layers.N.{input_layernorm,
    post_attention_layernorm}.weight, model.layers.N.self_attn.{q,k,v,o}_proj.weight (+ .decay and
    .out_norm.weight on linear layers), model.layers.N.mlp.{gate,up,down}_proj.weight,
    model.norm.weight, and lm_head.weight only when tie_word_embeddings is false."""

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.model = Decoder(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def init_weights(self, seed):
        """normal(0, initializer_range) for linears and the embedding, norms 1, decay by formula."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("decay"):
                    p.copy_(decay_init(*p.shape))
                elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * self.config.initializer_range)
        return self

    def head_weight(self):
        return self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def hidden(self, ids, want_state=False):
        cfg = self.config
        doc = doc_ids_of(ids, cfg)
        cos, sin = rope_cos_sin(torch.arange(ids.shape[1]), cfg.head_dim, cfg.rope_theta)
        x = self.model.embed_tokens(ids)
        states = []
        for layer in self.model.layers:
            x, state = layer(x, cos, sin, doc, want_state)
            states.append(state)
        return self.model.norm(x), states, doc

    def forward(self, ids, last_only=False):
        """ids [B, T] int64 -> logits [B, T, V] (or [B, V] of the last position)."""
        h, _, _ = self.hidden(ids)
        if last_only:
            h = h[:, -1]
        return h @ self.head_weight().t()

    # -- stateful decoding ------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, ids):
        """Runs the prompt ids [B, T] once; returns (last logits [B, V], decode state)."""
        h, states, doc = self.hidden(ids, want_state=True)
        last_doc = doc[:, -1] if doc is not None else torch.zeros(ids.shape[0], dtype=torch.int64)
        state = {"pos": ids.shape[1], "doc": last_doc, "layers": states}
        return h[:, -1] @ self.head_weight().t(), state

    @torch.no_grad()
    def step(self, tokens, state):
        """Feeds one token per row (tokens [B]) at position state['pos']; returns logits [B, V].
        Per token it touches W + 1 cached keys per sliding layer and one d_state × head_dim matrix
        per linear layer, whatever the context length."""
        cfg, p = self.config, state["pos"]
        doc = state["doc"] + (tokens == cfg.bos_token_id).to(torch.int64) if cfg.bos_isolation else state["doc"]
        cos, sin = rope_cos_sin(torch.tensor([p]), cfg.head_dim, cfg.rope_theta)
        x = self.model.embed_tokens(tokens[:, None])
        for layer, cache in zip(self.model.layers, state["layers"]):
            x = layer.step(x, cos, sin, doc[:, None], p, cache)
        state["pos"], state["doc"] = p + 1, doc
        return self.model.norm(x)[:, 0] @ self.head_weight().t()


# ---------------------------------------------------------------------------------------------
# Oracle entry points
# ---------------------------------------------------------------------------------------------
def load_safetensors(model, path):
    """Loads corelm's model.safetensors (any float dtype, cast to f32) with strict key matching;
    a stored lm_head.weight of a tied model is dropped."""
    from safetensors.torch import load_file
    tensors = {k: v.float() for k, v in load_file(path).items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    model.load_state_dict(tensors, strict=True)
    return model


def logits_and_grads(config_json_path, safetensors_path, ids, targets=None):
    """For the C++ oracle test: logits [B, T, V] of ids [B, T] and the gradient of the mean
    cross-entropy loss of every parameter, by state_dict name. targets default to the next token
    (ids[:, 1:] against logits[:, :-1])."""
    torch.set_num_threads(1)
    model = load_safetensors(HybridLM(HybridConfig.from_json(config_json_path)), safetensors_path)
    ids = torch.as_tensor(ids, dtype=torch.int64)
    logits = model(ids)
    if targets is None:
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    else:
        targets = torch.as_tensor(targets, dtype=torch.int64)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    return logits.detach(), {name: p.grad.detach().clone() for name, p in model.named_parameters()}


# ---------------------------------------------------------------------------------------------
# Benchmarks (one thread; run under `taskset -c 0`)
# ---------------------------------------------------------------------------------------------
def machine():
    cpu = platform.processor() or "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = []
    return {"cpu": cpu, "utc": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M:%S"), "loadavg": load,
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}


def timed(fn, repeats):
    """Wall and process-CPU seconds of each of `repeats` calls (the CPU figure leaves out time
    spent waiting for a shared core)."""
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return walls, cpus


def train_case(name, batch, seq, warmup, steps, seed):
    cfg = preset(name)
    model = HybridLM(cfg).init_weights(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(seed + 1)
    data = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g)
    losses = []

    def step():
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), data[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss))

    timed(step, warmup)
    walls, cpus = timed(step, steps)
    tokens = batch * seq
    return {"preset": name, "batch": batch, "seq": seq, "layer_types": cfg.layer_types,
            "params": sum(p.numel() for p in model.parameters()), "warmup_steps": warmup, "steps": steps,
            "step_s": [round(w, 3) for w in walls], "tok_s_median": round(tokens / statistics.median(walls), 1),
            "cpu_tok_s_median": round(tokens / statistics.median(cpus), 1), "loss_first_last": [losses[0], losses[-1]]}


def bench_train(args):
    out = {"bench": "train", "what": "forward + backward + clip + AdamW, full-softmax cross-entropy, f32",
           "machine": machine(), "cases": []}
    for seq in args.seqs:
        for name in args.presets:
            out["cases"].append(train_case(name, args.batch, seq, args.warmup, args.steps, args.seed))
            print(json.dumps(out["cases"][-1]), file=sys.stderr, flush=True)
    out["machine_end"] = machine()
    return out


def generate_case(model, ctx, ref_steps, steps, seed):
    """Batch 1 greedy decoding at a context of ctx tokens, two ways."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, cfg.vocab_size, (1, ctx), generator=g)
    # Stateful: one prefill (also the warm-up of the forward), then a token per step.
    w0 = time.perf_counter()
    logits, state = model.prefill(prompt)
    prefill_s = time.perf_counter() - w0
    tokens = [logits.argmax(-1)]

    def decode():
        tokens.append(model.step(tokens[-1], state).argmax(-1))

    timed(decode, 2)
    dec_walls, dec_cpus = timed(decode, steps)
    # Reference generator: the whole window of the last ctx tokens through the model per token,
    # LM head on the last position only (the cheaper choice, favourable to it).
    window = [prompt]

    @torch.no_grad()
    def rerun():
        ids = window[-1]
        nxt = model(ids, last_only=True).argmax(-1)
        window.append(torch.cat((ids[:, 1:], nxt[:, None]), dim=1))

    stateful = {"steps": steps, "tok_s_median": 1 / statistics.median(dec_walls),
                "cpu_tok_s_median": 1 / statistics.median(dec_cpus)}
    result = {"context": ctx, "prefill_s": round(prefill_s, 3), "stateful": stateful}
    if ref_steps == 0:
        return result
    ref_walls, ref_cpus = timed(rerun, ref_steps)
    rerun = {"steps": ref_steps, "step_s": [round(w, 3) for w in ref_walls],
             "tok_s_median": 1 / statistics.median(ref_walls), "cpu_tok_s_median": 1 / statistics.median(ref_cpus)}
    return dict(result, rerun_window=rerun, speedup=round(stateful["tok_s_median"] / rerun["tok_s_median"], 1),
                cpu_speedup=round(stateful["cpu_tok_s_median"] / rerun["cpu_tok_s_median"], 1))


def bench_generate(args):
    model = HybridLM(preset(args.preset)).init_weights(args.seed).eval()
    out = {"bench": "generate", "preset": args.preset, "batch": 1, "machine": machine(), "cases": []}
    for ctx in args.contexts:
        ref_steps = args.ref_steps if ctx <= 2048 else min(args.ref_steps, 2)
        out["cases"].append(generate_case(model, ctx, ref_steps, args.steps, args.seed))
        print(json.dumps(out["cases"][-1]), file=sys.stderr, flush=True)
    out["machine_end"] = machine()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train", help="training tok/s of hybrid and tiny")
    tr.add_argument("--presets", type=lambda s: s.split(","), default=["hybrid", "tiny"])
    tr.add_argument("--seqs", type=lambda s: [int(x) for x in s.split(",")], default=[256])
    tr.add_argument("--batch", type=int, default=8)
    tr.add_argument("--warmup", type=int, default=1)
    tr.add_argument("--steps", type=int, default=3)
    tr.add_argument("--seed", type=int, default=17)
    ge = sub.add_parser("generate", help="batch-1 decode tok/s: stateful vs re-running the window")
    ge.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[256, 2048, 8192])
    ge.add_argument("--steps", type=int, default=32, help="stateful decode steps timed per context")
    ge.add_argument("--ref-steps", type=int, default=4, help="re-run steps timed (at most 2 beyond 2048; 0: skip)")
    ge.add_argument("--preset", default="hybrid", help="hybrid, or tiny (full attention: a growing KV cache)")
    ge.add_argument("--seed", type=int, default=17)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    result = bench_train(args) if args.cmd == "train" else bench_generate(args)
    result["command"] = " ".join([os.path.basename(sys.executable)] + sys.argv)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
