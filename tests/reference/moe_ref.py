"""moe_ref.py — an independent NumPy reference of the MoE families (LLaDA-MoE, LLaDA2) for checking
`unmask logits` and `unmask generate` on their checkpoints.

Written from docs/model-spec.md §2c (LLaDA-MoE, LLaDA2) and docs/decode.md ("LLaDA2 decode rules"),
not from the C code:

MoERef.forward (float64): embedding; per layer input_layernorm -> q, k, v (LLaDA2: rows of the fused
query_key_value, q | k | v) -> per-head RMSNorm of q and k (QK-norm, weight [head_dim]) -> rotate-half
RoPE on the first rot_dim = head_dim * partial_rotary_factor dims of each head -> attention (GQA,
bidirectional, or block-causal: query i sees key j iff j // B <= i // B) -> output projection +
residual; post_attention_layernorm -> a dense SwiGLU MLP (LLaDA2 layers < first_k_dense_replace) or
the MoE block + residual; model.norm, lm_head.
Routers:
  LLaDA-MoE: p = softmax(router logits) over all experts, p += expert_bias (when enabled), the top-k
  of p are chosen and those (biased) values are the weights, no renormalisation.
  LLaDA2: s = sigmoid(logits); sb = s + expert_bias; group score = sum of the two largest sb in
  each of n_group equal groups; keep the topk_group best groups; top-k of sb inside them; weights =
  s[idx] / (sum s[idx] + 1e-20) * routed_scaling_factor.
  MoE output = sum_k w_k * expert_k(h) + shared_expert(h).
Ties go to the lower index (stable order). Options build deliberately wrong variants so the tests can
show each rule matters: group_limit=False (plain top-k), bias_in_weights (LLaDA-MoE: use the unbiased
softmax as weights), no_bias, qk_norm=False, full_rotary.

llada2_generate: the official LLaDA2 `generate` (docs/decode.md): blocks of B aligned to absolute
position 0, the canvas padded with masks to whole blocks, `steps` per block (capped at gen_length),
per-step quota B // steps (+1 for the first B % steps steps), each step: greedy x0 and its softmax
probability at the masked positions of the current block (the forward covers the canvas up to the end
of that block, block-causal), commit every position with confidence > threshold when at least the
quota clear it, else the quota most confident; after a block that holds EOS the generation stops;
the output is the generated region cut at gen_length and after the first EOS.

hierarchy_block_generate: Fast-dLLM v2's hierarchical block decoding (SGLang HierarchyBlock,
docs/decode.md "hierarchy_block") on the same block loop: sub-blocks in order, threshold else top-1,
the token shift and the inherited first token of a block.
"""
import json
import os

import numpy as np

from st_read import read_checkpoint


