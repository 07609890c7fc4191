#!/usr/bin/env python3
"""Self-check of bench/hybrid_torch.py, the PyTorch hybrid that corelm's oracle tests compare with.

  .venv/bin/python tests/oracle/torch_hybrid_selfcheck.py [--corelm build/release/corelm]
  (exit 0: all pass; 1: a check failed; 77: no torch)
Checks, each printing its max abs / rel error:
  linear_chunked_vs_naive  chunked linear attention == the per-token recurrence: output, final
                           state and q/k/v/log-decay gradients; T = 300 (chunks 64 + a short tail),
                           GQA, doc resets (one at a chunk edge), an initial state, strong decays
  sliding_blocked          blocked sliding-window attention == one T × T band mask (+ docs)
  mistral_*                HybridLM with every layer sliding == transformers 4.40.2
                           MistralForCausalLM (eager) logits with the same weights, T > W; and the
                           window off by one (W ± 1) must NOT match, so the check can fail
  llama_logits             every layer full: == transformers LlamaForCausalLM (RoPE theta, GQA)
  decode_*                 prefill + step-by-step decoding (ring of W + 1 keys, recurrent state, a
                           growing full cache) == the full forward's logits at every position, for
                           T well beyond W, with and without BOS isolation, batch 2
  bos_isolation            a document's logits do not depend on the document packed before it
  names / init / roundtrip state_dict names of docs/HYBRID.md, the decay formula, and
                           logits_and_grads through config.json + safetensors (grads by name)
  corelm_checkpoint        (with --corelm) a checkpoint written by `corelm train --preset tiny`
                           loads with strict names, and the mean NLL of `corelm perplexity
                           --precision f32` over 3 chunks equals HybridLM's on the same tokens
"""
import json
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
sys.path.insert(0, HERE)

from oracle_fixture import import_torch  # noqa: E402

torch = import_torch()
torch.set_default_dtype(torch.float32)
import hybrid_torch as H  # noqa: E402

FAILURES = []


def report(name, got, want, atol, rtol=0.0):
    """Max abs and rel error of got vs want; fails when any |got - want| > atol + rtol·|want|."""
    err = (got.double() - want.double()).abs()
    scale = want.double().abs()
    max_abs = float(err.max()) if err.numel() else 0.0
    # Relative error where |want| is not tiny next to the tensor's largest entry (near-zero entries
    # would report noise as huge relative errors).
    floor = max(float(scale.max()) * 1e-3, 1e-12) if err.numel() else 1.0
    max_rel = float((err / scale.clamp(min=floor)).max()) if err.numel() else 0.0
    ok = bool((err <= atol + rtol * scale).all())
    print(f"{'ok  ' if ok else 'FAIL'} {name:44s} max_abs {max_abs:.3e}  max_rel {max_rel:.3e}"
          f"  (|want| max {float(scale.max()):.3g}; atol {atol:g} rtol {rtol:g})")
    if not ok:
        FAILURES.append(name)


def expect(name, cond, detail):
    print(f"{'ok  ' if cond else 'FAIL'} {name:44s} {detail}")
    if not cond:
        FAILURES.append(name)


def docs_from(b, t, boundaries):
    doc = torch.zeros(b, t, dtype=torch.int64)
    for row, starts in enumerate(boundaries):
        for p in starts:
            doc[row, p:] += 1
    return doc


