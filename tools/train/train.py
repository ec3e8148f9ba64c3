#!/usr/bin/python3
"""train.py — train a LLaDA-architecture masked-diffusion LM on the prepare.py token streams.

Objective (LLaDA pre-training): for each sequence draw t ~ U(0, 1] (stratified over the batch),
mask every token independently with probability t (the mask token replaces it), and take the
cross-entropy of the model's prediction at the masked positions, weighted 1/t, summed and divided
by the number of positions that could be masked. Three kinds of sequences share a batch:
  plain      a random window of the token stream, every position may be masked;
  completion a clean prefix of random length, only the rest may be masked (the shape of a
             completion request: prompt ++ masks);
  infill     a window whose middle span [a, a+m) is followed by k <|endoftext|> pads before the
             rest of the window; only the span and its pads may be masked. That is how unmask
             infills natively: prefix ++ masks ++ suffix, with the pads telling where text stops.
An optional sequence-length warm-up (--seq-warmup 32:0.1,64:0.2: shorter windows for the first
steps) exists because a masked position learns from its neighbours only through attention (an
autoregressive model gets the previous token for free), and attention finds a neighbour sooner among
few keys (a copy-the-neighbour toy task: solved in 400 steps at length 16, not at 256); on the real
corpus it made no measurable difference over 600 steps of a 2-layer model, so it is off by default.
The last --long-frac of the steps use --long-seq windows, so canvases up to that length have been
seen. Tokens per batch stay the same throughout. AdamW, linear warm-up then cosine decay, gradient clipping, bf16 autocast on the CPU (float32
master weights), periodic held-out evaluation, a checkpoint every --save-every steps that --resume
continues bit-for-bit (batches are a function of (seed, step)), a progress line with loss and
tokens/s, and log.jsonl (per --log-every steps: the mean loss and masked CE of those steps; per
eval: the held-out numbers) for the loss curve.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import LLaDA, ModelConfig, cross_entropy, vocab_rows_for  # noqa: E402

EPS_T = 1e-3   # t lives in [EPS_T, 1]: p_mask = (1 - eps) u + eps, as LLaDA's forward process


# ---------------------------------------------------------------- batches

def parse_seq_warmup(spec):
    """"32:0.1,64:0.2" -> [(32, 0.1), (64, 0.2)]: length 32 until 10% of the steps, then 64 until 20%."""
    out = []
    for part in filter(None, (spec or "").split(",")):
        n, f = part.split(":")
        out.append((int(n), float(f)))
    return out


def shape_at(step, args):
    """(batch, length) of a step: the sequence-length warm-up, then --seq-len, then --long-seq for the
    last --long-frac of the steps; tokens per batch stay batch * seq_len."""
    L = args.seq_len
    for n, until in parse_seq_warmup(args.seq_warmup):
        if step < args.steps * until:
            L = n
            break
    if args.long_seq and step >= args.steps * (1 - args.long_frac):
        L = args.long_seq
    return max(1, args.batch * args.seq_len // L), L


def make_batch(stream, step, args, sp, seed, gen=None):
    """(ids, noisy, maskable, t) for one step: a function of (seed, step) only."""
    g = gen or np.random.default_rng([seed, step])
    B, L = shape_at(step, args)
    if args.short_frac > 0 and g.random() < args.short_frac:
        L = int(g.integers(min(16, L), L + 1))   # now and then a short canvas
    starts = g.integers(0, len(stream) - L - 1, size=B)
    ids = np.stack([stream[s:s + L].astype(np.int64) for s in starts])
    maskable = np.ones((B, L), dtype=bool)
    kinds = g.random(B)
    for i in range(B):
        if kinds[i] < args.infill_frac:            # prefix ++ middle ++ EOS*k ++ suffix
            m = int(g.integers(1, max(1, min(64, L // 2)) + 1))
            k = int(g.integers(0, min(8, L // 4) + 1))
            a = int(g.integers(1, L - m - k + 1))
            row = np.concatenate([ids[i, :a + m], np.full(k, sp["eos"]), ids[i, a + m:L - k]])
            ids[i] = row
            maskable[i] = False
            maskable[i, a:a + m + k] = True
        elif kinds[i] < args.infill_frac + args.completion_frac:   # clean prefix, masked rest
            c = int(g.integers(1, L))
            maskable[i, :c] = False
    u = (np.arange(B) + g.random()) / B            # stratified t over the batch
    g.shuffle(u)
    t = (1 - EPS_T) * u + EPS_T
    r = g.random((B, L))
    masked = (r < t[:, None]) & maskable
    noisy = np.where(masked, sp["mask"], ids)
    return (torch.from_numpy(ids), torch.from_numpy(noisy), torch.from_numpy(maskable),
            torch.from_numpy(t).float())


def diffusion_loss(model, ids, noisy, maskable, t, bf16):
    """Sum over masked positions of CE / t, divided by the maskable positions, mean over the batch.
    Also returns the plain mean CE over masked positions (a readable number)."""
    masked = noisy != ids
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        h = model.hidden(noisy)
        logits = model.transformer.ff_out(h[masked])    # the LM head only where there is a loss
    ce = cross_entropy(logits.float(), ids[masked])
    w = (1.0 / t)[:, None].expand_as(ids)[masked]
    row = torch.zeros(ids.shape[0]).index_add_(0, masked.nonzero()[:, 0], ce * w)
    loss = (row / maskable.sum(1).clamp(min=1)).mean()
    return loss, ce.mean() if ce.numel() else torch.tensor(0.0)


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model, valid, args, sp, n_windows, bf16, ratios=(0.15, 0.5, 0.9), unigram_top=None):
    """Held-out loss (the training objective on fixed windows and t) and masked-token accuracy at
    fixed mask ratios (exactly round(r L) positions per window, seeded). With unigram_top, the
    accuracy of always guessing the most frequent training token on the same masks, too."""
    model.eval()
    g = np.random.default_rng(12345)
    L = args.eval_seq_len
    starts = np.linspace(0, len(valid) - L - 1, n_windows).astype(np.int64)
    out = {"loss": 0.0}
    losses = []
    for s0 in range(0, n_windows, args.batch):
        st = starts[s0:s0 + args.batch]
        ids = torch.from_numpy(np.stack([valid[s:s + L].astype(np.int64) for s in st]))
        t = torch.from_numpy(((np.arange(len(st)) + 0.5) / len(st)) * (1 - EPS_T) + EPS_T).float()
        m = torch.from_numpy(g.random(ids.shape)) < t[:, None]
        noisy = torch.where(m, torch.full_like(ids, sp["mask"]), ids)
        loss, _ = diffusion_loss(model, ids, noisy, torch.ones_like(ids, dtype=torch.bool), t, bf16)
        losses.append(loss.item() * len(st))
    out["loss"] = sum(losses) / n_windows
    for r in ratios:
        hit = tot = uhit = 0
        for s0 in range(0, n_windows, args.batch):
            st = starts[s0:s0 + args.batch]
            ids = torch.from_numpy(np.stack([valid[s:s + L].astype(np.int64) for s in st]))
            k = int(round(r * L))
            m = torch.zeros_like(ids, dtype=torch.bool)
            for i in range(len(st)):
                m[i, torch.from_numpy(g.permutation(L)[:k])] = True
            noisy = torch.where(m, torch.full_like(ids, sp["mask"]), ids)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                pred = model(noisy).float()
            pred[..., sp["mask"]] = -float("inf")
            pred = pred.argmax(-1)
            hit += (pred[m] == ids[m]).sum().item()
            tot += m.sum().item()
            if unigram_top is not None:
                uhit += (ids[m] == unigram_top).sum().item()
        out[f"acc@{r}"] = hit / tot
        if unigram_top is not None:
            out[f"unigram_acc@{r}"] = uhit / tot
    model.train()
    return out


# ---------------------------------------------------------------- schedule / checkpoints

def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def save_checkpoint(path, model, opt, step, tokens, elapsed, args, cfg):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "tokens": tokens,
                "elapsed": elapsed, "args": vars(args), "config": cfg.to_dict()}, tmp)
    os.replace(tmp, path)


def fmt_time(s):
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


# glibc returns large freed blocks to the kernel and maps fresh zeroed pages for the next tensor of
# that size; on a VM those page faults cost ~15 ns per float, more than the arithmetic (measured:
# 0.25 vs 15 ns/element for a 68 MB multiply). Keeping the heap (no mmap, no trim) removes them.
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 36), "MALLOC_TOP_PAD_": str(1 << 28)}


def reexec_with_malloc_env():
    if os.environ.get("MALLOC_MMAP_MAX_") is None:
        os.environ.update(MALLOC_ENV)
        os.execv(sys.executable, [sys.executable] + sys.argv)


def main():
    reexec_with_malloc_env()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="models/train-work/tokens", help="prepare.py output")
    ap.add_argument("--out", default="models/train-work/run")
    ap.add_argument("--d-model", type=int, default=320)
    ap.add_argument("--n-layers", type=int, default=6)
    ap.add_argument("--n-heads", type=int, default=5)
    ap.add_argument("--n-kv-heads", type=int, default=0, help="0 = n-heads")
    ap.add_argument("--ffn", type=int, default=864)
    ap.add_argument("--max-seq", type=int, default=1024, help="config max_sequence_length")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-warmup", default="",
                    help="LEN:FRACTION,... shorter windows for the first steps (empty: none)")
    ap.add_argument("--eval-seq-len", type=int, default=256, help="held-out window length of the evaluations")
    ap.add_argument("--local-heads", default="-1,1,-2,2;-1,1",
                    help="init: per layer (;), the relative offsets the first heads attend to (model.py "
                         "init_local_attention); empty: plain random init")
    ap.add_argument("--emb-shared", type=float, default=1.0,
                    help="with --local-heads: the shared embedding direction, times the mean row norm")
    ap.add_argument("--long-seq", type=int, default=512, help="sequence length of the last --long-frac steps")
    ap.add_argument("--long-frac", type=float, default=0.15)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--infill-frac", type=float, default=0.1)
    ap.add_argument("--completion-frac", type=float, default=0.25)
    ap.add_argument("--short-frac", type=float, default=0.03)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads [1]: on a shared 2-core machine one thread was 3-4x faster than two")
    ap.add_argument("--no-bf16", action="store_true", help="float32 matmuls (slower on CPUs with bf16)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt when it exists")
    ap.add_argument("--max-seconds", type=float, default=0, help="stop (and save) after this wall time")
    ap.add_argument("--stop-after", type=int, default=0, help="stop (and save) after this step; --resume continues")
    args = ap.parse_args()
    bf16 = not args.no_bf16
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)

    meta = json.load(open(os.path.join(args.tokens, "meta.json")))
    sp = meta["special"]
    train = np.load(os.path.join(args.tokens, "train.npy"), mmap_mode="r")
    valid = np.load(os.path.join(args.tokens, "valid.npy"), mmap_mode="r")
    cfg = ModelConfig(vocab_rows=vocab_rows_for(meta["n_vocab"]), d_model=args.d_model, n_layers=args.n_layers,
                      n_heads=args.n_heads, n_kv_heads=args.n_kv_heads or args.n_heads, ffn_hidden=args.ffn,
                      max_seq=args.max_seq, rope_theta=args.rope_theta)
    model = LLaDA(cfg)
    model.init_weights(args.seed)
    if args.local_heads:
        offsets = [[int(x) for x in layer.split(",") if x] for layer in args.local_heads.split(";")]
        model.init_local_attention(offsets, args.emb_shared, seed=args.seed + 1)
    decay = [p for p in model.parameters() if p.ndim == 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    step, tokens, elapsed0 = 0, 0, 0.0
    resuming = args.resume and os.path.exists(ckpt_path)
    log = open(os.path.join(args.out, "log.jsonl"), "a" if resuming else "w")
    if resuming:
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, tokens, elapsed0 = ck["step"], ck["tokens"], ck["elapsed"]
        print(f"train: resumed at step {step} ({tokens} tokens, {fmt_time(elapsed0)})", file=sys.stderr)
    with open(os.path.join(args.out, "config.json"), "w") as fp:
        json.dump({"model": cfg.to_dict(), "args": vars(args), "special": sp, "n_vocab": meta["n_vocab"]}, fp,
                  indent=2)
    n_params = model.n_params()
    print(f"train: {n_params / 1e6:.2f}M parameters, {args.steps} steps of {args.batch}x{args.seq_len} tokens, "
          f"{'bf16 autocast' if bf16 else 'float32'}, {torch.get_num_threads()} threads", file=sys.stderr)
    unigram_top = int(np.argmax(np.load(os.path.join(args.tokens, "unigram.npy"))))

    t_start = time.time()
    t_win, tok_win = time.time(), 0
    loss_ema = None
    win_loss, win_ce, win_n = 0.0, 0.0, 0   # means over the steps since the last log line
    model.train()
    while step < args.steps:
        lr = lr_at(step, args)
        for gp in opt.param_groups:
            gp["lr"] = lr
        ids, noisy, maskable, t = make_batch(train, step, args, sp, args.seed)
        loss, ce = diffusion_loss(model, ids, noisy, maskable, t, bf16)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
        opt.step()
        step += 1
        tokens += ids.numel()
        tok_win += ids.numel()
        lv = loss.item()
        loss_ema = lv if loss_ema is None else 0.95 * loss_ema + 0.05 * lv
        win_loss, win_ce, win_n = win_loss + lv, win_ce + ce.item(), win_n + 1
        elapsed = elapsed0 + time.time() - t_start
        if step % args.log_every == 0 or step == args.steps:
            tps = tok_win / max(time.time() - t_win, 1e-9)
            t_win, tok_win = time.time(), 0
            eta = (args.steps - step) * args.batch * args.seq_len / max(tps, 1e-9)
            done = int(30 * step / args.steps)
            wl, wc = win_loss / win_n, win_ce / win_n
            win_loss, win_ce, win_n = 0.0, 0.0, 0
            print(f"\r[{'#' * done}{'.' * (30 - done)}] step {step}/{args.steps} loss {wl:.3f} (ema {loss_ema:.3f}) "
                  f"ce {wc:.3f} lr {lr:.2e} |g| {gnorm:.2f} {tps:.0f} tok/s "
                  f"elapsed {fmt_time(elapsed)} eta {fmt_time(eta)}", file=sys.stderr, flush=True)
            log.write(json.dumps({"step": step, "loss": wl, "ce": wc, "lr": lr, "grad_norm": gnorm,
                                  "tokens": tokens, "elapsed": round(elapsed, 1), "tok_s": round(tps, 1)}) + "\n")
            log.flush()
        if step % args.eval_every == 0 or step == args.steps:
            ev = evaluate(model, valid, args, sp, args.eval_windows, bf16, ratios=(0.5,) if step < args.steps else
                          (0.15, 0.5, 0.9), unigram_top=unigram_top)
            print(f"\neval step {step}: " + " ".join(f"{k} {v:.4f}" for k, v in ev.items()), file=sys.stderr,
                  flush=True)
            log.write(json.dumps({"step": step, "tokens": tokens, "elapsed": round(elapsed, 1),
                                  **{"eval_" + k: v for k, v in ev.items()}}) + "\n")
            log.flush()
        if step % args.save_every == 0 or step == args.steps:
            save_checkpoint(ckpt_path, model, opt, step, tokens, elapsed, args, cfg)
        if (args.max_seconds and elapsed >= args.max_seconds) or step == args.stop_after:
            save_checkpoint(ckpt_path, model, opt, step, tokens, elapsed, args, cfg)
            print(f"\ntrain: stopping at step {step} (--max-seconds / --stop-after)", file=sys.stderr)
            break
    print(f"\ntrain: done: step {step}, {tokens} tokens, {fmt_time(elapsed0 + time.time() - t_start)}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
