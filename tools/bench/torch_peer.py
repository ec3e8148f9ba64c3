#!/usr/bin/python3
"""torch_peer.py — the PyTorch peers of `unmask bench`: the same LLaDA forward (and the same dual-cache
decode loop) on the same checkpoint in PyTorch, so docs/perf.md and docs/gpu.md can give unmask's times
as a ratio to them, measured on the same machine in the same run.

Our own code, written from docs/model-spec.md and docs/decode.md (KV caches): embedding, per layer
RMSNorm -> q/k/v -> rotate-half RoPE -> bidirectional softmax attention -> attn_out + residual ->
RMSNorm -> silu(gate) * up -> down + residual, then ln_f and the LM head. Weights are read from the
safetensors files as stored (bf16 -> exactly the same values in fp32).

Two peers (--peer eager|strong|both [both]; `best` in each row names the faster):
  eager   the forward as written above, op by op, with a host sync per decode step (the loop asks the
          device whether the block still has masked positions); the peer of the earlier docs/perf.md rows.
  strong  the same function written the way a careful engineer serves it: q/k/v weights concatenated
          into one GEMM and gate/up into another (the eager peer reads the same tensors through views:
          no second copy), the RoPE tables computed once, SDPA attention (F.scaled_dot_product_attention),
          the LM head on the block's rows only, the commit (softmax confidence, argmax, threshold, the
          canvas update) inside the step on the device, KV caches and the canvas in preallocated buffers
          updated in place, no host sync per step (the loop reads the count of masked positions left one
          step late, so the device queue never drains), and each step kind (full canvas, cache refresh,
          block window) under torch.compile: mode="reduce-overhead" (CUDA graphs) on CUDA, the default
          mode on the CPU (--compile off: uncompiled). A PyTorch without torch.compile or without SDPA
          (Debian 12's 1.13) runs it uncompiled / with the explicit softmax attention and says so on
          stderr and in the row (strong_compiled). Compile and warm-up (the first 3 calls of each step
          kind) are not in the timed steps: strong_compile_s (the first calls) and strong_warmup_s.

Modes (--dtype): fp32 (fp32 weights and compute) and bf16 (torch.autocast on the CPU with bfloat16:
the matmuls in bf16 through oneDNN); `both` times each and reports the faster per row, as the issue
asks ("whichever is faster"). The process re-executes itself once with OMP_NUM_THREADS /
OPENBLAS_NUM_THREADS = --threads and GOMP_SPINCOUNT=20000 (unmask's own OpenMP spin policy) unless
they are set: PyTorch's OpenMP pool and OpenBLAS's own pool otherwise default to other sizes and
spin policies and run up to 2x slower than they can.

  forward:  --seq 1,32,256,1024 --batch 1,8     full forwards, logits for every row (as `unmask bench`)
  decode:   --decode --prompt 32 --gen 128 --block 32 --batch 1,8 [--max-blocks N]
            [--cache dual|none|dual,none] [--decoder low_confidence|threshold [--threshold 0.9]]
            dual cache (default): each block one full refresh forward keeping K/V, then forwards of
            the block's rows attending over the cache; none: the reference decode, a full forward of
            the whole canvas every step. low_confidence commits the most confident masked position
            per sequence per step (one token per step); threshold (Fast-dLLM) every masked position
            whose probability is above the threshold, at least the most confident one. Logits for the
            block's rows only. Each sequence decodes its own canvas (commits per sequence). With a list
            of cache modes, --decoder and --max-blocks take one value or one per mode. Each peer warms
            up on the first 3 steps, then the decode is timed (min of --reps); ms/step = wall / forwards.
            Both peers start from the same canvas; same_tokens says whether they committed the same.
  --budget-s S: skip a peer's row when its estimated time (compile included) would end past S seconds
            from the start (the row says so); rows are printed as they finish.
  --device cuda: bf16 weights on the GPU (no autocast), attention through
            F.scaled_dot_product_attention, timings with torch.cuda.synchronize, and the peak memory
            (torch.cuda.max_memory_allocated) and tokens/s in each decode row — the GPU peers of
            `unmask bench --device cuda:0` (scripts/gpu/run-checks.sh bench / lease).
  check:    --check BIN   (CPU, fp32) runs `BIN logits --cpu-kernels fp32` on 64 random tokens and prints the
            largest relative difference of each peer's logits to it (pass: < 1e-4); with --peer both
            also decodes with both peers (no cache and dual cache, low_confidence and a threshold that
            commits several positions per step, batch 2) and checks they commit the same tokens.
            Exit status 1 when any check fails.
Prints one line per row; --json prints the rows as JSON lines.
"""
import argparse
import json
import os
import sys
import time

PEER_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOMP_SPINCOUNT")


