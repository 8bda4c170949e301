"""Benchmark cases: an einfuse statement, its inputs, and the same computation written
for each peer (NumPy, PyTorch eager, torch.compile, jax.jit, pykeops).

Peers are built lazily and only when their package is installed.  A peer whose
formulation would allocate more than ``MEMORY_CAP`` bytes (eager broadcasting at
N=10^5) is listed with that reason instead of being run.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

MEMORY_CAP = 6 * 2**30

Inputs = Dict[str, np.ndarray]


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@dataclass
class Peer:
    name: str
    make: Callable[[Inputs], Callable[[], object]]
    needs: str = "numpy"
    skip_reason: Optional[str] = None


@dataclass
class Case:
    name: str
    statement: str
    inputs: Callable[[np.random.Generator], Inputs]
    peers: List[Peer] = field(default_factory=list)
    options: Dict[str, object] = field(default_factory=dict)
    # builds einfuse's timed callable from (inputs, backend); default: the forward kernel
    einfuse_call: Optional[Callable[[Inputs, str], Callable[[], object]]] = None


def _too_big(nbytes: int) -> Optional[str]:
    return f"would allocate {nbytes / 2**30:.1f} GiB" if nbytes > MEMORY_CAP else None


def numpy_peer(name: str, fn, nbytes: int = 0) -> Peer:
    return Peer(name, lambda arrays: (lambda: fn(**arrays)), "numpy", _too_big(nbytes))


def torch_peer(name: str, fn, compiled: bool = False, nbytes: int = 0) -> Peer:
    def make(arrays):
        import torch
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
        call = torch.compile(fn) if compiled else fn

        def run():
            with torch.no_grad():
                return call(**tensors)
        return run
    return Peer(name, make, "torch", None if compiled else _too_big(nbytes))


def jax_peer(name: str, fn) -> Peer:
    def make(arrays):
        import jax
        import jax.numpy as jnp
        values = {k: jnp.asarray(v) for k, v in arrays.items()}
        jitted = jax.jit(fn)
        return lambda: jitted(**values).block_until_ready()
    return Peer(name, make, "jax")


def broadcasting_peers(formula, nbytes: int) -> List[Peer]:
    """One array-API formula, ``formula(xp)`` returning a function of the inputs, run by
    NumPy, torch eager, torch.compile and jax.jit."""
    def torch_fn(**arrays):
        import torch
        return formula(torch)(**arrays)

    def jax_fn(**arrays):
        import jax.numpy as jnp
        return formula(jnp)(**arrays)
    return [numpy_peer("numpy broadcast", formula(np), nbytes),
            torch_peer("torch eager", torch_fn, nbytes=nbytes),
            torch_peer("torch.compile", torch_fn, compiled=True),
            jax_peer("jax.jit", jax_fn)]


def dist_case(K=784, N=1024, M=1024) -> Case:
    def inputs(rng):
        return {"w": rng.standard_normal((K, N), dtype=np.float32),
                "x": rng.standard_normal((K, M), dtype=np.float32)}

    def formula(xp):
        return lambda w, x: ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)
    return Case(f"dist K={K} N=M={N}", "D[i,j] := (w[k,i] - x[k,j])**2", inputs,
                broadcasting_peers(formula, K * N * M * 4))


def gauss_case(N: int, D: int = 3) -> Case:
    def inputs(rng):
        return {"x": rng.standard_normal((N, D), dtype=np.float32),
                "y": rng.standard_normal((N, D), dtype=np.float32),
                "b": rng.standard_normal(N, dtype=np.float32)}

    def formula(xp):
        def gauss(x, y, b):
            d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
            return (xp.exp(-d2) * b[None, :]).sum(1)
        return gauss

    def keops(arrays):
        from pykeops.numpy import LazyTensor
        xi = LazyTensor(arrays["x"][:, None, :])
        yj = LazyTensor(arrays["y"][None, :, :])
        bj = LazyTensor(arrays["b"][None, :, None])
        kernel = (-((xi - yj) ** 2).sum(-1)).exp() * bj
        return lambda: kernel.sum(axis=1)
    peers = broadcasting_peers(formula, N * N * D * 4)
    peers.append(Peer("pykeops", keops, "pykeops"))
    return Case(f"gauss N={N:.0e}".replace("+0", ""),
                "o[i] := sum[j](exp(-sum[d]((x[i,d] - y[j,d])**2)) * b[j])", inputs, peers)


def gauss_dist_case(K=784, N=1024, M=1024) -> Case:
    """The Gaussian-kernel sum over squared distances of long vectors (dist's shape
    under exp and a sum: plan/epilogue_blocks.py); torch's peer takes the GEMM route
    of cdist."""
    statement = "g[i] := sum[j](exp(-sum[k]((w[k,i] - x[k,j])**2) * 0.5))"

    def inputs(rng):
        return {"w": rng.standard_normal((K, N), dtype=np.float32) * 0.05,
                "x": rng.standard_normal((K, M), dtype=np.float32) * 0.05}

    def cdist(w, x):
        import torch
        return torch.exp(-torch.cdist(w.T, x.T) ** 2 * 0.5).sum(1)
    # (no broadcasting peers: their K x N x M intermediate takes NumPy 10 s a call)
    return Case(f"gauss-dist K={K} N=M={N}", statement, inputs,
                [torch_peer("torch cdist**2 (GEMM)", cdist)])


def matmul_case(n=1024) -> Case:
    def inputs(rng):
        return {"A": rng.standard_normal((n, n), dtype=np.float32),
                "B": rng.standard_normal((n, n), dtype=np.float32)}
    return Case(f"matmul {n}^3", "C[i,j] := A[i,k] * B[k,j]", inputs, [
        numpy_peer("numpy matmul", lambda A, B: A @ B),
        torch_peer("torch matmul", lambda A, B: A @ B)])


def bmm_rev_case(n=128, batch=32) -> Case:
    def inputs(rng):
        return {"A": rng.standard_normal((n, n, batch), dtype=np.float32),
                "B": rng.standard_normal((n, n, batch), dtype=np.float32)}

    def torch_einsum(A, B):
        import torch
        return torch.einsum("ikb,kjb->ijb", A, B)
    return Case(f"bmm_rev b={batch} {n}^3", "C[i,j,b] := A[i,k,b] * B[k,j,b]", inputs, [
        numpy_peer("numpy einsum", lambda A, B: np.einsum("ikb,kjb->ijb", A, B,
                                                          optimize=True)),
        torch_peer("torch einsum", torch_einsum)])


def conv2d_case(n=1000, k=7) -> Case:
    def inputs(rng):
        return {"img": rng.standard_normal((n, n), dtype=np.float32),
                "ker": rng.standard_normal((k, k), dtype=np.float32)}

    def torch_conv(img, ker):
        import torch.nn.functional as F
        return F.conv2d(img[None, None], ker[None, None])[0, 0]

    def numpy_windows(img, ker):
        windows = np.lib.stride_tricks.sliding_window_view(img, ker.shape)
        return np.einsum("ijab,ab->ij", windows, ker, optimize=True)
    return Case(f"conv2d {n}x{n} * {k}x{k}", "o[i,j] := img[i+a, j+b] * ker[a,b]", inputs,
                [numpy_peer("numpy windows+einsum", numpy_windows),
                 torch_peer("torch conv2d", torch_conv)])


def embed_case(V=50000, D=256, B=16384) -> Case:
    def inputs(rng):
        return {"W": rng.standard_normal((V, D), dtype=np.float32),
                "idx": rng.integers(0, V, B).astype(np.int64)}

    def torch_embedding(W, idx):
        import torch.nn.functional as F
        return F.embedding(idx, W)
    return Case(f"embed V={V} D={D} B={B}", "E[b,d] := W[idx[b], d]", inputs, [
        numpy_peer("numpy take", lambda W, idx: np.take(W, idx, axis=0)),
        torch_peer("torch embedding", torch_embedding)])


def logsumexp_case(n=4096) -> Case:
    def inputs(rng):
        return {"X": rng.standard_normal((n, n), dtype=np.float32)}

    def numpy_lse(X):
        m = X.max(1, keepdims=True)
        return (m + np.log(np.exp(X - m).sum(1, keepdims=True)))[:, 0]

    def torch_lse(X):
        import torch
        return torch.logsumexp(X, 1)
    return Case(f"logsumexp {n}x{n}", "z[i] := logsumexp[j](X[i,j])", inputs,
                [numpy_peer("numpy", numpy_lse), torch_peer("torch logsumexp", torch_lse)])


ATTENTION = """S[b,h,i,j] := where(j <= i, sum[d](Q[b,h,i,d]*K[b,h,j,d]) * {scale}, -inf)
m[b,h,i]   := max[j](S[b,h,i,j])
P[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])
O[b,h,i,d] := sum[j](P[b,h,i,j] * V[b,h,j,d]) / sum[j](P[b,h,i,j])"""


def attention_inputs(B: int, H: int, N: int, D: int):
    """Q, K and V of shape (B, H, N, D), float32 normal values."""
    def inputs(rng):
        return {name: rng.standard_normal((B, H, N, D), dtype=np.float32)
                for name in ("Q", "K", "V")}
    return inputs


def sdpa_attention(scale: float, causal: bool):
    """torch's scaled_dot_product_attention with this scale and mask, as a peer."""
    def sdpa(Q, K, V):
        import torch
        return torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=causal,
                                                                scale=scale)
    return sdpa