def check_linear_attention():
    g = torch.Generator().manual_seed(1)
    b, hq, hkv, t, ds, dv = 2, 4, 2, 300, 32, 32
    q = torch.randn(b, hq, t, ds, generator=g) * 0.3
    k = torch.randn(b, hkv, t, ds, generator=g) * 0.3
    v = torch.randn(b, hkv, t, dv, generator=g)
    # Decays from very strong (a = -8: exp(63 a) underflows) to nearly none (-0.001).
    log_decay = -torch.exp(torch.rand(hkv, ds, generator=g) * 9.0 - 6.9)
    init = torch.randn(b, hkv, ds, dv, generator=g)
    doc = docs_from(b, t, [[50, 64, 130, 131, 299], [1, 128, 200]])
    upstream = torch.randn(b, hq, t, dv, generator=g)
    up_state = torch.randn(b, hkv, ds, dv, generator=g)
    results = {}
    for name, fn in (("naive", H.linear_attention_naive), ("chunked", H.linear_attention_chunked)):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, log_decay)]
        out, state = fn(*leaves, doc, scale=ds ** -0.5, initial_state=init)
        ((out * upstream).sum() + (state * up_state).sum()).backward()
        results[name] = (out.detach(), state.detach(), [x.grad for x in leaves])
    (o_n, s_n, g_n), (o_c, s_c, g_c) = results["naive"], results["chunked"]
    report("linear_chunked_vs_naive output", o_c, o_n, 1e-4, 1e-4)
    report("linear_chunked_vs_naive final state", s_c, s_n, 1e-4, 1e-4)
    for label, gc, gn in zip(("q", "k", "v", "log_decay"), g_c, g_n):
        report(f"linear_chunked_vs_naive grad {label}", gc, gn, 1e-3, 1e-4)
    # Chunk sizes that do not divide T and a state without docs agree too.
    o7, s7 = H.linear_attention_chunked(q, k, v, log_decay, None, 0.5, chunk=7)
    o_ref, s_ref = H.linear_attention_naive(q, k, v, log_decay, None, 0.5)
    report("linear_chunk7_vs_naive output (no docs)", o7, o_ref, 1e-4, 1e-4)
    report("linear_chunk7_vs_naive final state", s7, s_ref, 1e-4, 1e-4)


def check_sliding_blocked():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 200, 16, generator=g)
    k = torch.randn(2, 2, 200, 16, generator=g)
    v = torch.randn(2, 2, 200, 16, generator=g)
    doc = docs_from(2, 200, [[30, 31, 90], [150]])
    for window, docs in ((9, None), (9, doc), (40, doc)):
        blocked = H.causal_attention(q, k, v, window, docs)
        full = H.causal_attention(q, k, v, window, docs, block=0)
        report(f"sliding_blocked W={window} docs={docs is not None}", blocked, full, 1e-5, 1e-5)


def check_mistral():
    try:
        import transformers
        from transformers import MistralConfig, MistralForCausalLM
    except ImportError as e:
        expect("mistral", False, f"transformers missing: {e}")
        return
    window, t = 6, 40
    hf_cfg = MistralConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                           sliding_window=window, rope_theta=10000.0, rms_norm_eps=1e-5,
                           tie_word_embeddings=True, attn_implementation="eager")
    torch.manual_seed(3)
    hf = MistralForCausalLM(hf_cfg).eval()
    assert hf.config._attn_implementation == "eager", hf.config._attn_implementation
    with torch.no_grad():  # larger weights than the 0.02 default: peaky attention, so masks matter
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    ids = torch.randint(0, 96, (2, t), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = hf(ids).logits
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    for w in (window, window - 1, window + 1):
        ours_cfg = H.HybridConfig.from_dict(dict(hf_cfg.to_dict(), sliding_window=w))
        assert ours_cfg.layer_types == ["sliding_attention"] * 3, ours_cfg.layer_types
        ours = H.HybridLM(ours_cfg)
        ours.load_state_dict(state, strict=True)
        with torch.no_grad():
            got = ours(ids)
        if w == window:
            report(f"mistral_logits W={w} T={t} (transformers {transformers.__version__})", got, want, 2e-5, 1e-5)
        else:
            diff = float((got - want).abs().max())
            expect(f"mistral_window_off_by_one W={w}", diff > 1e-3, f"max_abs {diff:.3e} (must differ)")


def check_llama():
    """All layers full attention is Llama: RoPE (rotate-half, theta), GQA, causal mask, tied head."""
    from transformers import LlamaConfig, LlamaForCausalLM
    hf_cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rope_theta=500.0, rms_norm_eps=1e-6, tie_word_embeddings=True, attn_implementation="eager")
    torch.manual_seed(9)
    hf = LlamaForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    ours = H.HybridLM(H.HybridConfig.from_dict(hf_cfg.to_dict()))
    assert ours.config.layer_types == ["full_attention"] * 2
    ours.load_state_dict({k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}, strict=True)
    ids = torch.randint(0, 96, (2, 50), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        report("llama_logits all full_attention T=50 theta=500", ours(ids), hf(ids).logits, 2e-5, 1e-5)


def tiny_hybrid(kinds, bos_isolation, window=8, ds=8):
    cfg = H.HybridConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=len(kinds), num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, vocab_size=50, layer_types=kinds, sliding_window=window,
                         linear_attention_state_size=ds, bos_isolation=bos_isolation, bos_token_id=1,
                         initializer_range=0.2)
    return H.HybridLM(cfg).init_weights(5).eval()


