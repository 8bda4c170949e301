"""More families of equivalent spellings (issue 31, "outside suites hold spellings you
will not see"): the spellings src/einfuse/bench/spellings.py's corpus lacked, written as
an outside suite would -- softmax, log-softmax, logsumexp, layernorm, RMSNorm,
cross-entropy, attention, matrix products, spatial means, squared distances and
convolutions, each in the forms users write.  The first spelling of a family is the
form einfuse is known to run well; every other should run within 1.3x of it.

Each family has a NumPy formulation (``reference``) that its spellings must equal, and
its inputs.  Used by ``benchmarks/spelling_families.py`` (ratios), ``einfuse bench``
(``audit_cases``) and tests/test_spelling_audit.py (values against NumPy and
tests/oracle.py; the same canonical program where two spellings are one computation)."""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from .spellings import Family, cases_of

Arrays = Dict[str, np.ndarray]

SOFTMAX_MORE = (
    ("three statements",
     "M[i] := max[j](X[i,j])\nE[i,j] := exp(X[i,j] - M[i])\nZ[i] := sum[j](E[i,j])\n"
     "P[i,j] := E[i,j] / Z[i]"),
    ("max, then exp and sum inline",
     "M[i] := max[j](X[i,j])\nZ[i] := sum[j](exp(X[i,j] - M[i]))\n"
     "P[i,j] := exp(X[i,j] - M[i]) / Z[i]"),
    ("times the reciprocal",
     "M[i] := max[j](X[i,j])\nE[i,j] := exp(X[i,j] - M[i])\nZ[i] := sum[j](E[i,j])\n"
     "P[i,j] := E[i,j] * (1 / Z[i])"),
    ("reciprocal statement",
     "M[i] := max[j](X[i,j])\nE[i,j] := exp(X[i,j] - M[i])\nr[i] := 1 / sum[j](E[i,j])\n"
     "P[i,j] := E[i,j] * r[i]"),
    ("logsumexp statement",
     "L[i] := logsumexp[j](X[i,j])\nP[i,j] := exp(X[i,j] - L[i])"),
    ("exp(x - max - log(sum))",
     "M[i] := max[j](X[i,j])\nZ[i] := sum[j](exp(X[i,j] - M[i]))\n"
     "P[i,j] := exp(X[i,j] - M[i] - log(Z[i]))"),
    ("exp(-max + x)",
     "M[i] := max[j](X[i,j])\nE[i,j] := exp(-M[i] + X[i,j])\nZ[i] := sum[j](E[i,j])\n"
     "P[i,j] := E[i,j] / Z[i]"),
)

LOG_SOFTMAX = (
    ("x - logsumexp(x)", "Y[i,j] := X[i,j] - logsumexp[k](X[i,k])"),
    ("logsumexp statement", "L[i] := logsumexp[j](X[i,j])\nY[i,j] := X[i,j] - L[i]"),
    ("x - max - log(sum(exp))",
     "M[i] := max[j](X[i,j])\nY[i,j] := X[i,j] - M[i] - log(sum[k](exp(X[i,k] - M[i])))"),
    ("max and log-sum statements",
     "M[i] := max[j](X[i,j])\nZ[i] := sum[j](exp(X[i,j] - M[i]))\n"
     "Y[i,j] := X[i,j] - M[i] - log(Z[i])"),
)

LOGSUMEXP = (
    ("logsumexp", "L[i] := logsumexp[j](X[i,j])"),
    ("max + log(sum(exp)) in one",
     "L[i] := max[j](X[i,j]) + log(sum[k](exp(X[i,k] - max[l](X[i,l]))))"),
    ("max statement, then log-sum",
     "M[i] := max[j](X[i,j])\nL[i] := M[i] + log(sum[j](exp(X[i,j] - M[i])))"),
    ("log-sum first, max added last",
     "M[i] := max[j](X[i,j])\nL[i] := log(sum[j](exp(X[i,j] - M[i]))) + M[i]"),
)

