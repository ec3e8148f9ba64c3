"""decode_ref.py — an independent NumPy implementation of diffusion decoding for checking `unmask generate`.

Written from the algorithms as docs/decode.md describes them (LLaDA `generate` low_confidence / random,
Fast-dLLM threshold, factor, dInfer hierarchy and credit threshold, block layouts, EOS, and the KV caches:
Fast-dLLM prefix and dual cache, dInfer vicinity refresh) and the reference decode of docs/model-spec.md,
plus the rules docs/decode.md adds on top of the reference (each marked "unmask rule" below):
  * the mask token is never sampled (x0 = argmax over ids != mask);
  * random numbers come from the counter-based hash of src/util/rng.h keyed (seed, stream=step,
    counter=position*vocab+token) for Gumbel noise and (seed, 2**62|step, position) for the
    'random' decoder's scores — re-implemented here from its documented formula;
  * stop_at_eos: after a block finishes, stop if it holds an EOS/EOT (I4, SGLang/dInfer style);
  * ties in top-k / sort are broken by the lower position;
  * caches: every step is one forward. A step is a *refresh* (full canvas, K/V kept) when there is no
    cache yet, the active block differs from the one the cache was computed in, or `refresh` > 0
    steps ran since the last refresh; the first `warmup` steps of a request run without any cache
    (and keep none); other steps run only the cache window's rows. The refresh step decodes like
    any other step, and a block whose refresh step left no mask gets no further forward (the
    anchors run one more there, or crash with one step per block). Prefix and vicinity look apply
    to the whole canvas; CFG's unconditional canvas keeps its own cache on the same schedule.
The model forward is llada_ref.LLaDARef (float64). Produces, per step, the list of (pos, token)
committed, so a test can compare step by step.
"""
import numpy as np

M64 = (1 << 64) - 1


