"""Error feedback's design choices measured on a numpy replica of stories260K
(shared data), before building them in C: GPTQ with blocks of 32 columns
(a float scale and minimum per block, searched over shrunk ranges, weighted
by diag(H)), every layer matrix quantized, the tied embedding kept; mean KL
against the original on 8 held-out sampled sequences of 256 tokens, the
Gram matrices from 16 sampled sequences (seed 1). Prints, at 3, 2 and 4 bits:

  rotation   plain GPTQ; with a random orthogonal rotation of each matrix's
             inputs (W R, R^T H R, undone after); with random-sign Hadamard
             rotations where the width is a power of two
  act-order  GPTQ; static groups in column order; static groups with the
             columns in order of decreasing diag(H)
  calibrate  sequential calibration: the layer's inputs collected in one
             run (stz's walk before), with and without the drift correction
             W + W D H^-1, D = (X - Xq)^T Xq; and input by input with it
  codebooks  plain rounding (no feedback) to one codebook for all
             matrices, of scalars, pairs or quadruples of elements scaled
             by their block's largest magnitude (k-means, 2^(bits x dim)
             entries): what vector codebooks could gain over scalar ones
  codebooks-feedback  the same codebooks of scalars and pairs under error
             feedback, input by input with the drift correction
  trellis    error feedback (input by input, drift) where each input's
             column is coded by a bitshift trellis (QTIP, Tseng et al.
             2024): a stream of bits, B per weight, each weight the value
             of the last L bits' state (a fixed pseudo-random Gaussian
             table, nothing stored), the stream chosen by Viterbi; each
             weight scaled by its block's RMS (blocks of 32 inputs).
             TRELLIS_L: state bits (12,16); TRELLIS_CARRY: 0 each column's
             stream starts anywhere (L - B more bits per column), 1 it goes
             on from the previous column's last state, 2 (the default)
             tail-biting (the stream read as a circle: exactly B bits per
             weight);
             TRELLIS_SCALE: the scale over the RMS (1); TRELLIS_CODE: the
             state's value (trellis_code); PROBE_BITS: the widths (3,2,4)

Usage: /usr/bin/python3 bench/feedback_probe.py [SHARED_DATA_DIR] [rotation|act-order|calibrate|codebooks|codebooks-feedback|trellis ...]
(needs numpy; sampling the sequences takes a few minutes, cached in $TMPDIR)."""
import json
import os
import pickle
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from st_files import load  # noqa: E402

DATA = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
MODEL = os.path.join(DATA, "stories260K.f32.safetensors")
if not os.path.exists(MODEL):
    print("skip: no", MODEL)
    sys.exit(0)
w, meta = load(MODEL, dtypes=("F32",))
w = {n: v.astype(np.float64) for n, v in w.items()}
cfg = json.loads(meta["config"])
D, NL, NH, NKV = cfg["dim"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"]
HD, EPS = D // NH, 1e-5


def rms(x, g):
    return g * x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)


def rope(x, pos):  # pairs (2i, 2i+1) of each head
    ang = np.outer(pos, 10000.0 ** (-np.arange(0, HD, 2) / HD))[:, None, :]
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[..., 0::2], x[..., 1::2]
    o = np.empty_like(x)
    o[..., 0::2], o[..., 1::2] = a * c - b * s, a * s + b * c
    return o