def reexec_with_threads(threads):
    if os.environ.get("TORCH_PEER_CHILD"):
        return
    env = dict(os.environ, TORCH_PEER_CHILD="1")
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env.setdefault("OPENBLAS_NUM_THREADS", str(threads))
    env.setdefault("GOMP_SPINCOUNT", "20000")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seq", default="1,32,256,1024")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    ap.add_argument("--peer", choices=["eager", "strong", "both"], default="both")
    ap.add_argument("--compile", choices=["auto", "off"], default="auto",
                    help="strong peer: torch.compile when this PyTorch has it (auto) or never (off)")
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--max-blocks", default="0")
    ap.add_argument("--cache", default="dual")
    ap.add_argument("--decoder", default="low_confidence")
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--budget-s", type=float, default=0.0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="decode: after the strong peer's timed runs, one more under torch.profiler; its kernels' "
                         "device time per step on stderr (where the compiled peer's step goes)")
    ap.add_argument("--check", metavar="BIN", help="compare logits with `BIN logits --cpu-kernels fp32`")
    a = ap.parse_args()
    a.caches = a.cache.split(",")
    if any(c not in ("dual", "none") for c in a.caches):
        ap.error(f"--cache: dual, none or a list of them, got '{a.cache}'")
    a.decoders = per_cache(ap, "--decoder", a.decoder, a.caches, str)
    if any(d not in ("low_confidence", "threshold") for d in a.decoders):
        ap.error(f"--decoder: low_confidence or threshold, got '{a.decoder}'")
    a.max_blocks = per_cache(ap, "--max-blocks", a.max_blocks, a.caches, int)
    if a.gen % a.block or a.block < 1 or a.prompt < 1 or a.reps < 1:
        ap.error("--block must divide --gen; --block, --prompt and --reps must be >= 1")
    if a.check and a.device != "cpu":
        ap.error("--check runs on the CPU in fp32 (unmask logits --cpu-kernels fp32): drop --device cuda")
    return a


def per_cache(ap, name, value, caches, conv):
    """One value for every --cache mode, or one per mode."""
    try:
        v = [conv(x) for x in value.split(",")]
    except ValueError:
        ap.error(f"{name}: bad value '{value}'")
    if len(v) == 1:
        v = v * len(caches)
    if len(v) != len(caches):
        ap.error(f"{name}: one value or one per --cache mode ({len(caches)}), got '{value}'")
    return v