def attention_case(B=4, H=8, N=1024, D=64) -> Case:
    """Causal attention written as four statements (issue 10): one fused kernel with
    online softmax against torch's SDPA and the naive form that materialises S."""
    scale = float(1.0 / np.sqrt(D))

    inputs = attention_inputs(B, H, N, D)

    def naive(xp, Q, K, V, tril, transpose):
        S = xp.where(tril, (Q @ transpose(K)) * scale, -np.inf)
        P = xp.exp(S - S.max(-1, keepdims=True) if xp is np else S - S.amax(-1, keepdim=True))
        return (P @ V) / P.sum(-1, keepdims=True) if xp is np else \
            (P @ V) / P.sum(-1, keepdim=True)

    def numpy_naive(Q, K, V):
        return naive(np, Q, K, V, np.tri(N, dtype=bool), lambda x: x.swapaxes(-1, -2))

    def torch_naive(Q, K, V):
        import torch
        return naive(torch, Q, K, V, torch.ones(N, N, dtype=torch.bool).tril(),
                     lambda x: x.transpose(-1, -2))

    sdpa = sdpa_attention(scale, causal=True)

    def jax_attention(Q, K, V):
        import jax
        swap = lambda x: x.transpose(0, 2, 1, 3)   # noqa: E731  (jax wants b, t, h, d)
        return swap(jax.nn.dot_product_attention(swap(Q), swap(K), swap(V), scale=scale,
                                                 is_causal=True))
    square = B * H * N * N * 4 * 3
    return Case(f"causal attention B={B} H={H} N={N} D={D}",
                ATTENTION.format(scale=repr(float(scale))), inputs, [
                    torch_peer("torch SDPA", sdpa),
                    torch_peer("torch naive", torch_naive, nbytes=square),
                    torch_peer("torch.compile naive", torch_naive, compiled=True),
                    jax_peer("jax dot_product_attention", jax_attention),
                    numpy_peer("numpy naive", numpy_naive, nbytes=square)])