LAYERNORM_MORE = (
    ("explicit sums",
     "m[i] := sum[j](X[i,j]) / {n}\nv[i] := sum[j]((X[i,j] - m[i])**2) / {n}\n"
     "Y[i,j] := (X[i,j] - m[i]) / sqrt(v[i] + 1e-05) * g[j] + b[j]"),
    ("times rsqrt",
     "m[i] := sum[j](X[i,j]) / {n}\nv[i] := sum[j]((X[i,j] - m[i])**2) / {n}\n"
     "Y[i,j] := (X[i,j] - m[i]) * (1 / sqrt(v[i] + 1e-05)) * g[j] + b[j]"),
    ("rsqrt statement",
     "m[i] := sum[j](X[i,j]) / {n}\nv[i] := sum[j]((X[i,j] - m[i])**2) / {n}\n"
     "r[i] := 1 / sqrt(v[i] + 1e-05)\nY[i,j] := (X[i,j] - m[i]) * r[i] * g[j] + b[j]"),
    ("centred statement",
     "m[i] := sum[j](X[i,j]) / {n}\nC[i,j] := X[i,j] - m[i]\n"
     "v[i] := sum[j](C[i,j]**2) / {n}\nY[i,j] := C[i,j] / sqrt(v[i] + 1e-05) * g[j] + b[j]"),
    ("(x-m)*(x-m)",
     "m[i] := sum[j](X[i,j]) / {n}\nv[i] := sum[j]((X[i,j] - m[i]) * (X[i,j] - m[i])) / {n}\n"
     "Y[i,j] := (X[i,j] - m[i]) / sqrt(v[i] + 1e-05) * g[j] + b[j]"),
    ("gain first",
     "m[i] := sum[j](X[i,j]) / {n}\nv[i] := sum[j]((X[i,j] - m[i])**2) / {n}\n"
     "Y[i,j] := g[j] * (X[i,j] - m[i]) / sqrt(v[i] + 1e-05) + b[j]"),
    ("bias and gain first",
     "m[i] := sum[j](X[i,j]) / {n}\nv[i] := sum[j]((X[i,j] - m[i])**2) / {n}\n"
     "Y[i,j] := b[j] + g[j] * (X[i,j] - m[i]) / sqrt(v[i] + 1e-05)"),
    ("gain times the quotient in parentheses",
     "m[i] := sum[j](X[i,j]) / {n}\nv[i] := sum[j]((X[i,j] - m[i])**2) / {n}\n"
     "Y[i,j] := g[j] * ((X[i,j] - m[i]) / sqrt(v[i] + 1e-05)) + b[j]"),
    ("(m-x)**2, epsilon first, gain between",
     "m[i] := sum[j](X[i,j]) / {n}\nv[i] := sum[j]((m[i] - X[i,j])**2) / {n}\n"
     "Y[i,j] := (X[i,j] - m[i]) * g[j] / sqrt(1e-05 + v[i]) + b[j]"),
)

RMSNORM = (
    ("mean-square statement",
     "r[i] := sum[j](X[i,j] * X[i,j]) / {n}\nY[i,j] := X[i,j] / sqrt(r[i] + 1e-06) * g[j]"),
    ("mean sugar, one statement",
     "Y[i,j] := X[i,j] / sqrt(mean[k](X[i,k]**2) + 1e-06) * g[j]"),
    ("squared with **2", "r[i] := sum[j](X[i,j]**2) / {n}\n"
     "Y[i,j] := X[i,j] / sqrt(r[i] + 1e-06) * g[j]"),
    ("times rsqrt", "r[i] := sum[j](X[i,j] * X[i,j]) / {n}\n"
     "Y[i,j] := X[i,j] * (1 / sqrt(r[i] + 1e-06)) * g[j]"),
    ("rms statement, gain first", "s[i] := sqrt(mean[j](X[i,j]**2) + 1e-06)\n"
     "Y[i,j] := g[j] * X[i,j] / s[i]"),
)

CROSS_ENTROPY = (
    ("gather", "L[n] := logsumexp[c](X[n,c]) - X[n, y[n]]"),
    ("one-hot product", "L[n] := logsumexp[c](X[n,c]) - sum[c](X[n,c] * (c == y[n]))"),
    ("where", "L[n] := logsumexp[c](X[n,c]) - sum[c](where(c == y[n], X[n,c], 0))"),
    ("max and log-sum statements",
     "M[n] := max[c](X[n,c])\nL[n] := M[n] + log(sum[c](exp(X[n,c] - M[n]))) - X[n, y[n]]"),
    ("minus log-softmax at the label",
     "Y[n,c] := X[n,c] - logsumexp[k](X[n,k])\nL[n] := -Y[n, y[n]]"),
    # (as written: exp overflows where logsumexp does not -- no rule makes it the first)
    ("-log(exp(x_y) / sum(exp))", "L[n] := -log(exp(X[n, y[n]]) / sum[c](exp(X[n,c])))"),
)