def check_decode():
    kinds = ["linear_attention", "sliding_attention", "full_attention", "linear_attention", "sliding_attention"]
    t, prompt = 150, 5  # T well beyond W = 8, and past a linear chunk edge (64)
    for iso in (False, True):
        model = tiny_hybrid(kinds, iso)
        g = torch.Generator().manual_seed(6)
        ids = torch.randint(2, 50, (2, t), generator=g)
        if iso:
            ids[:, 0] = 1
            ids[0, [40, 41, 70, 130]] = 1
            ids[1, [64, 100]] = 1
        with torch.no_grad():
            full = model(ids)
        logits, state = model.prefill(ids[:, :prompt])
        steps = [logits]
        for p in range(prompt, t):
            steps.append(model.step(ids[:, p], state))
        got = torch.stack(steps, dim=1)
        report(f"decode_vs_forward bos_isolation={iso} T={t} W=8", got, full[:, prompt - 1:], 2e-5, 1e-4)


def check_bos_isolation():
    model = tiny_hybrid(["linear_attention", "sliding_attention", "full_attention"], True)
    g = torch.Generator().manual_seed(7)
    doc_b = torch.randint(2, 50, (1, 30), generator=g)
    doc_b[0, 0] = 1
    a1 = torch.randint(2, 50, (1, 20), generator=g)
    a2 = torch.randint(2, 50, (1, 20), generator=g)
    a1[0, 0] = a2[0, 0] = 1
    with torch.no_grad():
        x = model(torch.cat((a1, doc_b), dim=1))[:, 20:]
        y = model(torch.cat((a2, doc_b), dim=1))[:, 20:]
    # Positions (RoPE) are the same in both, so only leakage between documents could differ.
    report("bos_isolation: doc B after two different docs", x, y, 1e-6)
    no_iso = tiny_hybrid(["linear_attention", "sliding_attention", "full_attention"], False)
    with torch.no_grad():
        x_leak = no_iso(torch.cat((a1, doc_b), 1))[:, 20:]
        diff = float((x_leak - no_iso(torch.cat((a2, doc_b), 1))[:, 20:]).abs().max())
    expect("bos_isolation off: doc B sees doc A", diff > 1e-4, f"max_abs {diff:.3e} (must differ)")