def fwd(w, toks, col=None):
    """Logits of llama2.c's model; col, when given, gets each matrix's inputs."""
    def mm(h, n):
        if col is not None:
            col.setdefault(n, []).append(h)
        return h @ w[n].T
    T = len(toks)
    x, pos, mask = w["tok_embeddings.weight"][toks], np.arange(T), np.triu(np.full((T, T), -np.inf), 1)
    for l in range(NL):
        p = "layers.%d." % l
        h = rms(x, w[p + "attention_norm.weight"])
        q = rope(mm(h, p + "attention.wq.weight").reshape(T, NH, HD), pos)
        k = rope(mm(h, p + "attention.wk.weight").reshape(T, NKV, HD), pos)
        v = mm(h, p + "attention.wv.weight").reshape(T, NKV, HD)
        k, v = np.repeat(k, NH // NKV, 1), np.repeat(v, NH // NKV, 1)
        s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(HD) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + mm(np.einsum("htu,uhd->thd", s, v).reshape(T, D), p + "attention.wo.weight")
        h = rms(x, w[p + "ffn_norm.weight"])
        g = mm(h, p + "feed_forward.w1.weight")
        x = x + mm(g / (1 + np.exp(-g)) * mm(h, p + "feed_forward.w3.weight"), p + "feed_forward.w2.weight")
    return rms(x, w["norm.weight"]) @ w["tok_embeddings.weight"].T


def sample(seed, n, T):
    rng, out = np.random.default_rng(seed), []
    for _ in range(n):
        t = [1]
        while len(t) < T:
            z = fwd(w, t)[-1]
            p = np.exp(z - z.max())
            t.append(int(rng.choice(len(p), p=p / p.sum())))
        out.append(t)
    return out


cache = os.path.join(os.environ.get("TMPDIR", "/tmp"), "stz-feedback-probe.pkl")
if os.path.exists(cache):
    cal, ev = pickle.load(open(cache, "rb"))
else:
    cal, ev = sample(1, 16, 256), sample(2, 8, 256)
    pickle.dump((cal, ev), open(cache, "wb"))


def lsm(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


LA = [lsm(fwd(w, s)) for s in ev]


def kl(wq):
    r = [(np.exp(la) * (la - lsm(fwd(wq, s)))).sum(-1) for s, la in zip(ev, LA)]
    return float(np.mean(np.concatenate(r)))


def inputs(wm, names):
    col = {}
    for s in cal:
        fwd(wm, s, col)
    return {n: np.concatenate(col[n]) for n in names}


LAYER_GROUPS = [[["layers.%d.attention.w%s.weight" % (l, m) for m in "qkv"], ["layers.%d.attention.wo.weight" % l],
                 ["layers.%d.feed_forward.w%d.weight" % (l, m) for m in (1, 3)], ["layers.%d.feed_forward.w2.weight" % l]]
                for l in range(NL)]
MATS = [n for lg in LAYER_GROUPS for g in lg for n in g]
H0 = {n: x.T @ x for n, x in inputs(w, MATS).items()}


def params(v, d, L):
    """Per row of v (rows, g): the block's minimum and step, searched."""
    mn, mx, best = v.min(1), v.max(1), None
    for f in np.linspace(0.6, 1.0, 17):
        lo, s = mn * f, (mx - mn) * f / (L - 1)
        s[s == 0] = 1
        e = ((v - lo[:, None] - np.clip(np.round((v - lo[:, None]) / s[:, None]), 0, L - 1) * s[:, None]) ** 2 * d).sum(1)
        if best is None:
            best = [lo.copy(), s.copy(), e]
        else:
            m = e < best[2]
            best[0][m], best[1][m], best[2][m] = lo[m], s[m], e[m]
    return best[0], best[1]


def gptq(W, H, L, G=32, act=False, static=False):
    """Error feedback; act: columns by decreasing diag(H); static: block
    parameters from the original W (else from W as updated, at the block)."""
    n = W.shape[1]
    H = H + 0.01 * np.mean(np.diag(H)) * np.eye(n)
    d = np.diag(H).copy()
    P = np.argsort(-d, kind="stable") if act else np.arange(n)
    LO, S = np.zeros_like(W), np.ones_like(W)
    if static:
        for c in range(0, n, G):
            lo, s = params(W[:, c:c + G], d[c:c + G], L)
            LO[:, c:c + G], S[:, c:c + G] = lo[:, None], s[:, None]
    W, LO, S, H = W[:, P].copy(), LO[:, P], S[:, P], H[np.ix_(P, P)]
    U = np.linalg.cholesky(np.linalg.inv(H)).T
    Y = np.empty_like(W)
    for c in range(0, n, G):
        e = min(n, c + G)
        if not static:
            lo, s = params(W[:, c:e], d[P][c:e], L)
            LO[:, c:e], S[:, c:e] = lo[:, None], s[:, None]
        E = np.zeros((W.shape[0], e - c))
        for k in range(c, e):
            Y[:, k] = LO[:, k] + np.clip(np.round((W[:, k] - LO[:, k]) / S[:, k]), 0, L - 1) * S[:, k]
            E[:, k - c] = (W[:, k] - Y[:, k]) / U[k, k]
            W[:, k + 1:e] -= np.outer(E[:, k - c], U[k, k + 1:e])
        W[:, e:] -= E @ U[c:e, e:]
    out = np.empty_like(Y)
    out[:, P] = Y
    return out


def hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def rotation(n, seed, kind):
    rng = np.random.default_rng(seed)
    if kind == "hadamard" and n & (n - 1) == 0:
        return hadamard(n) * rng.choice([-1.0, 1.0], n)[None, :]
    return np.linalg.qr(rng.standard_normal((n, n)))[0]


def one_shot(L, **kw):
    """Every matrix from the original model's inputs (H0)."""
    kind = kw.pop("rotate", None)
    wq = dict(w)
    for i, n in enumerate(MATS):
        if kind:
            R = rotation(w[n].shape[1], i, kind)
            wq[n] = gptq(w[n] @ R, R.T @ H0[n] @ R, L, **kw) @ R.T
        else:
            wq[n] = gptq(w[n], H0[n], L, **kw)
    return kl(wq)


def sequential(L, by_input, drift):
    """Layer by layer; by_input: each input collected with the matrices
    before it quantized (else the layer's from one run with its original
    weights); drift: W moved by W D H^-1 first."""
    wq = dict(w)
    for lg in LAYER_GROUPS:
        steps = lg if by_input else [[n for g in lg for n in g]]
        for g in steps:
            Xq, X = inputs(wq, g), inputs(w, g)
            for n in g:
                H = Xq[n].T @ Xq[n]
                W = w[n]
                if drift:
                    Dm = (X[n] - Xq[n]).T @ Xq[n]
                    W = W + W @ Dm @ np.linalg.inv(H + 0.01 * np.mean(np.diag(H)) * np.eye(H.shape[0]))
                wq[n] = gptq(W, H, L)
    return kl(wq)


def blocks_scaled(W, dim):
    """W's blocks of 32 over their largest magnitude, as points of dim elements; the scales."""
    B = W.reshape(-1, 32)
    s = np.abs(B).max(1, keepdims=True)
    s[s == 0] = 1
    return (B / s).reshape(-1, dim), s


def nearest(P, C):
    out = np.empty(len(P), np.int64)
    for i in range(0, len(P), 8192):
        Q = P[i:i + 8192]
        out[i:i + 8192] = ((Q * Q).sum(1)[:, None] - 2 * Q @ C.T + (C * C).sum(1)[None, :]).argmin(1)
    return out


def fit_codebook(bits, dim):
    """One k-means codebook of 2^(bits dim) points fitted to every layer matrix's scaled blocks."""
    P = np.concatenate([blocks_scaled(w[n], dim)[0] for n in MATS])
    C = P[np.random.default_rng(0).choice(len(P), 2 ** (bits * dim), replace=False)].copy()
    for _ in range(25):
        a = nearest(P, C)
        for j in range(len(C)):
            if (a == j).any():
                C[j] = P[a == j].mean(0)
    return C


def gptq_columns(W, H, scale, quant, dim=1, G=32):
    """Error feedback onto any code: each block's scales scale(block) (rows)
    from W as updated at the block, then dim columns at a time coded by
    quant(columns, scales), each column's error fed on in turn."""
    n = W.shape[1]
    W = W.copy()
    U = np.linalg.cholesky(np.linalg.inv(H + 0.01 * np.mean(np.diag(H)) * np.eye(n))).T
    Y = np.empty_like(W)
    for c in range(0, n, G):
        e = min(n, c + G)
        s = scale(W[:, c:e])
        s[s == 0] = 1
        E = np.zeros((W.shape[0], e - c))
        for k in range(c, e, dim):
            Y[:, k:k + dim] = quant(W[:, k:k + dim], s)
            for j in range(k, k + dim):
                E[:, j - c] = (W[:, j] - Y[:, j]) / U[j, j]
                W[:, j + 1:e] -= np.outer(E[:, j - c], U[j, j + 1:e])
        W[:, e:] -= E @ U[c:e, e:]
    return Y


def gptq_codebook(W, H, C, dim):
    """Error feedback onto codebook C: each block's scale its largest
    magnitude, dim columns at a time to their nearest point."""
    return gptq_columns(W, H, lambda b: np.abs(b).max(1),
                        lambda x, s: C[nearest(x / s[:, None], C)] * s[:, None], dim)


def sequential_with(quant):
    """sequential(by_input, drift) with quant(W, H) for gptq."""
    wq = dict(w)
    for lg in LAYER_GROUPS:
        for g in lg:
            Xq, X = inputs(wq, g), inputs(w, g)
            for n in g:
                H = Xq[n].T @ Xq[n]
                Dm = (X[n] - Xq[n]).T @ Xq[n]
                Wm = w[n] + w[n] @ Dm @ np.linalg.inv(H + 0.01 * np.mean(np.diag(H)) * np.eye(H.shape[0]))
                wq[n] = quant(Wm, H)
    return kl(wq)


def sequential_codebook(C, dim):
    return sequential_with(lambda W, H: gptq_codebook(W, H, C, dim))


def trellis_code(L):
    """State -> value: the 2^L quantiles of a unit Gaussian in a fixed random
    order; TRELLIS_CODE=1mad: QTIP's computed code, the sum of the four bytes
    of 34038481 s + 76625530 mod 2^32, centred and scaled to unit variance."""
    if os.environ.get("TRELLIS_CODE") == "1mad":
        x = (np.arange(1 << L, dtype=np.uint64) * 34038481 + 76625530) & 0xFFFFFFFF
        return (sum((x >> (8 * i)) & 255 for i in range(4)).astype(np.float64) - 510) / np.sqrt(4 * (256 ** 2 - 1) / 12)
    from statistics import NormalDist
    q = np.array([NormalDist().inv_cdf((i + 0.5) / (1 << L)) for i in range(1 << L)])
    return q[np.random.default_rng(0).permutation(1 << L)]


def viterbi(x, sc, code, L, B, start=None, tail=None):
    """The values of the bitshift trellis (states of L bits, B new bits per
    step; from state start, or any) closest to x, each state's value times
    sc; the states. tail: the stream is circular, its first state's top
    L - B bits are tail and so are its last state's low ones."""
    S, n = 1 << L, len(x)
    cost = (x[0] - sc[0] * code) ** 2
    if start is not None or tail is not None:
        succ = ((start << B) | np.arange(1 << B)) & (S - 1) if tail is None else (tail << B) | np.arange(1 << B)
        keep, cost = cost[succ], np.full(S, np.inf)
        cost[succ] = keep
    back = np.empty((n, S >> B), np.int64)
    low = np.arange(S >> B)
    for t in range(1, n):
        c2 = cost.reshape(1 << B, S >> B)
        hi = c2.argmin(0)
        back[t] = hi
        cost = np.repeat(c2[hi, low], 1 << B) + (x[t] - sc[t] * code) ** 2
    st = np.empty(n, np.int64)
    if tail is not None:
        cost = np.where((np.arange(S) & ((1 << (L - B)) - 1)) == tail, cost, np.inf)
    st[-1] = cost.argmin()
    for t in range(n - 1, 0, -1):
        st[t - 1] = (back[t][st[t] >> B] << (L - B)) | (st[t] >> B)
    return code[st] * sc, st


def gptq_trellis(W, H, code, L, B, alpha, carry):
    """Error feedback with each input's column (all rows) coded by the
    trellis, each block's scale alpha times its RMS; carry as TRELLIS_CARRY
    (module doc)."""
    last = None

    def column(x, s):
        nonlocal last
        x = x[:, 0]
        if carry == 2:  # tail-biting (QTIP's): the free path of the column rotated by half, its state where
            h = len(s) // 2  # the column ends; then the circular path through that state's low bits
            _, st = viterbi(np.roll(x, -h), np.roll(s, -h), code, L, B)
            y, _ = viterbi(x, s, code, L, B, tail=int(st[len(s) - 1 - h]) & ((1 << (L - B)) - 1))
        else:
            y, st = viterbi(x, s, code, L, B, last if carry else None)
            last = int(st[-1])
        return y[:, None]
    return gptq_columns(W, H, lambda b: np.sqrt((b ** 2).mean(1)) * alpha, column)


def sequential_trellis(L, B, alpha, carry):
    code = trellis_code(L)
    return sequential_with(lambda W, H: gptq_trellis(W, H, code, L, B, alpha, carry))


def codebook_kl(bits, dim):
    """Every layer matrix rounded to one k-means codebook fitted to all of them."""
    C = fit_codebook(bits, dim)
    wq, err = dict(w), 0
    for n in MATS:
        Q, s = blocks_scaled(w[n], dim)
        wq[n] = (C[nearest(Q, C)].reshape(-1, 32) * s).reshape(w[n].shape)
        err += ((wq[n] - w[n]) ** 2).sum() / (w[n] ** 2).sum() / len(MATS)
    return err, kl(wq)


what = sys.argv[2:] or ["rotation", "act-order", "calibrate"]
for L, bits in ((8, 3), (4, 2), (16, 4)):
    if str(bits) not in os.environ.get("PROBE_BITS", "3,2,4").split(","):
        continue
    if "rotation" in what:
        print("%d bits, rotation: none %.4f, orthogonal %.4f, hadamard %.4f" %
              (bits, one_shot(L), one_shot(L, rotate="orthogonal"), one_shot(L, rotate="hadamard")), flush=True)
    if "act-order" in what:
        print("%d bits, act-order: dynamic groups %.4f, static groups %.4f, static + act-order %.4f" %
              (bits, one_shot(L), one_shot(L, static=True), one_shot(L, static=True, act=True)), flush=True)
    if "codebooks" in what:
        for dim in (1, 2, 4):
            if 2 ** (bits * dim) <= 4096:
                print("%d bits, codebook of %d-element points: relative squared error %.4f, KL %.4f" %
                      ((bits, dim) + codebook_kl(bits, dim)), flush=True)
    if "codebooks-feedback" in what:
        for dim in (1, 2):
            print("%d bits, codebook of %d-element points, error feedback (input by input, drift): KL %.4f" %
                  (bits, dim, sequential_codebook(fit_codebook(bits, dim), dim)), flush=True)
    if "trellis" in what:
        for Lt in [int(v) for v in os.environ.get("TRELLIS_L", "12,16").split(",")]:
            for alpha in [float(v) for v in os.environ.get("TRELLIS_SCALE", "1").split(",")]:
                for carry in [int(v) for v in os.environ.get("TRELLIS_CARRY", "2").split(",")]:
                    print("%d bits, trellis of %d-bit states, scale %.2f x RMS, %s, error feedback: KL %.4f" %
                          (bits, Lt, alpha, ("free start", "carried", "tail-biting")[carry],
                           sequential_trellis(Lt, bits, alpha, carry)), flush=True)
    if "calibrate" in what:
        print("%d bits, sequential: layer at once %.4f, with drift %.4f; input by input %.4f, with drift %.4f" %
              (bits, sequential(L, False, False), sequential(L, False, True), sequential(L, True, False),
               sequential(L, True, True)), flush=True)