_DOT = "sum[d](Q[b,h,i,d] * K[b,h,j,d])"
_SOFTMAX_V = ("m[b,h,i] := max[j](S[b,h,i,j])\nP[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
              "O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / sum[j](P[b,h,i,j])")
ATTENTION_MORE = (
    ("mask on the scores", f"S[b,h,i,j] := where(j <= i, {_DOT} * {{scale}}, -inf)\n"
     + _SOFTMAX_V),
    ("scale on q", "S[b,h,i,j] := where(j <= i, sum[d](Q[b,h,i,d] * {scale} * K[b,h,j,d]),"
     " -inf)\n" + _SOFTMAX_V),
    ("scale on k", "S[b,h,i,j] := where(j <= i, sum[d](Q[b,h,i,d] * (K[b,h,j,d] * {scale})),"
     " -inf)\n" + _SOFTMAX_V),
    ("scale first", f"S[b,h,i,j] := where(j <= i, {{scale}} * {_DOT}, -inf)\n"
     + _SOFTMAX_V),
    ("scale divided", f"S[b,h,i,j] := where(j <= i, {_DOT} / {{root}}, -inf)\n"
     + _SOFTMAX_V),
    ("additive -inf mask", f"S[b,h,i,j] := {_DOT} * {{scale}} + where(j <= i, 0, -inf)\n"
     + _SOFTMAX_V),
    ("mask out where j > i", f"S[b,h,i,j] := where(j > i, -inf, {_DOT} * {{scale}})\n"
     + _SOFTMAX_V),
    ("times the reciprocal of the sum",
     f"S[b,h,i,j] := where(j <= i, {_DOT} * {{scale}}, -inf)\n"
     "m[b,h,i] := max[j](S[b,h,i,j])\nP[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
     "O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) * (1 / sum[j](P[b,h,i,j]))"),
    ("V first in the weighted sum",
     f"S[b,h,i,j] := where(j <= i, {_DOT} * {{scale}}, -inf)\n"
     "m[b,h,i] := max[j](S[b,h,i,j])\nP[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
     "O[b,h,i,e] := sum[j](V[b,h,j,e] * P[b,h,i,j]) / sum[j](P[b,h,i,j])"),
    ("normaliser statement",
     f"S[b,h,i,j] := where(j <= i, {_DOT} * {{scale}}, -inf)\n"
     "m[b,h,i] := max[j](S[b,h,i,j])\nP[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
     "z[b,h,i] := sum[j](P[b,h,i,j])\nO[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / z[b,h,i]"),
    ("heads-last layout (einops 'b n (h d)')",
     "S[b,h,i,j] := where(j <= i, sum[d](Qs[b,i,h,d] * Ks[b,j,h,d]) * {scale}, -inf)\n"
     "m[b,h,i] := max[j](S[b,h,i,j])\nP[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
     "O[b,h,i,e] := sum[j](P[b,h,i,j] * Vs[b,j,h,e]) / sum[j](P[b,h,i,j])"),
)

MATMUL = (
    ("A[i,k] * B[k,j]", "C[i,j] := A[i,k] * B[k,j]"),
    ("operands swapped", "C[i,j] := B[k,j] * A[i,k]"),
    ("explicit sum, other names", "C[r,c] := sum[t](A[r,t] * B[t,c])"),
    ("A stored transposed", "C[i,j] := At[k,i] * B[k,j]"),
    ("B stored transposed", "C[i,j] := A[i,k] * Bt[j,k]"),
    ("scaled after", "C[i,j] := A[i,k] * B[k,j] * 1.0"),
)

BATCHED_MATMUL = (
    ("batch first", "C[b,i,j] := A[b,i,k] * B[b,k,j]"),
    ("batch in the middle of the output", "C[b,i,j] := sum[k](B[b,k,j] * A[b,i,k])"),
    ("A batch-middle layout", "C[b,i,j] := Am[i,b,k] * B[b,k,j]"),
    ("B transposed per batch", "C[b,i,j] := A[b,i,k] * Bt[b,j,k]"),
)

SPATIAL_MEAN = (
    ("mean[h,w]", "y[b,c] := mean[h,w](x[b,c,h,w])"),
    ("sum over the count", "y[b,c] := sum[h,w](x[b,c,h,w]) / {hw}"),
    ("nested sums", "y[b,c] := sum[h](sum[w](x[b,c,h,w])) / {hw}"),
    ("nested means", "y[b,c] := mean[h](mean[w](x[b,c,h,w]))"),
    ("row sums statement", "r[b,c,h] := sum[w](x[b,c,h,w])\ny[b,c] := sum[h](r[b,c,h]) / {hw}"),
)

