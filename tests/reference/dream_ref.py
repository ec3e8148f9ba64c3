"""dream_ref.py — an independent NumPy reference of Dream-v0-Instruct-7B for checking `unmask logits` and
`unmask generate` on Dream-layout checkpoints.

Written from docs/model-spec.md (Dream) and docs/decode.md (Dream decoders), not from the C code:

DreamRef.forward: the Qwen2 decoder in float64 — embed_tokens, per layer input_layernorm (RMSNorm) ->
q/k/v projections WITH bias -> rotate-half RoPE (theta from config) -> bidirectional attention (GQA:
q-head h reads kv-head h // (heads / kv_heads)) -> o_proj (no bias) + residual, post_attention_layernorm
-> down(silu(gate) * up) + residual, then model.norm and lm_head (embed_tokens when tie_word_embeddings).
It returns the RAW output rows (row i predicts token i + 1), as `unmask logits` writes them.

dream_generate: Dream's `diffusion_generate` / `_sample` loop:
  timesteps = linspace(1, eps, steps + 1) in float32 as torch computes it (step = (eps - 1) / steps,
  first half 1 + step * i, second half eps - step * (steps - i), each product rounded to float32);
  every step: logits of the whole canvas, shifted (row p scores position p from output row p - 1, row 0
  keeps row 0); for alg = origin each masked position is committed with probability 1 - s/t (all at the
  last step); else confidence per masked position (maskgit_plus: probability of x0, topk_margin: top-1
  minus top-2 probability, entropy: sum p * log(p + 1e-10); probabilities of logits / temperature after
  top_p then top_k filtering) and the k = int(float32(n_masked) * (1 - s/t)) best (all at the last step)
  are committed; alg_temp > 0 samples them from softmax(confidence / alg_temp) instead.
Plus the rules docs/decode.md adds (each marked "unmask rule"): the mask token is never sampled; the
random draws are util/rng.h's counter-based hash (decode_ref.rng_u01) keyed (seed, step, pos*vocab+tok)
for the tokens' Gumbel noise, (seed, 2**61 | step, pos) for origin's transfer draws and
(seed, 2**60 | step, pos) for alg_temp's Gumbel noise (sampling without replacement = Gumbel top-k);
ties broken by the lower position; blockwise mode: the steps are split evenly over blocks of
block_length and each block runs the schedule on its own masks.
"""
import json
import os

import numpy as np

from decode_ref import rng_u01
from st_read import read_checkpoint

ORIGIN_STREAM = 1 << 61
ALG_TEMP_STREAM = 1 << 60


