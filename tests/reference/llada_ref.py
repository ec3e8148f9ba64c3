"""llada_ref.py — an independent NumPy (float64) LLaDA forward pass for checking `unmask logits`.

Written from docs/model-spec.md §1-2 only (not from the C code): embedding, per layer
RMSNorm -> q/k/v -> rotate-half RoPE -> bidirectional attention (padded keys excluded for every
query, GQA by contiguous groups) -> attn_out + residual, RMSNorm -> silu(ff_proj)*up_proj -> ff_out +
residual, then ln_f and the LM head (transformer.ff_out, or wte when weight_tying).

For the KV-cache generators (decode_ref.py) two more entry points, written from the description of
the cache strategies (not from the C code): forward_kv() runs the full canvas and also returns every
layer's keys (after RoPE: positions are fixed) and values; forward_rows() runs only the rows
[lo, hi) of a canvas at their absolute positions, with each layer's keys/values given by a function
of that layer's fresh rows (the caller decides: cached prefix ++ fresh, or the cache with the rows
replaced), and returns logits for those rows only.
"""
import json
import os

import numpy as np

from st_read import read_checkpoint

PREFIX = "model.transformer."


class LLaDARef:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.w = read_checkpoint(model_dir)
        c = self.cfg
        self.d = c["d_model"]
        self.n_heads = c["n_heads"]
        self.n_kv = c.get("n_kv_heads") or self.n_heads
        self.hd = self.d // self.n_heads
        self.n_layers = c["n_layers"]
        self.eps = c.get("rms_norm_eps", 1e-5)
        self.theta = c.get("rope_theta", 10000.0)

    def t(self, name):
        return self.w[PREFIX + name]

    def rmsnorm(self, x, w):
        r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return w * (x * r)

    def rope(self, x, pos):
        # x: [heads, T, hd]; rotate-half over the full head_dim
        dim = self.hd
        inv_freq = 1.0 / (self.theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        freqs = pos[:, None].astype(np.float64) * inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb), np.sin(emb)
        x1, x2 = x[..., :dim // 2], x[..., dim // 2:]
        rot = np.concatenate([-x2, x1], axis=-1)
        return x * cos + rot * sin

    def forward(self, tokens, key_valid=None, positions=None):
        """Logits [T, embedding rows] (float64) for one sequence."""
        tokens = np.asarray(tokens)
        T = len(tokens)
        pos = np.arange(T) if positions is None else np.asarray(positions)
        bias = np.zeros((T, T))
        if key_valid is not None:
            kv = np.asarray(key_valid)
            bias[:, kv == 0] = -np.inf
        return self._run(tokens, pos, lambda l, k, v: (k, v), bias)

    def forward_kv(self, tokens):
        """(logits [T, rows], kv) for the full canvas; kv[l] = (K, V), each [n_kv, T, hd], K rotated."""
        tokens = np.asarray(tokens)
        kv = []

        def keep(l, k, v):
            kv.append((k, v))
            return k, v
        return self._run(tokens, np.arange(len(tokens)), keep, None), kv

    def forward_rows(self, tokens, lo, hi, keys):
        """Logits of rows [lo, hi) of the canvas `tokens`, run at positions lo..hi-1 only.
        keys(l, k, v) -> (K, V) the attention of layer l uses, given that layer's fresh k/v rows."""
        tokens = np.asarray(tokens)[lo:hi]
        return self._run(tokens, np.arange(lo, hi), keys, None)

    def _run(self, tokens, pos, keys, bias):
        T = len(tokens)
        x = self.t("wte.weight")[tokens]
        group = self.n_heads // self.n_kv
        for l in range(self.n_layers):
            b = lambda n: self.t(f"blocks.{l}.{n}.weight")  # noqa: E731
            h = self.rmsnorm(x, b("attn_norm"))
            q = (h @ b("q_proj").T).reshape(T, self.n_heads, self.hd).transpose(1, 0, 2)
            k = (h @ b("k_proj").T).reshape(T, self.n_kv, self.hd).transpose(1, 0, 2)
            v = (h @ b("v_proj").T).reshape(T, self.n_kv, self.hd).transpose(1, 0, 2)
            q, k = self.rope(q, pos), self.rope(k, pos)
            k, v = keys(l, k, v)
            k = np.repeat(k, group, axis=0)      # q-head h -> kv-head h // group
            v = np.repeat(v, group, axis=0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(self.hd)
            if bias is not None:
                s = s + bias[None]
            s = s - s.max(axis=-1, keepdims=True)
            p = np.exp(s)
            p = p / p.sum(axis=-1, keepdims=True)
            a = (p @ v).transpose(1, 0, 2).reshape(T, self.d)
            x = x + a @ b("attn_out").T
            h = self.rmsnorm(x, b("ff_norm"))
            g = h @ b("ff_proj").T
            u = h @ b("up_proj").T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ b("ff_out").T
        x = self.rmsnorm(x, self.t("ln_f.weight"))
        head = self.t("wte.weight") if self.cfg.get("weight_tying") else self.t("ff_out.weight")
        return x @ head.T