DIST = (
    ("(a-b)**2", "D[i,j] := sum[k]((A[i,k] - B[j,k])**2)"),
    ("(a-b)*(a-b)", "D[i,j] := sum[k]((A[i,k] - B[j,k]) * (A[i,k] - B[j,k]))"),
    ("(b-a)**2", "D[i,j] := sum[k]((B[j,k] - A[i,k])**2)"),
    ("implicit sum", "D[i,j] := (A[i,k] - B[j,k])**2"),
    ("difference statement", "T[i,j,k] := A[i,k] - B[j,k]\nD[i,j] := sum[k](T[i,j,k]**2)"),
)

GAUSS = (
    ("exp(-sum((a-b)**2) / s)", "G[i,j] := exp(-sum[k]((A[i,k] - B[j,k])**2) / {s})"),
    ("exp(-s' * sum)", "G[i,j] := exp(-{inv} * sum[k]((A[i,k] - B[j,k])**2))"),
    ("sum(...) * -s'", "G[i,j] := exp(sum[k]((A[i,k] - B[j,k]) * (A[i,k] - B[j,k])) * -{inv})"),
    ("distance statement", "D[i,j] := sum[k]((A[i,k] - B[j,k])**2)\nG[i,j] := exp(-D[i,j] / {s})"),
)

CONV1D = (
    ("x[c,i+a] * w[o,c,a]", "y[o,i] := x[c,i+a] * w[o,c,a]"),
    ("x[c,a+i]", "y[o,i] := x[c,a+i] * w[o,c,a]"),
    ("weights first, explicit sum", "y[o,i] := sum[c,a](w[o,c,a] * x[c,i+a])"),
    ("other index names", "y[f,t] := x[ch,t+tap] * w[f,ch,tap]"),
    ("sum over taps outside", "y[o,i] := sum[a](sum[c](x[c,i+a] * w[o,c,a]))"),
)


def _softmax(X):
    e = np.exp(X - X.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _logsumexp(X):
    m = X.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(X - m).sum(axis=-1, keepdims=True)))[..., 0]


def _layernorm(X, g, b):
    m = X.mean(axis=1, keepdims=True)
    return (X - m) / np.sqrt(((X - m) ** 2).mean(axis=1, keepdims=True) + 1e-5) * g + b


def _attention(Q, K, V):
    n = Q.shape[2]
    S = np.einsum("bhid,bhjd->bhij", Q, K) / np.sqrt(Q.shape[3])
    S = np.where(np.tril(np.ones((n, n), bool)), S, -np.inf)
    return np.einsum("bhij,bhje->bhie", _softmax(S), V)


def _sqdist(A, B):
    return ((A[:, None, :] - B[None, :, :]) ** 2).sum(axis=2)


def _family(name, spellings, inputs, reference, **subs) -> Family:
    texts = []
    for spelling, text in spellings:
        for key, value in subs.items():
            text = text.replace("{" + key + "}", str(value))
        texts.append((spelling, text))
    return Family(name, tuple(texts), inputs, reference)