class DreamRef:
    def __init__(self, model_dir, zero_bias=False):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = c = json.load(f)
        self.w = read_checkpoint(model_dir)
        self.d = c["hidden_size"]
        self.n_heads = c["num_attention_heads"]
        self.n_kv = c["num_key_value_heads"]
        self.hd = self.d // self.n_heads
        self.n_layers = c["num_hidden_layers"]
        self.eps = c["rms_norm_eps"]
        self.theta = c["rope_theta"]
        self.zero_bias = zero_bias       # for checking that the biases matter

    def rmsnorm(self, x, w):
        return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps))

    def rope(self, x, pos):
        dim = self.hd
        inv_freq = 1.0 / (self.theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        freqs = pos[:, None].astype(np.float64) * inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        x1, x2 = x[..., :dim // 2], x[..., dim // 2:]
        return x * np.cos(emb) + np.concatenate([-x2, x1], axis=-1) * np.sin(emb)

    def forward(self, tokens):
        """Raw logits [T, vocab_size] (float64) of one sequence at positions 0..T-1."""
        tokens = np.asarray(tokens)
        T = len(tokens)
        pos = np.arange(T)
        W = self.w
        x = W["model.embed_tokens.weight"][tokens]
        group = self.n_heads // self.n_kv
        for l in range(self.n_layers):
            p = f"model.layers.{l}."

            def lin(name, h, bias=False):
                y = h @ W[p + name + ".weight"].T
                if bias and not self.zero_bias:
                    y = y + W[p + name + ".bias"]
                return y
            h = self.rmsnorm(x, W[p + "input_layernorm.weight"])
            q = lin("self_attn.q_proj", h, True).reshape(T, self.n_heads, self.hd).transpose(1, 0, 2)
            k = lin("self_attn.k_proj", h, True).reshape(T, self.n_kv, self.hd).transpose(1, 0, 2)
            v = lin("self_attn.v_proj", h, True).reshape(T, self.n_kv, self.hd).transpose(1, 0, 2)
            q, k = self.rope(q, pos), self.rope(k, pos)
            k = np.repeat(k, group, axis=0)
            v = np.repeat(v, group, axis=0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(self.hd)
            s = s - s.max(axis=-1, keepdims=True)
            a = np.exp(s)
            a = a / a.sum(axis=-1, keepdims=True)
            o = (a @ v).transpose(1, 0, 2).reshape(T, self.d)
            x = x + lin("self_attn.o_proj", o)
            h = self.rmsnorm(x, W[p + "post_attention_layernorm.weight"])
            g = lin("mlp.gate_proj", h)
            u = lin("mlp.up_proj", h)
            x = x + lin("mlp.down_proj", (g / (1.0 + np.exp(-g))) * u)
        x = self.rmsnorm(x, W["model.norm.weight"])
        head = W["model.embed_tokens.weight"] if self.cfg.get("tie_word_embeddings") else W["lm_head.weight"]
        return x @ head.T


def torch_linspace_f32(start, end, n):
    """torch.linspace(start, end, n) in float32 (the kernel's formula, products rounded to float32)."""
    f = np.float32
    start, end = f(start), f(end)
    step = f((end - start) / f(n - 1))
    out = np.empty(n, dtype=np.float32)
    half = n // 2
    for i in range(n):
        out[i] = f(start + f(step * f(i))) if i < half else f(end - f(step * f(n - 1 - i)))
    return out


def _probs(l, T, top_p, top_k):
    """Dream's sample_tokens probabilities: l / T, top_p then top_k filtering, softmax (float64)."""
    z = l / T if T > 0 else l.copy()
    if top_p < 1.0:
        order = sorted(range(len(z)), key=lambda t: (-z[t], t))
        zs = z[order]
        e = np.exp(zs - zs[0])
        cum = np.cumsum(e / e.sum())
        remove = np.zeros(len(z), dtype=bool)
        remove[1:] = cum[:-1] > top_p
        z[np.array(order)[remove]] = -np.inf
    if top_k > 0 and top_k < len(z):
        kth = np.sort(z)[::-1][top_k - 1]
        z[z < kth] = -np.inf
    e = np.exp(z - np.max(z))
    return e / e.sum()


def dream_generate(forward, prompt, gen_length, steps, alg, mask_id, vocab, block_length=None, temperature=0.0,
                   top_p=1.0, top_k=0, alg_temp=0.0, eps=1e-3, seed=0):
    """Per step, the sorted (pos, token) pairs committed (a step may commit none)."""
    Lp = len(prompt)
    x = list(prompt) + [mask_id] * gen_length
    B = block_length or gen_length
    blocks = [(a, min(a + B, Lp + gen_length)) for a in range(Lp, Lp + gen_length, B)]
    assert steps % len(blocks) == 0, "the reference splits steps evenly over blocks"
    S = steps // len(blocks)
    out = []
    step = 0
    for lo, hi in blocks:
        ts = torch_linspace_f32(1.0, eps, S + 1)
        for i in range(S):
            raw = forward(x)
            lg = np.concatenate([raw[:1], raw[:-1]], axis=0)       # the shift
            masked = [p for p in range(lo, hi) if x[p] == mask_id]
            t, s = ts[i], ts[i + 1]
            last = i == S - 1
            x0 = {}
            for p in masked:
                l = lg[p].copy()
                ls = l.copy()
                ls[mask_id] = -np.inf                                # unmask rule: never sample MASK
                if temperature == 0:
                    x0[p] = int(np.argmax(ls))
                else:
                    u = rng_u01(seed, step, p * vocab + np.arange(vocab))
                    x0[p] = int(np.argmax(ls / temperature - np.log(-np.log(u))))
            if alg == "origin":
                pt = np.float32(1.0) if last else np.float32(np.float32(1.0) - np.float32(s / t))
                commit = [p for p in masked
                          if last or np.float32(rng_u01(seed, ORIGIN_STREAM | step, [p])[0]) < pt]
            else:
                n = len(masked)
                k = n if last else int(np.float32(np.float32(n) * np.float32(np.float32(1.0) - np.float32(s / t))))
                conf = {}
                for p in masked:
                    pr = _probs(lg[p].copy(), temperature, top_p, top_k)
                    if alg == "maskgit_plus":
                        c = pr[x0[p]]
                    elif alg == "topk_margin":
                        srt = np.sort(pr)[::-1]
                        c = srt[0] - srt[1]
                    elif alg == "entropy":
                        c = float(np.sum(pr * np.log(pr + 1e-10)))
                    else:
                        raise ValueError(alg)
                    if alg_temp > 0:
                        u = rng_u01(seed, ALG_TEMP_STREAM | step, [p])[0]
                        c = c / alg_temp - np.log(-np.log(u))
                    conf[p] = c
                commit = sorted(masked, key=lambda p: (-conf[p], p))[:k] if k > 0 else []
            for p in commit:
                x[p] = x0[p]
            out.append(sorted((p, x0[p]) for p in commit))
            step += 1
    return out, x