class MoERef:
    def __init__(self, model_dir, group_limit=True, bias_in_weights=True, no_bias=False, qk_norm=True,
                 full_rotary=False):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = c = json.load(f)
        self.w = read_checkpoint(model_dir)
        self.l2 = c["architectures"][0] == "LLaDA2MoeModelLM"
        self.d = c["hidden_size"]
        self.H = c["num_attention_heads"]
        self.KV = c.get("num_key_value_heads") or self.H
        self.hd = c.get("head_dim") or self.d // self.H
        self.L = c["num_hidden_layers"]
        self.eps = c["rms_norm_eps"]
        self.theta = c["rope_theta"]
        prf = c.get("partial_rotary_factor", 1.0)
        self.rot = self.hd if full_rotary else int(self.hd * prf)
        self.E = c["num_experts"]
        self.K = c["num_experts_per_tok"]
        if self.l2:
            self.first_dense = c.get("first_k_dense_replace", 0)
            self.n_group, self.topk_group = c["n_group"], c["topk_group"]
            self.scale = c["routed_scaling_factor"]
            self.qk = c.get("use_qk_norm", True)
            self.pre = "model.layers.{}."
            self.emb, self.head = "model.word_embeddings.weight", "lm_head.weight"
        else:
            freq = c.get("moe_layer_freq") or [1] * self.L
            self.first_dense = sum(1 for v in freq if v == 0)
            self.qk = bool(c.get("qk_layernorm"))
            self.emb, self.head = "model.embed_tokens.weight", "lm_head.weight"
        self.qk = self.qk and qk_norm
        self.group_limit = group_limit
        self.bias_in_weights = bias_in_weights
        self.no_bias = no_bias
        self.route_log = []   # per MoE layer: [T, K] chosen experts of the last forward

    def rms(self, x, w):
        return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps))

    def rope(self, x, pos):
        r = self.rot
        inv = 1.0 / (self.theta ** (np.arange(0, r, 2, dtype=np.float64) / r))
        f = pos[:, None].astype(np.float64) * inv[None, :]
        emb = np.concatenate([f, f], axis=-1)            # [T, r]
        xr, xp = x[..., :r], x[..., r:]
        x1, x2 = xr[..., :r // 2], xr[..., r // 2:]
        out = xr * np.cos(emb)[:, None, :] + np.concatenate([-x2, x1], axis=-1) * np.sin(emb)[:, None, :]
        return np.concatenate([out, xp], axis=-1)

    @staticmethod
    def topk(v, k):
        return np.argsort(-v, kind="stable")[:k]

    def route(self, logits, bias):
        """(idx[K], w[K]) of one token."""
        if bias is None or self.no_bias:
            bias = np.zeros(self.E)
        if not self.l2:
            p = np.exp(logits - logits.max())
            p = p / p.sum()
            pb = p + bias
            idx = self.topk(pb, self.K)
            return idx, (pb[idx] if self.bias_in_weights else p[idx])
        s = 1.0 / (1.0 + np.exp(-logits))
        sb = s + bias
        if self.group_limit:
            per = self.E // self.n_group
            g = sb.reshape(self.n_group, per)
            gs = np.array([np.sort(row)[::-1][:2].sum() for row in g])
            keep = self.topk(gs, self.topk_group)
            masked = np.full(self.E, -np.inf)
            for gi in keep:
                masked[gi * per:(gi + 1) * per] = sb[gi * per:(gi + 1) * per]
            sb = masked
        idx = self.topk(sb, self.K)
        w = s[idx]
        if self.K > 1:
            w = w / (w.sum() + 1e-20)
        return idx, w * self.scale

    def mlp(self, h, p):
        g = h @ self.w[p + "gate_proj.weight"].T
        u = h @ self.w[p + "up_proj.weight"].T
        return ((g / (1.0 + np.exp(-g))) * u) @ self.w[p + "down_proj.weight"].T

    def moe(self, h, l):
        W = self.w
        p = f"model.layers.{l}."
        logits = h @ W[p + "mlp.gate.weight"].T
        bname = p + ("mlp.gate.expert_bias" if self.l2 else "mlp.expert_bias")
        bias = W.get(bname)
        out = np.zeros_like(h)
        chosen = []
        for t in range(h.shape[0]):
            idx, wt = self.route(logits[t], bias)
            chosen.append(idx)
            for e, we in zip(idx, wt):
                out[t] += we * self.mlp(h[t:t + 1], p + f"mlp.experts.{e}.")[0]
        self.route_log.append(np.array(chosen))
        sh = p + ("mlp.shared_experts." if self.l2 else "shared_expert.")
        if sh + "gate_proj.weight" in W:
            out = out + self.mlp(h, sh)
        return out

    def forward(self, tokens, block=0):
        """Logits [T, vocab] (float64) of one sequence at positions 0..T-1; block > 0: block-causal."""
        tokens = np.asarray(tokens)
        T = len(tokens)
        pos = np.arange(T)
        W = self.w
        H, KV, hd = self.H, self.KV, self.hd
        self.route_log = []
        x = W[self.emb][tokens]
        if block > 0:
            allowed = (pos[None, :] // block) <= (pos[:, None] // block)
        else:
            allowed = np.ones((T, T), dtype=bool)
        for l in range(self.L):
            p = f"model.layers.{l}."
            h = self.rms(x, W[p + "input_layernorm.weight"])
            if self.l2:
                qkv = h @ W[p + "attention.query_key_value.weight"].T
                q, k, v = qkv[:, :H * hd], qkv[:, H * hd:(H + KV) * hd], qkv[:, (H + KV) * hd:]
                qn, kn, o = "attention.query_layernorm.weight", "attention.key_layernorm.weight", "attention.dense.weight"
            else:
                q = h @ W[p + "self_attn.q_proj.weight"].T
                k = h @ W[p + "self_attn.k_proj.weight"].T
                v = h @ W[p + "self_attn.v_proj.weight"].T
                qn, kn, o = "self_attn.q_norm.weight", "self_attn.k_norm.weight", "self_attn.o_proj.weight"
            q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
            if self.qk:
                q, k = self.rms(q, W[p + qn]), self.rms(k, W[p + kn])
            q, k = self.rope(q, pos), self.rope(k, pos)
            q, k, v = q.transpose(1, 0, 2), np.repeat(k.transpose(1, 0, 2), H // KV, axis=0), \
                np.repeat(v.transpose(1, 0, 2), H // KV, axis=0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
            s = np.where(allowed[None], s, -np.inf)
            s = s - s.max(axis=-1, keepdims=True)
            a = np.exp(s)
            a = a / a.sum(axis=-1, keepdims=True)
            att = (a @ v).transpose(1, 0, 2).reshape(T, H * hd)
            x = x + att @ W[p + o].T
            h = self.rms(x, W[p + "post_attention_layernorm.weight"])
            x = x + (self.mlp(h, p + "mlp.") if l < self.first_dense else self.moe(h, l))
        x = self.rms(x, W["model.norm.weight"])
        head = W[self.emb] if self.cfg.get("tie_word_embeddings") else W[self.head]
        return x @ head.T


def _canvas(prompt, gen_length, block_length, mask_id):
    """The prompt followed by masks up to the end of the last aligned block; the block count."""
    P = len(prompt)
    nb = (P + gen_length + block_length - 1) // block_length
    x = np.full(nb * block_length, mask_id, dtype=np.int64)
    x[:P] = prompt
    return x, nb


def _greedy(ref, x, lo, hi, block_length, mask_id):
    """Temperature 0 on the active block [lo, hi): x0 (argmax, never the mask token) and its
    softmax probability, from a block-causal forward of the canvas up to hi."""
    logits = ref.forward(x[:hi], block=block_length)[lo:hi]
    z = logits - logits.max(axis=-1, keepdims=True)
    pr = np.exp(z)
    pr = pr / pr.sum(axis=-1, keepdims=True)
    pr[:, mask_id] = 0.0          # unmask rule: the mask token is never sampled
    x0 = np.argmax(pr, axis=-1)
    return x0, pr[np.arange(hi - lo), x0]


def _output(x, P, gen_length, eos_id):
    """The generated tokens, cut after the first EOS."""
    out = [int(t) for t in x[P:P + gen_length]]
    if eos_id in out:
        out = out[:out.index(eos_id) + 1]
    return out


def llada2_generate(ref, prompt, gen_length, block_length, steps, threshold, mask_id, eos_id):
    """The official LLaDA2 generate at temperature 0 (docs/decode.md). Returns (tokens of the output,
    list of per-step commits [(pos, id), ...] in order)."""
    steps = min(steps, gen_length)
    P = len(prompt)
    x, nb = _canvas(prompt, gen_length, block_length, mask_id)
    quota = [block_length // steps + (1 if s < block_length % steps else 0) for s in range(steps)]
    log = []
    for b in range(P // block_length, nb):
        lo, hi = b * block_length, (b + 1) * block_length
        for s in range(steps):
            masked = x[lo:hi] == mask_id
            if not masked.any():
                break
            x0, p = _greedy(ref, x, lo, hi, block_length, mask_id)
            conf = np.where(masked, p, -np.inf)
            high = conf > threshold
            if high.sum() >= quota[s]:
                sel = np.nonzero(high)[0]
            else:
                sel = np.argsort(-conf, kind="stable")[:min(quota[s], int(masked.sum()))]
            sel = sorted(int(i) for i in sel)
            for i in sel:
                x[lo + i] = x0[i]
            log.append([(lo + i, int(x0[i])) for i in sel])
        if eos_id is not None and (x[P:hi] == eos_id).any():
            break
    return _output(x, P, gen_length, eos_id), log


def llada2_generate_joint(ref, prompt, gen_length, block_length, threshold, edit_threshold, max_post, mask_id, eos_id):
    """SGLang's JointThreshold (LLaDA2.1 token editing, docs/decode.md) at temperature 0 on the official
    LLaDA2 block loop: every forward of a block is a step; masked positions with p > threshold are
    written (else the most confident masked one); positions written earlier in the block (not the
    prompt's) whose argmax differs with p > edit_threshold are rewritten; once no mask is left each
    step counts as a post step, and after max_post of them (or a step that writes nothing) the
    block ends. Returns (output tokens, per-forward writes [(pos, id), ...] — [] for a forward that
    wrote nothing)."""
    P = len(prompt)
    x, nb = _canvas(prompt, gen_length, block_length, mask_id)
    log = []
    for b in range(P // block_length, nb):
        lo, hi = b * block_length, (b + 1) * block_length
        prompt_mask = x[lo:hi] != mask_id
        post = 0
        while True:
            x0, p = _greedy(ref, x, lo, hi, block_length, mask_id)
            masked = x[lo:hi] == mask_id
            m2t = np.zeros(hi - lo, dtype=bool)
            if masked.any():
                m2t = masked & (p > threshold)
                if not m2t.any():
                    m2t[int(np.argmax(np.where(masked, p, -np.inf)))] = True
            else:
                post += 1
                if post > max_post:
                    log.append([])
                    break
            t2t = ~masked & ~prompt_mask & (x[lo:hi] != x0) & (p > edit_threshold)
            w = m2t | t2t
            if not w.any():
                log.append([])
                break
            sel = [int(i) for i in np.nonzero(w)[0]]
            for i in sel:
                x[lo + i] = x0[i]
            log.append([(lo + i, int(x0[i])) for i in sel])
        if eos_id is not None and (x[P:hi] == eos_id).any():
            break
    return _output(x, P, gen_length, eos_id), log


def hierarchy_block_generate(ref, prompt, gen_length, block_length, sub_block, threshold, mask_id, eos_id,
                             token_shift=1):
    """Fast-dLLM v2's hierarchical block decoding (SGLang HierarchyBlock, docs/decode.md) at temperature
    0 on the LLaDA2 block loop, from the algorithm's description: the sub-blocks [s, s + sub_block) of
    each aligned block are decoded in order; while one holds a mask, a block-causal forward scores its
    masked positions — with the token shift position p from logits row p - 1 — and the ones with
    probability > threshold are written, else the single most probable. With the token shift a block
    whose first position is masked first gets the inherited token: the argmax of the last row of the
    previous block's final forward (for the first decoded block, the prompt's last row), written
    before any forward of the block. Returns (output tokens, per-step writes [(pos, id), ...]; the
    inheritance counts as a step of its own, as it takes that forward)."""
    P = len(prompt)
    x, nb = _canvas(prompt, gen_length, block_length, mask_id)
    log = []
    for b in range(P // block_length, nb):
        lo, hi = b * block_length, (b + 1) * block_length
        if token_shift and lo > 0 and x[lo] == mask_id:
            x0, _ = _greedy(ref, x, lo - 1, lo, block_length, mask_id)   # the final forward's last row
            x[lo] = x0[0]
            log.append([(lo, int(x0[0]))])
        for s0 in range(lo, hi, sub_block):
            s1 = min(s0 + sub_block, hi)
            while (x[s0:s1] == mask_id).any():
                r0 = s0 - 1 if token_shift and s0 > 0 else s0     # rows scoring positions s0..s1-1
                rows_x0, rows_p = _greedy(ref, x, r0, hi, block_length, mask_id)
                if token_shift and s0 > 0:
                    x0, p = rows_x0[:s1 - s0], rows_p[:s1 - s0]
                elif token_shift:                                   # position 0 keeps its own row
                    x0 = np.concatenate([rows_x0[:1], rows_x0[:s1 - s0 - 1]])
                    p = np.concatenate([rows_p[:1], rows_p[:s1 - s0 - 1]])
                else:
                    x0, p = rows_x0[:s1 - s0], rows_p[:s1 - s0]
                masked = x[s0:s1] == mask_id
                conf = np.where(masked, p, -np.inf)
                sel = conf > threshold
                if not sel.any():
                    sel[int(np.argmax(conf))] = True
                idx = [int(i) for i in np.nonzero(sel & masked)[0]]
                for i in idx:
                    x[s0 + i] = x0[i]
                log.append([(s0 + i, int(x0[i])) for i in idx])
        if eos_id is not None and (x[P:hi] == eos_id).any():
            break
    return _output(x, P, gen_length, eos_id), log