def _mix64(z):
    z = (z + np.uint64(0x9e3779b97f4a7c15)) & np.uint64(M64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
    return z ^ (z >> np.uint64(31))


def rng_u01(seed, stream, counters):
    """Uniform (0,1) doubles for an array of counters (util/rng.h formula)."""
    with np.errstate(over="ignore"):
        s = np.array([seed], dtype=np.uint64)
        st = np.array([stream], dtype=np.uint64)
        key = _mix64(s ^ _mix64(st + np.uint64(0x632be59bd9b4e019)))
        r = _mix64(key + np.asarray(counters, dtype=np.uint64)) >> np.uint64(11)
    return (r.astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)


def softmax(l):
    m = np.max(l[np.isfinite(l)]) if np.any(np.isfinite(l)) else 0.0
    e = np.exp(l - m)
    return e / e.sum()


class Decoder:
    """Reference decode for one prompt. forward(tokens) -> float64 logits [len, vocab]."""

    def __init__(self, forward, vocab, mask_id, eos_id, eot_id=-1, model=None):
        self.F = forward
        self.V = vocab
        self.mask = mask_id
        self.eos = eos_id
        self.eot = eot_id
        self.model = model                     # llada_ref.LLaDARef: needed by the KV-cache modes

    def _canvas_logits(self, x, plan, slot):
        """Logits [len(x), V] of one canvas for this step's plan; slot holds that canvas's cache.
        Rows outside a window are NaN (never read: only the active block is decoded)."""
        if plan[0] == "plain":                  # no cache
            return self.F(x)
        if plan[0] == "refresh":                # full forward; its K/V become the cache
            l, slot["kv"] = self.model.forward_kv(x)
            return l
        _, mode, wl, wr = plan
        kv = slot["kv"]
        out = np.full((len(x), self.V), np.nan)
        if mode == "prefix":                    # prefix cache: queries wl..L-1; keys = cached [0, wl) ++ fresh
            def keys(l, k, v):
                return (np.concatenate([kv[l][0][:, :wl], k], axis=1),
                        np.concatenate([kv[l][1][:, :wl], v], axis=1))
        else:                                   # dual / vicinity: the cache with rows [wl, wr) replaced
            def keys(l, k, v):
                K, V = kv[l][0].copy(), kv[l][1].copy()
                K[:, wl:wr], V[:, wl:wr] = k, v
                return K, V
        out[wl:wr] = self.model.forward_rows(x, wl, wr, keys)
        return out

    def logits(self, x, n_prompt, cfg, eos_inf, plan=("plain",), slots=None):
        slots = slots if slots is not None else [{}, {}]
        l = self._canvas_logits(x, plan, slots[0])
        if cfg > 0:
            u = list(x)
            for i in range(n_prompt):
                u[i] = self.mask
            lu = self._canvas_logits(u, plan, slots[1])
            l = lu + (cfg + 1.0) * (l - lu)
        l = np.array(l, dtype=np.float64)
        if eos_inf:
            l[:, self.eos] = -np.inf
        return l

    def sample(self, l, T, seed, step, pos, conf_eot_inf):
        """x0 and confidence for one position's logits row."""
        ls = l.copy()
        ls[self.mask] = -np.inf                                  # unmask rule: never sample MASK
        if T == 0:
            x0 = int(np.argmax(ls))
        else:
            u = rng_u01(seed, step, pos * self.V + np.arange(self.V))
            with np.errstate(over="ignore", divide="ignore"):
                g = np.exp(ls) / (-np.log(u)) ** T                # A1 add_gumbel_noise, float64
            x0 = int(np.argmax(g))
        lc = l.copy()
        if conf_eot_inf and self.eot >= 0:                       # docs/model-spec.md: the effective quirk
            lc[self.eot] = -np.inf
            if x0 == self.eot:
                return x0, 0.0
        return x0, float(softmax(lc)[x0])

    def generate(self, prompt, gen_length, block_length, steps, decoder="low_confidence", threshold=0.9,
                 factor=1.0, temperature=0.0, seed=0, cfg=0.0, logits_eos_inf=False,
                 confidence_eos_eot_inf=False, layout="llada", stop_at_eos=True, low_threshold=0.0,
                 credit_alpha=0.7, credit_gamma=0.2, credit_decay=0.8, cache="none", refresh=0, prefix_look=0,
                 after_look=0, warmup=0):
        Lp = len(prompt)
        x = list(prompt) + [self.mask] * gen_length
        end = Lp + gen_length
        B = block_length
        first = (Lp // B) * B if layout == "aligned" else Lp     # I1
        blocks = []
        a = first
        while a < end:
            blocks.append((max(a, Lp), min(a + B, end)))
            a += B
        fixed = decoder in ("low_confidence", "random")
        if fixed:
            nb = len(blocks)
            assert steps % nb == 0 and all(hi - lo == B for lo, hi in blocks), "reference needs equal blocks"
            s_per = steps // nb
        history = []
        step = 0
        slots = [{}, {}]                                         # cond / uncond canvas caches
        cache_block, age = None, 0
        for bi, (lo, hi) in enumerate(blocks):
            m0 = sum(1 for p in range(lo, hi) if x[p] == self.mask)
            i = 0
            credit = np.zeros((hi - lo, self.V), dtype=np.float32)   # A6: M per block, it = i
            while any(x[p] == self.mask for p in range(lo, hi)):
                if fixed and i >= s_per:
                    break
                L = len(x)
                if cache == "none" or step < warmup:
                    plan = ("plain",)
                elif "kv" not in slots[0] or cache_block != bi or (refresh > 0 and age >= refresh):
                    plan = ("refresh",)
                    cache_block, age = bi, 0
                elif cache == "prefix":
                    plan = ("window", "prefix", lo, L)
                elif cache == "dual":
                    plan = ("window", "dual", lo, hi)
                else:                                            # vicinity
                    plan = ("window", "vicinity", max(0, lo - prefix_look), min(L, hi + after_look))
                age += 1
                l = self.logits(x, Lp, cfg, logits_eos_inf, plan, slots)
                if decoder == "credit":                          # A6, masked rows only
                    l = l.copy()
                    if i > 0:
                        credit *= np.float32(credit_decay)
                    for p in range(lo, hi):
                        if x[p] != self.mask:
                            continue
                        P = softmax(l[p])
                        t1 = int(np.argmax(P))
                        credit[p - lo, t1] += np.float32(float(P[t1]) ** credit_gamma)
                        l[p] = l[p].astype(np.float32).astype(np.float64) + \
                            credit_alpha * np.log(credit[p - lo].astype(np.float64) + 1.0)
                cand = []                                        # (score, pos, x0, conf)
                for p in range(lo, hi):
                    if x[p] != self.mask:
                        continue
                    x0, c = self.sample(l[p], temperature, seed, step, p, confidence_eos_eot_inf)
                    score = c
                    if decoder == "random":
                        score = float(rng_u01(seed, (1 << 62) | step, [p])[0])
                    cand.append((score, p, x0, c))
                cand.sort(key=lambda t: (-t[0], t[1]))
                if fixed:
                    k = m0 // s_per + (1 if i < m0 % s_per else 0)  # get_num_transfer_tokens
                elif decoder == "threshold":                     # A2
                    k = 1
                    while k < len(cand) and cand[k][3] >= threshold:
                        k += 1
                elif decoder == "credit":                        # A4 on the credited logits
                    cmax = max(t[3] for t in cand)
                    thr = max(min(threshold, cmax - 1e-5), -1000.0)
                    cand = [t for t in cand if t[3] >= thr]
                    k = len(cand)
                elif decoder == "hierarchy":                     # A5
                    n = hi - lo
                    c = np.full(n, -np.inf)
                    masked = np.zeros(n, dtype=bool)
                    for _, p, _, cf in cand:
                        c[p - lo] = cf
                        masked[p - lo] = True
                    take = np.zeros(n, dtype=bool)
                    j = 0
                    while j < n:                                 # maximal runs of masks
                        if not masked[j]:
                            j += 1
                            continue
                        e = j
                        while e < n and masked[e]:
                            e += 1
                        take[j:e] = c[j:e] == np.max(c[j:e])
                        j = e
                    if low_threshold:
                        take &= c > low_threshold
                    take |= c > threshold
                    take[int(np.argmax(c))] = True
                    take &= masked
                    cand = [t for t in cand if take[t[1] - lo]]
                    k = len(cand)
                elif decoder == "factor":                        # A3 incl. the last-position quirk
                    mm = len(cand)
                    k = mm
                    for n in range(2, mm + 1):
                        if cand[n - 1][3] < 1.0 - factor / (n + 1):
                            k = mm if n == mm else n - 1
                            break
                else:
                    raise ValueError(decoder)
                chosen = sorted(cand[:k], key=lambda t: t[1])
                for _, p, x0, _ in chosen:
                    x[p] = x0
                history.append([(p, x0) for _, p, x0, _ in chosen])
                step += 1
                i += 1
            if stop_at_eos and any(x[p] in (self.eos, self.eot) for p in range(lo, hi) if x[p] >= 0):
                break
        return history, x
