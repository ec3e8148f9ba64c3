#!/usr/bin/python3
"""torch_peer.py — the PyTorch peer of `unmask bench`: the same LLaDA forward (and the same dual-cache
decode loop) on the same checkpoint, in PyTorch eager, so docs/perf.md can give unmask's times as a
ratio to it measured on the same machine in the same run.

Our own code, written from docs/model-spec.md and docs/decode.md (KV caches): embedding, per layer
RMSNorm -> q/k/v -> rotate-half RoPE -> bidirectional softmax attention -> attn_out + residual ->
RMSNorm -> silu(gate) * up -> down + residual, then ln_f and the LM head. Weights are read from the
safetensors files as stored (bf16 -> exactly the same values in fp32).

Modes (--dtype): fp32 (fp32 weights and compute) and bf16 (torch.autocast on the CPU with bfloat16:
the matmuls in bf16 through oneDNN); `both` times each and reports the faster per row, as the issue
asks ("whichever is faster"). The process re-executes itself once with OMP_NUM_THREADS /
OPENBLAS_NUM_THREADS = --threads and GOMP_SPINCOUNT=20000 (unmask's own OpenMP spin policy) unless
they are set: PyTorch's OpenMP pool and OpenBLAS's own pool otherwise default to other sizes and
spin policies and run up to 2x slower than they can.

  forward:  --seq 1,32,256,1024 --batch 1,8     full forwards, logits for every row (as `unmask bench`)
  decode:   --decode --prompt 32 --gen 128 --block 32 --batch 1,8 [--max-blocks N]
            [--cache dual|none] [--decoder low_confidence|threshold [--threshold 0.9]]
            dual cache (default): each block one full refresh forward keeping K/V, then forwards of
            the block's rows attending over the cache; none: the reference decode, a full forward of
            the whole canvas every step. low_confidence commits the most confident masked position
            per sequence per step (one token per step); threshold (Fast-dLLM) every masked position
            whose probability is above the threshold, at least the most confident one. Logits for the
            block's rows only. Each sequence decodes its own canvas (commits per sequence).
  --device cuda: bf16 weights on the GPU (no autocast), attention through
            F.scaled_dot_product_attention, timings with torch.cuda.synchronize, and the peak memory
            (torch.cuda.max_memory_allocated) and tokens/s in each decode row — the GPU peer of
            `unmask bench --device cuda:0` (scripts/gpu/run-checks.sh bench).
  check:    --check BIN   runs `BIN logits --cpu-kernels fp32` on 64 random tokens and prints the largest
            relative difference to this forward in fp32 (the peer computes the same function)
Prints one line per row (min of --reps); --json prints the rows as JSON lines.
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
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--max-blocks", type=int, default=0)
    ap.add_argument("--cache", choices=["dual", "none"], default="dual")
    ap.add_argument("--decoder", choices=["low_confidence", "threshold"], default="low_confidence")
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", metavar="BIN", help="compare logits with `BIN logits --cpu-kernels fp32`")
    return ap.parse_args()


args = parse_args()
reexec_with_threads(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)


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


# ---------------------------------------------------------------- the model

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
                                 "up_proj", "ff_out"]})

    def rms(self, x, g):
        return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def rope(self, x, pos):
        # x [B, H, T, hd]; rotate-half over the whole head; angles in float64
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
        ang = pos.to(torch.float64)[:, None] * inv.to(pos.device)[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

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


# ---------------------------------------------------------------- benchmarks

def timed(fn, reps, dtype):
    best = float("inf")
    cuda = args.device == "cuda"
    for r in range(reps + 1):   # the first run warms up
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16" and not cuda):
            fn()
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter() - t0
        if r:
            best = min(best, t)
    return best


def bench_forward(m, L, B, reps, dtype):
    g = torch.Generator().manual_seed(L)
    ids = torch.randint(0, m.wte.shape[0], (B, L), generator=g).to(args.device)
    pos = torch.arange(L, device=args.device)
    return timed(lambda: m.forward(ids, pos), reps, dtype)


def decode(m, B, prompt, gen, block, max_blocks):
    """The decode of `unmask bench --decode` (--cache, --decoder): returns (forward steps run,
    tokens committed over all sequences)."""
    g = torch.Generator().manual_seed(7)
    canvas = torch.cat([torch.randint(0, m.wte.shape[0], (B, prompt), generator=g),
                        torch.full((B, gen), m.mask_id)], dim=1).to(args.device)
    n = canvas.shape[1]
    pos = torch.arange(n, device=args.device)
    steps = 0
    n_blocks = gen // block if not max_blocks else min(gen // block, max_blocks)
    for b in range(n_blocks):
        lo, hi = prompt + b * block, prompt + (b + 1) * block
        rows = torch.arange(lo, hi, device=args.device)
        caches = [dict() for _ in m.layers] if args.cache == "dual" else None
        s = 0
        while bool((canvas[:, lo:hi] == m.mask_id).any()):
            if caches is None or s == 0:   # the whole canvas (and, with the cache, its refresh)
                logits = m.forward(canvas, pos, out_rows=rows, caches=caches)
            else:
                logits = m.forward(canvas[:, lo:hi], pos[lo:hi], caches=caches, lo=lo)
            conf, tok = torch.softmax(logits.float(), dim=-1).max(dim=-1)     # [B, block]
            masked = canvas[:, lo:hi] == m.mask_id
            conf = conf.masked_fill(~masked, -1.0)
            top = torch.zeros_like(masked).scatter_(1, conf.argmax(dim=-1, keepdim=True), True)
            sel = top if args.decoder == "low_confidence" else (conf > args.threshold) | top
            sel &= masked
            canvas[:, lo:hi] = torch.where(sel, tok, canvas[:, lo:hi])
            steps += 1
            s += 1
    return steps, B * n_blocks * block


def check(m, binary):
    import subprocess
    import tempfile
    ids = torch.randint(0, m.wte.shape[0], (64,), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "l.npy")
        subprocess.run([binary, "logits", "--model", args.model, "--tokens", ",".join(map(str, ids.tolist())),
                        "--out", out, "--cpu-kernels", "fp32", "--threads", str(args.threads)], check=True)
        ours = torch.from_numpy(np.load(out))
    with torch.inference_mode():
        ref = m.forward(ids[None].to(args.device), torch.arange(64, device=args.device))[0].float().cpu()
    d = float((ours - ref).abs().max() / ref.abs().max())
    print(f"check: max |unmask - peer| / max |peer| = {d:.3e} over {tuple(ref.shape)} logits")
    return 0 if d < 1e-4 else 1


def main():
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_peer: --device cuda: this PyTorch sees no CUDA device", file=sys.stderr)
        return 1
    cfg, w = load(args.model, args.device)
    m = LLaDA(cfg, w, sdpa=args.device == "cuda")
    if args.check:
        return check(m, args.check)
    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]
    if args.device == "cuda":
        dtypes = ["bf16"]   # bf16 weights and activations on the GPU
    batches = [int(b) for b in args.batch.split(",")]
    rows = []
    if args.decode:
        for B in batches:
            r = {"mode": "decode", "batch": B, "prompt": args.prompt, "gen": args.gen, "block": args.block,
                 "cache": args.cache, "decoder": args.decoder}
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            for dt in dtypes:
                holder = {}
                t = timed(lambda: holder.__setitem__("run", decode(m, B, args.prompt, args.gen, args.block,
                                                                  args.max_blocks)), args.reps, dt)
                steps, tokens = holder["run"]
                r[dt + "_ms_per_step"] = 1e3 * t / steps
                r[dt + "_tokens_per_s"] = tokens / t
                r["steps"] = steps
            if args.device == "cuda":
                r["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
            rows.append(r)
    else:
        for B in batches:
            for L in [int(s) for s in args.seq.split(",")]:
                r = {"mode": "forward", "seq": L, "batch": B}
                for dt in dtypes:
                    r[dt + "_ms"] = 1e3 * bench_forward(m, L, B, args.reps, dt)
                rows.append(r)
    for r in rows:
        keys = [k for k in r if k.endswith("_ms") or k.endswith("_ms_per_step")]
        r["best"] = min(keys, key=lambda k: r[k]).split("_")[0]
        r["best_ms"] = r[min(keys, key=lambda k: r[k])]
        if args.json:
            print(json.dumps(r), flush=True)
        else:
            print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