def _normal(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def rows_families(rows: int, cols: int) -> List[Family]:
    def x(rng):
        return {"X": _normal(rng, rows, cols)}

    def xgb(rng):
        return {"X": _normal(rng, rows, cols), "g": _normal(rng, cols), "b": _normal(rng, cols)}

    def labels(rng, dtype=np.int64):
        return {"X": _normal(rng, rows, cols),
                "y": rng.integers(0, cols, rows).astype(dtype)}

    size = f"{rows}x{cols}"
    return [
        _family(f"softmax (more) {size}", SOFTMAX_MORE, x, lambda a: _softmax(a["X"])),
        _family(f"log-softmax {size}", LOG_SOFTMAX, x,
                lambda a: a["X"] - _logsumexp(a["X"])[:, None]),
        _family(f"logsumexp {size}", LOGSUMEXP, x, lambda a: _logsumexp(a["X"])),
        _family(f"layernorm (more) {size}", LAYERNORM_MORE, xgb,
                lambda a: _layernorm(a["X"], a["g"], a["b"]), n=cols),
        _family(f"RMSNorm {size}", RMSNORM, xgb, lambda a: a["X"] / np.sqrt(
            (a["X"] ** 2).mean(axis=1, keepdims=True) + 1e-6) * a["g"], n=cols),
        _family(f"cross-entropy {size}", CROSS_ENTROPY, labels, lambda a: _logsumexp(a["X"])
                - a["X"][np.arange(rows), a["y"]]),
        # int16 labels: labels read only to be compared do not promote (notation.md
        # section 10), so every spelling is float32 with int64 labels as with int16 ones;
        # the second family keeps the narrow labels' figures beside the int64 ones
        _family(f"cross-entropy, int16 labels {size}", CROSS_ENTROPY,
                lambda rng: labels(rng, np.int16), lambda a: _logsumexp(a["X"])
                - a["X"][np.arange(rows), a["y"]]),
    ]


def attention_more(B: int, H: int, N: int, D: int) -> Family:
    def inputs(rng):
        arrays = {name: _normal(rng, B, H, N, D) for name in "QKV"}
        for name in "QKV":     # the same tensors, heads after the sequence axis
            arrays[name + "s"] = np.ascontiguousarray(arrays[name].transpose(0, 2, 1, 3))
        return arrays

    return _family(f"causal attention (more) B={B} H={H} N={N} D={D}", ATTENTION_MORE,
                   inputs, lambda a: _attention(a["Q"], a["K"], a["V"]),
                   scale=repr(float(1 / np.sqrt(D))), root=repr(float(np.sqrt(D))))


def products(n: int, batch: int, bn: int) -> List[Family]:
    def mm(rng):
        A, B = _normal(rng, n, n), _normal(rng, n, n)
        return {"A": A, "B": B, "At": np.ascontiguousarray(A.T), "Bt": np.ascontiguousarray(B.T)}

    def bmm(rng):
        A, B = _normal(rng, batch, bn, bn), _normal(rng, batch, bn, bn)
        return {"A": A, "B": B, "Am": np.ascontiguousarray(A.transpose(1, 0, 2)),
                "Bt": np.ascontiguousarray(B.transpose(0, 2, 1))}

    return [_family(f"matmul {n}^3", MATMUL, mm, lambda a: a["A"] @ a["B"]),
            _family(f"batched matmul {batch}x{bn}^3", BATCHED_MATMUL, bmm,
                    lambda a: a["A"] @ a["B"])]


def spatial_family(b: int, c: int, h: int, w: int) -> Family:
    return _family(f"mean over H,W {b}x{c}x{h}x{w}", SPATIAL_MEAN,
                   lambda rng: {"x": _normal(rng, b, c, h, w)},
                   lambda a: a["x"].mean(axis=(2, 3)), hw=h * w)


def distance_families(m: int, n: int, k: int) -> List[Family]:
    def ab(rng):
        return {"A": _normal(rng, m, k), "B": _normal(rng, n, k)}

    s = float(2 * k)
    return [_family(f"squared distance {m}x{n} K={k}", DIST, ab,
                    lambda a: _sqdist(a["A"], a["B"])),
            _family(f"gaussian kernel {m}x{n} K={k}", GAUSS, ab,
                    lambda a: np.exp(-_sqdist(a["A"], a["B"]) / s), s=repr(s),
                    inv=repr(1 / s))]


def conv_family(channels: int, out: int, length: int, taps: int) -> Family:
    def reference(a):
        x, w = a["x"], a["w"]
        n = x.shape[1] - w.shape[2] + 1
        return sum(np.einsum("oc,ci->oi", w[:, :, t], x[:, t:t + n]) for t in range(w.shape[2]))

    return _family(f"conv1d C={channels} O={out} L={length} taps={taps}", CONV1D,
                   lambda rng: {"x": _normal(rng, channels, length),
                                "w": _normal(rng, out, channels, taps)}, reference)


def audit_families(quick: bool = False) -> List[Family]:
    if quick:
        return rows_families(24, 40) + [attention_more(1, 2, 24, 8)] + products(24, 3, 16) + \
            [spatial_family(2, 3, 5, 7)] + distance_families(12, 10, 6) + \
            [conv_family(3, 4, 30, 3)]
    return rows_families(2048, 1024) + [attention_more(1, 2, 1024, 64)] + \
        products(512, 16, 128) + [spatial_family(16, 64, 32, 32)] + \
        distance_families(1024, 1024, 64) + [conv_family(32, 32, 8192, 5)]


def audit_cases(quick: bool = False):
    """The audit's families as ``einfuse bench`` cases (each spelling against its
    family's first)."""
    return cases_of(audit_families(quick))