def attention_training_case(B=4, H=8, N=1024, D=64) -> Case:
    """Forward + backward of the causal attention program: the fused forward and the
    fused backward (runtime/attention_autograd.py) against torch's SDPA."""
    scale = float(1.0 / np.sqrt(D))

    inputs = attention_inputs(B, H, N, D)

    sdpa = sdpa_attention(scale, causal=True)
    return training_case(f"causal attention B={B} H={H} N={N} D={D}",
                         ATTENTION.format(scale=repr(scale)), inputs, sdpa, compiled=False)


MASKED_ATTENTION = {      # issue 31: scores with additive terms (rewrite/attention_scores.py)
    "padding-masked": "sum[d](Q[b,h,i,d]*K[b,h,j,d]) * {scale} + M[b,j]",
    "ALiBi causal": "where(j <= i, sum[d](Q[b,h,i,d]*K[b,h,j,d]) * {scale} "
                    "+ slope[h] * (j - i), -inf)",
    "learnable-bias": "sum[d](Q[b,h,i,d]*K[b,h,j,d]) * {scale} + bias[h,i,j]",
}
# the kinds whose added tensor needs its gradient: (einfuse's name, SDPA's)
_LEARNED = {"learnable-bias": ("bias", "mask")}


def masked_attention_cases(B=2, H=4, N=512, D=64) -> List[Case]:
    """Attention with a padding mask ``+ M[b,j]`` (the last quarter and half of the keys
    of the two batch elements -inf) and with ALiBi's ``+ slope[h] * (j - i)`` under the
    causal mask, and with a learnable ``+ bias[h,i,j]`` (broadcast over b): one fused
    kernel against torch's SDPA with the same scores as a float attn_mask (precomputed,
    outside the timing), forward and forward + backward (the gradients of Q, K and V,
    and the bias's, or the attn_mask's, for the learnable one)."""
    scale = float(1.0 / np.sqrt(D))
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]

    def inputs(kind):
        def make(rng):
            arrays = attention_inputs(B, H, N, D)(rng)
            if kind == "padding-masked":
                M = np.zeros((B, N), np.float32)
                for b in range(B):
                    M[b, N - N * (b + 1) // (B + 2):] = -np.inf
                arrays["M"] = M
                arrays["mask"] = M[:, None, None, :]
            elif kind == "learnable-bias":
                arrays["bias"] = rng.standard_normal((H, N, N), dtype=np.float32)
                arrays["mask"] = arrays["bias"][None]
            else:
                slope = (2.0 ** -np.arange(1, H + 1)).astype(np.float32)
                arrays["slope"] = slope
                arrays["mask"] = np.where(j <= i, slope[:, None, None] * (j - i),
                                          -np.inf).astype(np.float32)[None]
            return arrays
        return make

    def sdpa(Q, K, V, mask, **_):
        import torch
        return torch.nn.functional.scaled_dot_product_attention(Q, K, V, attn_mask=mask,
                                                                scale=scale)

    def ours(source, train, kind):
        def make(arrays, backend):
            import einfuse as ef
            import torch
            program = ef.compile(source, backend=backend)
            learned = ("Q", "K", "V") + _LEARNED.get(kind, ())[:1]
            named = {k: torch.from_numpy(np.ascontiguousarray(v))
                     .requires_grad_(train and k in learned)
                     for k, v in arrays.items() if k in program.inputs}
            if not train:
                return lambda: program(**named)
            return lambda: _train_step(program, named)
        return make

    def sdpa_training(kind):
        def make(arrays):
            import torch
            learned = ("Q", "K", "V") + _LEARNED.get(kind, ())[1:]
            named = {k: torch.from_numpy(np.ascontiguousarray(v))
                     .requires_grad_(k in learned) for k, v in arrays.items()}
            return lambda: _train_step(sdpa, named)
        return make

    cases = []
    for kind, scores in MASKED_ATTENTION.items():
        source = ("S[b,h,i,j] := " + scores.format(scale=repr(scale)) +
                  "\nm[b,h,i]   := max[j](S[b,h,i,j])\nP[b,h,i,j] := exp(S[b,h,i,j] - "
                  "m[b,h,i])\nO[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / "
                  "sum[j](P[b,h,i,j])")
        name = f"{kind} attention B={B} H={H} N={N} D={D}"
        cases.append(Case(name, source, inputs(kind),
                          [torch_peer("torch SDPA float mask", sdpa)],
                          einfuse_call=ours(source, False, kind)))
        cases.append(Case(f"fwd+bwd {name}", source, inputs(kind),
                          [Peer("torch SDPA float mask", sdpa_training(kind), "torch")],
                          einfuse_call=ours(source, True, kind)))
    return cases


# -- forward + backward (issue 4): torch tensors through autograd --------------------------
def _leaves(arrays):
    import torch
    return {k: torch.from_numpy(np.ascontiguousarray(v)).requires_grad_(v.dtype.kind == "f")
            for k, v in arrays.items()}


def _train_step(fn, tensors):
    import torch
    for tensor in tensors.values():
        tensor.grad = None
    out = fn(**tensors)
    out.backward(torch.ones_like(out))
    return out.detach()


def training_case(name: str, statement: str, inputs, formula, compiled: bool = True,
                  **options) -> Case:
    """Forward + backward of ``statement`` (gradients of every float input) against the
    same formula in torch eager and under torch.compile; ``options`` for ef.compile."""
    def ours(arrays, backend):
        import einfuse as ef
        kernel = ef.compile(statement, backend=backend, **options)
        tensors = _leaves(arrays)
        return lambda: _train_step(kernel, tensors)

    def peer(compile_it):
        def make(arrays):
            import torch
            fn = torch.compile(formula) if compile_it else formula
            tensors = _leaves(arrays)
            return lambda: _train_step(fn, tensors)
        return make
    peers = [Peer("torch eager", peer(False), "torch")]
    if compiled:
        peers.append(Peer("torch.compile", peer(True), "torch"))
    return Case(f"fwd+bwd {name}", statement, inputs, peers, einfuse_call=ours)


def training_cases(quick: bool = False) -> List[Case]:
    scale = 4 if quick else 1
    K, N = 784 // scale, 1024 // scale

    def dist_inputs(rng):
        return {"w": rng.standard_normal((K, N), dtype=np.float32),
                "x": rng.standard_normal((K, N), dtype=np.float32)}

    def linear_inputs(rng):
        return {"x": rng.standard_normal((N, K), dtype=np.float32),
                "W": rng.standard_normal((K, N), dtype=np.float32),
                "bias": rng.standard_normal(N, dtype=np.float32)}

    def conv_inputs(rng):
        n = 1000 // scale
        return {"img": rng.standard_normal((n, n), dtype=np.float32),
                "ker": rng.standard_normal((7, 7), dtype=np.float32)}

    def embed_inputs(rng):
        V, B = 50000 // scale, 16384 // scale
        return {"W": rng.standard_normal((V, 256), dtype=np.float32),
                "idx": rng.integers(0, V, B).astype(np.int64)}

    def gauss_inputs(rng):
        n = 10**4 // scale
        return {"x": rng.standard_normal((n, 3), dtype=np.float32),
                "y": rng.standard_normal((n, 3), dtype=np.float32),
                "b": rng.standard_normal(n, dtype=np.float32)}

    def conv(img, ker):
        import torch.nn.functional as F
        return F.conv2d(img[None, None], ker[None, None])[0, 0]

    def embed(W, idx):
        import torch.nn.functional as F
        return F.embedding(idx, W)

    def gauss(x, y, b):
        import torch
        return (torch.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)) * b).sum(1)

    return [
        training_case(f"dist K={K} N=M={N}", "D[i,j] := (w[k,i] - x[k,j])**2", dist_inputs,
                      lambda w, x: ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)),
        training_case(f"linear b={N} i={K} o={N}",
                      "y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", linear_inputs,
                      lambda x, W, bias: x @ W + bias, compiled=False),
        training_case("conv2d", "o[i,j] := img[i+a, j+b] * ker[a,b]", conv_inputs, conv,
                      compiled=False),
        training_case("embed", "E[b,d] := W[idx[b], d]", embed_inputs, embed,
                      compiled=False),
        training_case("gauss", "o[i] := sum[j](exp(-sum[d]((x[i,d] - y[j,d])**2)) * b[j])",
                      gauss_inputs, gauss),
    ]