args = parse_args()
reexec_with_threads(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)
T0 = time.perf_counter()
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def note(msg):
    print(f"torch_peer: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- checkpoint

def read_safetensors(path, device):
    """{name: tensor} of one .safetensors file (format: docs/model-spec.md §3), memory-mapped and
    converted one tensor at a time: float32 on the CPU, bfloat16 moved to the GPU for cuda."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    n = int.from_bytes(raw[:8].tobytes(), "little")
    header = json.loads(raw[8:8 + n].tobytes())
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf = np.array(raw[8 + n + b:8 + n + e])
        if info["dtype"] == "BF16":
            t = torch.from_numpy(buf.view("<i2")).view(torch.bfloat16)
        elif info["dtype"] == "F32":
            t = torch.from_numpy(buf.view("<f4"))
        elif info["dtype"] == "F16":
            t = torch.from_numpy(buf.view("<f2"))
        else:
            raise ValueError(f"{name}: dtype {info['dtype']}")
        t = t.reshape(info["shape"])
        out[name] = t.to(device="cuda", dtype=torch.bfloat16) if device == "cuda" else t.float()
    return out


def load(model_dir, device):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    w = {}
    for fn in sorted(os.listdir(model_dir)):
        if fn.endswith(".safetensors"):
            w.update(read_safetensors(os.path.join(model_dir, fn), device))
    return cfg, w


# ---------------------------------------------------------------- what both peers share

def rms_norm(x, g, eps):
    return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_rotate(x, cos, sin):
    """Rotate-half RoPE over the whole head: x [B, H, T, hd], cos / sin [T, hd] in x's dtype."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def rope_angles(theta, hd, pos):
    """The rotation angles of positions pos [T], float64 [T, hd] (both halves)."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos.to(torch.float64)[:, None] * inv.to(pos.device)[None, :]
    return torch.cat([ang, ang], dim=-1)


def predictions(logits, mask_id):
    """(confidence, token) [B, rows] of logits [B, rows, V], as unmask's sampler at temperature 0: the
    most probable token other than the mask token, and its probability."""
    p = torch.softmax(logits.float(), dim=-1)
    p[..., mask_id] = -1.0
    return p.max(dim=-1)


def commit_tokens(logits, block, mask_id, decoder, threshold):
    """One decode step's commit for each sequence of the batch: logits [B, block, V] of the block's rows,
    block [B, block] its tokens; returns the block with the committed positions filled. low_confidence:
    the most confident masked position; threshold: every masked position whose probability is above
    the threshold, at least the most confident one."""
    conf, tok = predictions(logits, mask_id)
    masked = block == mask_id
    conf = conf.masked_fill(~masked, -1.0)
    top = torch.zeros_like(masked).scatter_(1, conf.argmax(dim=-1, keepdim=True), True)
    sel = top if decoder == "low_confidence" else (conf > threshold) | top
    return torch.where(sel & masked, tok, block)


def initial_canvas(vocab, mask_id, B, prompt, gen, device):
    """B random prompts (seed 7) followed by gen masks: the canvas both peers start from."""
    g = torch.Generator().manual_seed(7)
    return torch.cat([torch.randint(0, vocab, (B, prompt), generator=g),
                      torch.full((B, gen), mask_id)], dim=1).to(device)


def fuse_weights(cfg, w):
    """q/k/v -> one [q; k; v] weight and gate/up -> one [gate; up] weight per layer (`qkv`, `gate_up`);
    the separate names become row views of them, so both peers share one copy of the weights."""
    p = "model.transformer."
    for i in range(cfg["n_layers"]):
        b = f"{p}blocks.{i}."
        for fused, parts in (("qkv", ("q_proj", "k_proj", "v_proj")), ("gate_up", ("ff_proj", "up_proj"))):
            ws = [w.pop(b + k + ".weight") for k in parts]
            w[b + fused + ".weight"] = torch.cat(ws, dim=0)
            del ws
            views = w[b + fused + ".weight"].split([int(t) for t in part_rows(cfg, parts)], dim=0)
            for k, v in zip(parts, views):
                w[b + k + ".weight"] = v


def part_rows(cfg, parts):
    d = cfg["d_model"]
    hd = d // cfg["n_heads"]
    kv = (cfg.get("n_kv_heads") or cfg["n_heads"]) * hd
    ffn = cfg["mlp_hidden_size"]
    return [{"q_proj": d, "k_proj": kv, "v_proj": kv, "ff_proj": ffn, "up_proj": ffn}[k] for k in parts]


# ---------------------------------------------------------------- the eager peer

class LLaDA:
    def __init__(self, cfg, w, sdpa=False):
        p = "model.transformer."
        self.sdpa = sdpa
        self.d = cfg["d_model"]
        self.H = cfg["n_heads"]
        self.KV = cfg.get("n_kv_heads") or self.H
        self.hd = self.d // self.H
        self.eps = cfg.get("rms_norm_eps", 1e-5)
        self.theta = cfg.get("rope_theta", 10000.0)
        self.mask_id = cfg["mask_token_id"]
        self.wte = w[p + "wte.weight"]
        self.ln_f = w[p + "ln_f.weight"]
        self.head = self.wte if cfg.get("weight_tying") else w[p + "ff_out.weight"]
        self.layers = []
        for i in range(cfg["n_layers"]):
            b = f"{p}blocks.{i}."
            self.layers.append({k: w[b + k + ".weight"] for k in
                                ["attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj",
                                 "up_proj", "ff_out", "qkv", "gate_up"]})

    def rms(self, x, g):
        return rms_norm(x, g, self.eps)

    def rope(self, x, pos):
        # x [B, H, T, hd]; angles in float64, computed per call
        ang = rope_angles(self.theta, self.hd, pos)
        return rope_rotate(x, ang.cos().to(x.dtype), ang.sin().to(x.dtype))

    def layer(self, L, x, pos, cache=None, lo=0):
        """x [B, T, d] rows at positions pos [T]. cache: None, or a dict with 'k'/'v' [B, KV, canvas, hd]
        to fill (refresh: lo = 0 and T = canvas) or to update at rows lo.. and attend over (window)."""
        B, T, _ = x.shape
        h = self.rms(x, L["attn_norm"])
        q = F.linear(h, L["q_proj"]).view(B, T, self.H, self.hd).transpose(1, 2)
        k = F.linear(h, L["k_proj"]).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = F.linear(h, L["v_proj"]).view(B, T, self.KV, self.hd).transpose(1, 2)
        q, k = self.rope(q, pos), self.rope(k, pos)
        if cache is not None:
            if "k" not in cache:
                cache["k"], cache["v"] = k.clone(), v.clone()
            else:
                cache["k"][:, :, lo:lo + T] = k
                cache["v"][:, :, lo:lo + T] = v
                k, v = cache["k"], cache["v"]
        if self.KV != self.H:
            k = k.repeat_interleave(self.H // self.KV, dim=1)
            v = v.repeat_interleave(self.H // self.KV, dim=1)
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v)
        else:
            a = torch.softmax((q @ k.transpose(-1, -2)) / self.hd ** 0.5, dim=-1) @ v
        x = x + F.linear(a.transpose(1, 2).reshape(B, T, self.d), L["attn_out"])
        h = self.rms(x, L["ff_norm"])
        return x + F.linear(F.silu(F.linear(h, L["ff_proj"])) * F.linear(h, L["up_proj"]), L["ff_out"])

    def forward(self, ids, pos, out_rows=None, caches=None, lo=0):
        """logits [B, rows, vocab] for ids [B, T] at positions pos [T]; out_rows: row indices (all)."""
        x = self.wte[ids]
        for i, L in enumerate(self.layers):
            x = self.layer(L, x, pos, None if caches is None else caches[i], lo)
        if out_rows is not None:
            x = x[:, out_rows]
        return F.linear(self.rms(x, self.ln_f), self.head)


def eager_decode(m, init, prompt, block, n_blocks, cache, decoder, threshold, stop_after=0):
    """The decode of `unmask bench --decode` from canvas init [B, n] (modified in place): returns the
    forwards run. stop_after > 0: stop after that many forwards (warm-up)."""
    canvas = init
    n = canvas.shape[1]
    pos = torch.arange(n, device=canvas.device)
    steps = 0
    for b in range(n_blocks):
        lo, hi = prompt + b * block, prompt + (b + 1) * block
        rows = torch.arange(lo, hi, device=canvas.device)
        caches = [dict() for _ in m.layers] if cache == "dual" else None
        s = 0
        while bool((canvas[:, lo:hi] == m.mask_id).any()):   # a host sync every step
            if caches is None or s == 0:   # the whole canvas (and, with the cache, its refresh)
                logits = m.forward(canvas, pos, out_rows=rows, caches=caches)
            else:
                logits = m.forward(canvas[:, lo:hi], pos[lo:hi], caches=caches, lo=lo)
            canvas[:, lo:hi] = commit_tokens(logits, canvas[:, lo:hi], m.mask_id, decoder, threshold)
            steps += 1
            s += 1
            if stop_after and steps >= stop_after:
                return steps
    return steps


# ---------------------------------------------------------------- the strong peer

class StrongLayer(torch.nn.Module):
    """One layer's weights (shared with the eager peer) and, for the dual cache, its K/V buffers."""

    def __init__(self, L, S):
        super().__init__()
        P = torch.nn.Parameter
        self.S = (S.H, S.KV, S.hd, S.d, S.eps)
        self.attn_norm = P(L["attn_norm"], requires_grad=False)
        self.qkv = P(L["qkv"], requires_grad=False)              # [(H + 2 KV) hd, d]
        self.attn_out = P(L["attn_out"], requires_grad=False)
        self.ff_norm = P(L["ff_norm"], requires_grad=False)
        self.gate_up = P(L["gate_up"], requires_grad=False)      # [2 ffn, d]
        self.ff_out = P(L["ff_out"], requires_grad=False)
        self.register_buffer("k_cache", None)                    # [B, KV, canvas, hd] (dual cache)
        self.register_buffer("v_cache", None)

    def forward(self, x, cos, sin, rows, cache):
        """x [B, T, d] at positions with tables cos / sin [T, hd]. cache: None; "fill" (T = canvas:
        the refresh writes every row's K/V); "window" (rows [T]: write the block's K/V, attend over all)."""
        H, KV, hd, d, eps = self.S
        B, T, _ = x.shape
        q, k, v = F.linear(rms_norm(x, self.attn_norm, eps), self.qkv).split([H * hd, KV * hd, KV * hd], dim=-1)
        q = rope_rotate(q.view(B, T, H, hd).transpose(1, 2), cos, sin)
        k = rope_rotate(k.view(B, T, KV, hd).transpose(1, 2), cos, sin)
        v = v.view(B, T, KV, hd).transpose(1, 2)
        if cache == "fill":
            self.k_cache.copy_(k)
            self.v_cache.copy_(v)
        elif cache == "window":
            self.k_cache.index_copy_(2, rows, k)
            self.v_cache.index_copy_(2, rows, v)
            k, v = self.k_cache, self.v_cache
        if KV != H:
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
        if HAS_SDPA:
            a = F.scaled_dot_product_attention(q, k, v)
        else:
            a = torch.softmax((q @ k.transpose(-1, -2)) / hd ** 0.5, dim=-1) @ v
        x = x + F.linear(a.transpose(1, 2).reshape(B, T, d), self.attn_out)
        gate, up = F.linear(rms_norm(x, self.ff_norm, eps), self.gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.ff_out)


class Strong(torch.nn.Module):
    """The strong peer: the model, the canvas [B, n] and the caches as buffers (fixed addresses for
    CUDA graphs), and its step kinds — each runs one forward and commits on the device, returning the
    largest count of masked positions left in a sequence's block (a 0-d tensor, read one step late)."""

    def __init__(self, m, decoder, threshold):
        super().__init__()
        P = torch.nn.Parameter
        self.H, self.KV, self.hd, self.d, self.eps = m.H, m.KV, m.hd, m.d, m.eps
        self.theta, self.mask_id = m.theta, m.mask_id
        self.decoder, self.threshold = decoder, threshold
        self.wte = P(m.wte, requires_grad=False)
        self.ln_f = P(m.ln_f, requires_grad=False)
        self.head = self.wte if m.head is m.wte else P(m.head, requires_grad=False)
        self.layers = torch.nn.ModuleList(StrongLayer(L, self) for L in m.layers)
        self.register_buffer("canvas", None)       # [B, n] int64
        self.register_buffer("rope_cos", None)     # [n, hd] in the activations' dtype
        self.register_buffer("rope_sin", None)
        self.key = None

    def ensure(self, B, n, dual, act_dtype, device):
        """setup() unless the buffers already have these shapes and dtype."""
        if self.key != (B, n, dual, act_dtype):
            self.setup(B, n, dual, act_dtype, device)

    def setup(self, B, n, dual, act_dtype, device):
        """Buffers for batch B, canvas length n (new tensors: a new shape recompiles anyway)."""
        self.key = (B, n, dual, act_dtype)
        ang = rope_angles(self.theta, self.hd, torch.arange(n, device=device))
        self.rope_cos, self.rope_sin = ang.cos().to(act_dtype), ang.sin().to(act_dtype)
        self.canvas = torch.zeros(B, n, dtype=torch.int64, device=device)
        for L in self.layers:
            shape = (B, self.KV, n, self.hd)
            L.k_cache = torch.zeros(shape, dtype=act_dtype, device=device) if dual else None
            L.v_cache = torch.zeros(shape, dtype=act_dtype, device=device) if dual else None

    def _layers(self, x, cos, sin, rows, cache):
        for L in self.layers:
            x = L(x, cos, sin, rows, cache)
        return x

    def _commit(self, x, rows):
        logits = F.linear(rms_norm(x, self.ln_f, self.eps), self.head)      # the block's rows only
        new = commit_tokens(logits, self.canvas.index_select(1, rows), self.mask_id, self.decoder, self.threshold)
        self.canvas.index_copy_(1, rows, new)
        return (new == self.mask_id).sum(dim=-1).max()

    def step_none(self, rows):
        """No cache: the whole canvas, commit on the block rows [block]."""
        x = self._layers(F.embedding(self.canvas, self.wte), self.rope_cos, self.rope_sin, rows, None)
        return self._commit(x.index_select(1, rows), rows)

    def step_refresh(self, rows):
        """Dual cache, the block's first step: the whole canvas, writing every row's K/V."""
        x = self._layers(F.embedding(self.canvas, self.wte), self.rope_cos, self.rope_sin, rows, "fill")
        return self._commit(x.index_select(1, rows), rows)

    def step_window(self, rows):
        """Dual cache, the other steps: the block's rows attending over the cache."""
        x = F.embedding(self.canvas.index_select(1, rows), self.wte)
        x = self._layers(x, self.rope_cos.index_select(0, rows), self.rope_sin.index_select(0, rows), rows, "window")
        return self._commit(x, rows)

    def logits(self, ids):
        """Every row's logits [B, T, V] of ids [B, T] (T = the canvas length of setup)."""
        x = self._layers(F.embedding(ids, self.wte), self.rope_cos, self.rope_sin, None, None)
        return F.linear(rms_norm(x, self.ln_f, self.eps), self.head)


def compile_how():
    """(torch.compile mode or None, what the rows say about it)."""
    if args.compile == "off":
        return None, "no (--compile off)"
    if not hasattr(torch, "compile"):
        return None, f"no (torch {torch.__version__} has no torch.compile)"
    return ("reduce-overhead", "reduce-overhead") if args.device == "cuda" else ("default", "default")


class StepFn:
    """One step kind of the strong peer under torch.compile (fullgraph). If compiling or one of the
    first 3 calls (compile, CUDA graph warm-up, recording) fails, it says so (stderr and
    STRONG["compiled"]) and runs the plain function from then on."""

    def __init__(self, fn):
        self.fn = fn
        self.call = fn
        self.tries = 3
        self.graphs = STRONG["mode"] == "reduce-overhead"
        if STRONG["mode"]:
            self.call = torch.compile(fn, mode=STRONG["mode"], fullgraph=True)

    def __call__(self, *a):
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()   # each step is a new run of its graph
        if self.tries == 0 or self.call is self.fn:
            return self.call(*a)
        self.tries -= 1
        try:
            return self.call(*a)
        except Exception as e:   # noqa: BLE001 — any compiler failure: run uncompiled, say why
            why = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"
            note(f"strong peer: torch.compile failed ({why}); this step kind runs uncompiled")
            STRONG["compiled"] = f"no (compile failed: {why})"
            self.call, self.graphs = self.fn, False
            return self.fn(*a)


def cudagraph_skips():
    """How many times inductor ran a compiled graph without CUDA graphs (it logs why on stderr)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["inductor"].get("cudagraph_skips", 0))
    except (ImportError, KeyError, AttributeError):
        return -1


STRONG = {}   # mode (torch.compile mode or None), compiled (what the rows say)


def sync():
    if args.device == "cuda":
        torch.cuda.synchronize()


def strong_decode(S, fns, init, prompt, block, n_blocks, cache):
    """The strong peer's decode from canvas init: the steps are queued without waiting; after queueing
    step j the loop reads the masked count left by step j - 1 (copied to host memory behind an event)
    and stops when it is <= 1 (step j commits the last one of every sequence) — at most `block` steps
    per block, each committing at least one position per sequence. Returns the forwards run."""
    cuda = args.device == "cuda"
    S.canvas.copy_(init)
    left_host = torch.zeros(2, dtype=torch.int64, pin_memory=cuda)
    events = [torch.cuda.Event() for _ in range(2)] if cuda else None
    rows_of = [torch.arange(prompt + b * block, prompt + (b + 1) * block, device=init.device)
               for b in range(n_blocks)]
    forwards = 0
    for b in range(n_blocks):
        rows = rows_of[b]
        s = 0
        while True:
            step = fns["none"] if cache == "none" else fns["refresh"] if s == 0 else fns["window"]
            left_host[s % 2].copy_(step(rows), non_blocking=cuda)
            if cuda:
                events[s % 2].record()
            s += 1
            forwards += 1
            if s == block:
                break
            if s >= 2:   # the count after step s - 2, in slot s % 2
                if cuda:
                    events[s % 2].synchronize()
                if int(left_host[s % 2]) <= 1:
                    break
    return forwards


def strong_fns(S):
    return {"none": StepFn(S.step_none), "refresh": StepFn(S.step_refresh), "window": StepFn(S.step_window)}


def strong_warmup(S, fns, init, prompt, block, cache):
    """The first 3 calls of each step kind this cache mode uses (compile, CUDA graph warm-up and
    recording): (seconds of the first calls, seconds of the others)."""
    rows = torch.arange(prompt, prompt + block, device=init.device)
    S.canvas.copy_(init)
    first = rest = 0.0
    for kind in (["none"] if cache == "none" else ["refresh", "window"]):
        for i in range(3):
            sync()
            t = time.perf_counter()
            fns[kind](rows)
            sync()
            if i == 0:
                first += time.perf_counter() - t
            else:
                rest += time.perf_counter() - t
    return first, rest


# ---------------------------------------------------------------- benchmarks

def autocast(dtype):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16" and args.device == "cpu")


def act_dtype(dtype):
    return torch.bfloat16 if args.device == "cuda" or dtype == "bf16" else torch.float32


def timed(fn, reps, dtype, warm=True, grad=torch.inference_mode):
    """min seconds of fn over reps (a first, untimed run warms up when warm). The strong peer runs
    under torch.no_grad, as when it was compiled (the grad mode is part of a graph's guards)."""
    best = float("inf")
    for r in range(reps + int(warm)):
        sync()
        t0 = time.perf_counter()
        with grad(), autocast(dtype):
            fn()
        sync()
        t = time.perf_counter() - t0
        if r or not warm:
            best = min(best, t)
    return best


def bench_forward(m, S, peer, L, B, reps, dtype):
    g = torch.Generator().manual_seed(L)
    ids = torch.randint(0, m.wte.shape[0], (B, L), generator=g).to(args.device)
    if peer == "eager":
        pos = torch.arange(L, device=args.device)
        return timed(lambda: m.forward(ids, pos), reps, dtype), {}
    with torch.no_grad(), autocast(dtype):
        S.setup(B, L, False, act_dtype(dtype), args.device)
        fn = StepFn(S.logits)
        t = time.perf_counter()
        fn(ids)
        sync()
        first = time.perf_counter() - t
        fn(ids)
        fn(ids)
    return timed(lambda: fn(ids), reps, dtype, warm=False, grad=torch.no_grad), {"compile_s": first}


def over_budget(estimate_s):
    return args.budget_s > 0 and time.perf_counter() - T0 + estimate_s > args.budget_s


class Estimates:
    """What the budget check expects a run to take: the last run of the same cache mode scaled by the
    batch, and, for the strong peer, a compile per step kind not yet compiled for such a batch."""

    def __init__(self):
        self.wall = {}                    # (peer, cache) -> (batch, seconds)
        self.compile_s = 60.0 if args.device == "cuda" else 5.0
        self.compiled = set()             # (kind, batch > 1)

    def run(self, peer, cache, B):
        prev = self.wall.get((peer, cache)) or self.wall.get(("eager", cache))
        return prev[1] * B / prev[0] if prev else 0.0

    def compiles(self, cache, B):
        kinds = ["none"] if cache == "none" else ["refresh", "window"]
        return self.compile_s * sum((k, B > 1) not in self.compiled for k in kinds) if STRONG["mode"] else 0.0


def profile_strong(run, what):
    """One run of `run` (a decode returning its forwards) under torch.profiler: the kernels' device time
    per step, the largest first, on stderr."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if args.device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    sync()
    with torch.profiler.profile(activities=acts) as prof:
        fwd = run()
        sync()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0)
        if args.device != "cuda":
            t = e.self_cpu_time_total
        if t > 0 and (args.device != "cuda" or getattr(e, "device_type", None) != torch.autograd.DeviceType.CPU):
            rows.append((t, e.count, e.key))
    rows.sort(reverse=True)
    total = sum(t for t, _, _ in rows)
    note(f"profile, {what}: {fwd} steps, {total / 1e3 / max(fwd, 1):.3f} ms of kernels per step")
    for t, n, k in rows[:25]:
        note(f"  {t / 1e3 / max(fwd, 1):8.3f} ms/step {n / max(fwd, 1):6.1f} calls/step  {k[:90]}")


def bench_decode_row(m, S, fns, est, cache, decoder, max_blocks, B, dtypes, peers):
    r = {"mode": "decode", "batch": B, "prompt": args.prompt, "gen": args.gen, "block": args.block,
         "cache": cache, "decoder": decoder}
    n_blocks = args.gen // args.block if not max_blocks else min(args.gen // args.block, max_blocks)
    vocab = m.wte.shape[0]
    canvases = {}
    for peer in peers:
        t_est = est.run(peer, cache, B) + (est.compiles(cache, B) if peer == "strong" else 0.0)
        if over_budget(t_est):
            r[peer + "_skipped"] = (f"budget: {time.perf_counter() - T0:.0f} s used + ~{t_est:.0f} s expected > "
                                    f"--budget-s {args.budget_s:.0f}")
            note(f"{peer} peer, cache {cache}, batch {B}: skipped ({r[peer + '_skipped']})")
            continue
        if args.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        for dt in dtypes:
            init = initial_canvas(vocab, m.mask_id, B, args.prompt, args.gen, args.device)
            if peer == "eager":
                with torch.inference_mode(), autocast(dt):
                    eager_decode(m, init.clone(), args.prompt, args.block, n_blocks, cache, decoder, args.threshold,
                                 stop_after=3)
                out = {}

                def run():
                    out["canvas"] = init.clone()
                    out["fwd"] = eager_decode(m, out["canvas"], args.prompt, args.block, n_blocks, cache, decoder,
                                              args.threshold)
                t = timed(run, args.reps, dt, warm=False)
                fwd, canvas = out["fwd"], out["canvas"]
            else:
                S.decoder, S.threshold = decoder, args.threshold
                with torch.no_grad(), autocast(dt):
                    S.ensure(B, init.shape[1], "dual" in args.caches, act_dtype(dt), args.device)
                    first, rest = strong_warmup(S, fns, init, args.prompt, args.block, cache)
                    kinds = ["none"] if cache == "none" else ["refresh", "window"]
                    if STRONG["mode"] and not all((k, B > 1) in est.compiled for k in kinds):
                        est.compile_s = first / len(kinds)
                    est.compiled.update((k, B > 1) for k in kinds)
                    r["strong_compile_s"] = round(first, 2)
                    r["strong_warmup_s"] = round(rest, 2)
                    if STRONG["mode"] == "reduce-overhead":   # compiled, but run without CUDA graphs?
                        r["strong_cudagraph_skips"] = cudagraph_skips()
                    t = float("inf")
                    for _ in range(args.reps):
                        sync()
                        t0 = time.perf_counter()
                        fwd = strong_decode(S, fns, init, args.prompt, args.block, n_blocks, cache)
                        sync()
                        t = min(t, time.perf_counter() - t0)
                    if args.profile:
                        profile_strong(lambda: strong_decode(S, fns, init, args.prompt, args.block, n_blocks, cache),
                                       f"strong peer, cache {cache}, batch {B}, {dt}")
                canvas = S.canvas.clone()
                r["strong_compiled"] = STRONG["compiled"]
                # every decoded position committed (else the steps did not run on this canvas)
                r["strong_masks_left"] = int((canvas[:, args.prompt:args.prompt + n_blocks * args.block]
                                              == m.mask_id).sum())
            est.wall[(peer, cache)] = (B, t)
            r[f"{peer}_{dt}_ms_per_step"] = 1e3 * t / fwd
            r[f"{peer}_{dt}_tokens_per_s"] = B * n_blocks * args.block / t
            r[peer + "_steps"] = fwd
            canvases[peer] = canvas
        if args.device == "cuda":
            r[peer + "_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    if len(canvases) == 2:
        r["same_tokens"] = bool(torch.equal(canvases["eager"], canvases["strong"]))
    return r


# ---------------------------------------------------------------- check

def check(m, S, binary):
    """Each peer's logits against `unmask logits --cpu-kernels fp32`; with both peers, their decodes
    commit the same tokens. 0 when every check passes."""
    import subprocess
    import tempfile
    peers = ["eager", "strong"] if args.peer == "both" else [args.peer]
    ids = torch.randint(0, m.wte.shape[0], (64,), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "l.npy")
        subprocess.run([binary, "logits", "--model", args.model, "--tokens", ",".join(map(str, ids.tolist())),
                        "--out", out, "--cpu-kernels", "fp32", "--threads", str(args.threads)], check=True)
        ours = torch.from_numpy(np.load(out))
    rc = 0
    with torch.no_grad():
        for peer in peers:
            if peer == "eager":
                ref = m.forward(ids[None], torch.arange(64))[0].float()
            else:
                S.setup(1, 64, False, torch.float32, "cpu")
                ref = StepFn(S.logits)(ids[None])[0].float()
            d = float((ours - ref).abs().max() / ref.abs().max())
            ok = d < 1e-4
            rc |= not ok
            how = f" (torch.compile: {STRONG['compiled']}, attention: {'SDPA' if HAS_SDPA else 'softmax'})" \
                if peer == "strong" else ""
            print(f"check {peer}: max |unmask - peer| / max |peer| = {d:.3e} over {tuple(ref.shape)} logits"
                  f"{how}: {'ok' if ok else 'FAIL'}", flush=True)
        if len(peers) < 2:
            return rc
        # a threshold that commits several positions per step: the first quartile of the first step's
        # confidences
        B, n_blocks = 2, args.gen // args.block
        init = initial_canvas(m.wte.shape[0], m.mask_id, B, args.prompt, args.gen, "cpu")
        rows = torch.arange(args.prompt, args.prompt + args.block)
        logits = m.forward(init, torch.arange(init.shape[1]), out_rows=rows)
        thr = float(predictions(logits, m.mask_id)[0].quantile(0.25))
        fns = strong_fns(S)
        S.setup(B, init.shape[1], True, torch.float32, "cpu")
        for cache in ("none", "dual"):
            for decoder in ("low_confidence", "threshold"):
                S.decoder, S.threshold = decoder, thr
                a = init.clone()
                fa = eager_decode(m, a, args.prompt, args.block, n_blocks, cache, decoder, thr)
                fb = strong_decode(S, fns, init, args.prompt, args.block, n_blocks, cache)
                b = S.canvas.clone()
                left = int((b == m.mask_id).sum())
                ok = torch.equal(a, b) and left == 0
                rc |= not ok
                print(f"check decode cache {cache} {decoder}{f' {thr:.3g}' if decoder == 'threshold' else ''} "
                      f"batch {B}: eager {fa} / strong {fb} forwards, {int((a != b).sum())} tokens differ, "
                      f"{left} masks left: {'ok' if ok else 'FAIL'}", flush=True)
    return rc


# ---------------------------------------------------------------- main

def main():
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_peer: --device cuda: this PyTorch sees no CUDA device", file=sys.stderr)
        return 1
    cfg, w = load(args.model, args.device)
    fuse_weights(cfg, w)
    m = LLaDA(cfg, w, sdpa=args.device == "cuda")
    peers = ["eager", "strong"] if args.peer == "both" else [args.peer]
    S = None
    if "strong" in peers:
        STRONG["mode"], STRONG["compiled"] = compile_how()
        if not STRONG["mode"]:
            note(f"strong peer: {STRONG['compiled'][4:-1]}: it runs uncompiled")
        if not HAS_SDPA:
            note(f"strong peer: torch {torch.__version__} has no F.scaled_dot_product_attention: "
                 "explicit softmax attention")
        S = Strong(m, args.decoders[0], args.threshold)
        if STRONG["mode"]:
            dyn = torch._dynamo.config
            # the buffers' batch dimension may turn dynamic (batch 1 stays a graph of its own, the
            # larger batches share one), and room for a compile per step kind and shape
            if hasattr(dyn, "force_nn_module_property_static_shapes"):
                dyn.force_nn_module_property_static_shapes = False
            # eps and the threshold are constants: as float inputs they would reach the graph as CPU
            # scalars, and one CPU input makes inductor run it without CUDA graphs
            if hasattr(dyn, "specialize_float"):
                dyn.specialize_float = True
            for k in ("cache_size_limit", "recompile_limit"):
                if hasattr(dyn, k):
                    setattr(dyn, k, max(getattr(dyn, k), 64))
    if args.check:
        return check(m, S, args.check)
    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]
    if args.device == "cuda":
        dtypes = ["bf16"]   # bf16 weights and activations on the GPU
    batches = [int(b) for b in args.batch.split(",")]
    est = Estimates()
    fns = strong_fns(S) if S is not None else None
    for B in batches:
        rows = []
        if args.decode:
            for cache, decoder, mb in zip(args.caches, args.decoders, args.max_blocks):
                rows.append(bench_decode_row(m, S, fns, est, cache, decoder, mb, B, dtypes, peers))
        else:
            for L in [int(s) for s in args.seq.split(",")]:
                r = {"mode": "forward", "seq": L, "batch": B}
                for peer in peers:
                    for dt in dtypes:
                        t, extra = bench_forward(m, S, peer, L, B, args.reps, dt)
                        r[f"{peer}_{dt}_ms"] = 1e3 * t
                        r.update({f"{peer}_{k}": round(v, 2) for k, v in extra.items()})
                if "strong" in peers:
                    r["strong_compiled"] = STRONG["compiled"]
                rows.append(r)
        for r in rows:
            keys = [k for k in r if k.endswith("_ms") or k.endswith("_ms_per_step")]
            if keys:
                k = min(keys, key=lambda k: r[k])
                r["best"] = " ".join(k.split("_")[:2])
                r["best_ms"] = r[k]
            if args.json:
                print(json.dumps(r), flush=True)
            else:
                print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