def check_names_init_roundtrip():
    model = H.HybridLM(H.preset("hybrid")).init_weights(11)
    names = set(model.state_dict())
    want = {"model.embed_tokens.weight", "model.norm.weight"}
    for n, kind in enumerate(model.config.layer_types):
        pre = f"model.layers.{n}."
        want |= {pre + "input_layernorm.weight", pre + "post_attention_layernorm.weight"}
        want |= {f"{pre}self_attn.{p}_proj.weight" for p in "qkvo"}
        want |= {f"{pre}mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        if kind == "linear_attention":
            want |= {pre + "self_attn.decay", pre + "self_attn.out_norm.weight"}
    expect("names: hybrid state_dict keys", names == want, f"{len(names)} keys; extra {sorted(names - want)[:3]}, "
           f"missing {sorted(want - names)[:3]}")
    sd = model.state_dict()
    shapes = {k: tuple(sd["model.layers.0." + k].shape) for k in
              ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
               "self_attn.o_proj.weight", "self_attn.decay", "self_attn.out_norm.weight")}
    expect("names: linear layer shapes", shapes == {
        "self_attn.q_proj.weight": (64, 256), "self_attn.k_proj.weight": (32, 256),
        "self_attn.v_proj.weight": (32, 256), "self_attn.o_proj.weight": (256, 64),
        "self_attn.decay": (1, 32), "self_attn.out_norm.weight": (32,)}, str(shapes))
    params = sum(p.numel() for p in model.parameters())
    expect("names: hybrid parameter count ~7.5M", 7.3e6 < params < 7.6e6, f"{params:,}")
    w = sd["model.layers.0.self_attn.decay"][0].double()
    lam = torch.exp(-torch.exp(w))
    half_lives = math.log(0.5) / torch.log(lam)
    expect("init: decay half-lives 1 .. ~700 tokens", abs(float(half_lives[0]) - 1.0) < 1e-4
           and 690 < float(half_lives[-1]) < 712, f"first {float(half_lives[0]):.4f}, last {float(half_lives[-1]):.1f}")
    std = float(sd["model.layers.2.mlp.up_proj.weight"].std())
    expect("init: linears normal(0, 0.02)", abs(std - 0.02) < 5e-4, f"std {std:.5f}")

    from safetensors.torch import save_file
    small = tiny_hybrid(["linear_attention", "sliding_attention"], True)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dict(vars(small.config), model_type="llama")
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        save_file({k: v.contiguous() for k, v in small.state_dict().items()}, os.path.join(tmp, "model.safetensors"))
        ids = torch.randint(2, 50, (2, 20), generator=torch.Generator().manual_seed(8))
        ids[:, 0] = 1
        ids[0, 9] = 1
        logits, grads = H.logits_and_grads(os.path.join(tmp, "config.json"),
                                           os.path.join(tmp, "model.safetensors"), ids)
    with torch.no_grad():
        want = small(ids)
    report("roundtrip: logits_and_grads logits", logits, want, 0.0)
    expect("roundtrip: a gradient per parameter", set(grads) == set(small.state_dict())
           and all(float(g.abs().max()) > 0 for g in grads.values()), f"{len(grads)} grads, all nonzero")


def check_corelm_checkpoint(corelm):
    """End to end against corelm itself (every layer full attention until corelm trains the
    hybrid): 2 training steps of `tiny` on the repository's docs, then corelm's f32 perplexity
    (chunks of 128, second half scored) against the same NLL from logits_and_grads."""
    import glob
    import subprocess
    from tokenizers import Tokenizer
    docs = sorted(glob.glob(os.path.join(HERE, "..", "..", "docs", "*.md")))
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "text.txt")
        with open(text, "w") as f:
            f.write("".join(open(d).read() for d in docs)[:400000])
        out = os.path.join(tmp, "model")
        subprocess.run([corelm, "train", "--preset", "tiny", "--data", text, "--steps", "2", "--batch", "2",
                        "--seq", "64", "--out", out, "--no-progress", "--eval-batches", "0"],
                       check=True, stdout=subprocess.DEVNULL)
        run = subprocess.run([corelm, "perplexity", "--model", out, "-f", text, "--ctx", "128", "--chunks", "3",
                              "--precision", "f32", "--json"], check=True, capture_output=True, text=True)
        want = json.loads(run.stdout.strip().splitlines()[-1])["mean_nll"]
        ids = Tokenizer.from_file(os.path.join(out, "tokenizer.json")).encode(open(text).read(),
                                                                             add_special_tokens=False).ids
        chunks = torch.tensor(ids[:3 * 128]).view(3, 128)
        logits, grads = H.logits_and_grads(os.path.join(out, "config.json"), os.path.join(out, "model.safetensors"),
                                           chunks)
    nll = -logits.log_softmax(-1)[:, 64:127].gather(-1, chunks[:, 65:128, None]).double().mean()
    report("corelm_checkpoint: tiny mean NLL vs corelm perplexity f32", nll.reshape(1),
           torch.tensor([want], dtype=torch.float64), 1e-5, 1e-6)


def main():
    corelm = None
    if len(sys.argv) == 3 and sys.argv[1] == "--corelm":
        corelm = sys.argv[2]
    elif len(sys.argv) != 1:
        sys.exit(__doc__)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}")
    check_linear_attention()
    check_sliding_blocked()
    check_mistral()
    check_llama()
    check_decode()
    check_bos_isolation()
    check_names_init_roundtrip()
    if corelm:
        check_corelm_checkpoint(corelm)
    if FAILURES:
        print(f"torch_hybrid_selfcheck: {len(FAILURES)} FAILED: {', '.join(FAILURES)}")
        sys.exit(1)
    print("torch_hybrid_selfcheck: all checks passed")


if __name__ == "__main__":
    main()