def small_training_cases(quick: bool = False) -> List[Case]:
    """Issue 11's small and medium forward + backward workloads: batched matmul, cdist,
    2x2 max-pooling and a long max reduction, against torch eager."""
    scale = 2 if quick else 1

    def floats(**shapes):
        return lambda rng: {name: rng.standard_normal(shape, dtype=np.float32)
                            for name, shape in shapes.items()}

    def bmm(A, B):
        import torch
        return torch.bmm(A, B)

    def cdist(x, y):
        import torch
        return torch.cdist(x, y)

    def pool(x):
        import torch.nn.functional as F
        return F.max_pool2d(x[None], 2)[0]

    def amax(X):
        return X.amax(1)
    n, m, c = 64 // scale, 1024 // scale, 128 // scale
    return [
        training_case(f"bmm b=32 {n}^3", "C[b,i,j] := A[b,i,k] * B[b,k,j]",
                      floats(A=(32, n, n), B=(32, n, n)), bmm, compiled=False),
        training_case(f"cdist {m}x{m} d=64", "D[i,j] := sqrt(sum[d]((x[i,d] - y[j,d])**2))",
                      floats(x=(m, 64), y=(m, 64)), cdist, compiled=False),
        training_case(f"max-pool 2x2 {n}x{c}x{c}",
                      "o[c,i,j] := max[a,b](x[c, 2*i+a, 2*j+b])",
                      floats(x=(n, c, c)), pool, compiled=False,
                      ranges={"a": range(2), "b": range(2)}),
        training_case(f"max over rows 8x{16000 // scale}", "m[i] := max[j](X[i,j])",
                      floats(X=(8, 16000 // scale)), amax, compiled=False),
    ]
