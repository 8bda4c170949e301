"""``einfuse bench --device cuda``: einfuse's Triton backend on torch CUDA tensors against
torch eager, torch.compile, cuBLAS, jax.jit and pykeops on the GPU.

Every case is built for a device: ``"cuda"`` for the real run, ``"cpu"`` for the tests,
which run the same Triton kernels under ``TRITON_INTERPRET=1`` at the ``quick`` sizes.
Inputs are drawn as float32 NumPy arrays and moved to the device (cast to the case's
dtype) by each implementation's own builder, outside the timed call.  Timed calls
synchronise the device (``torch.cuda.synchronize``; jax peers block on their result),
else only the launch would be timed.
"""

from __future__ import annotations

import functools
import gc
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from .cases import Case, Inputs, Peer, installed
from .runner import Measurement, PeerUnavailable, run_case

# Eager broadcasting peers above this many bytes of intermediates are listed, not run: an
# H100 has 80 GB, and the caching allocators of torch and jax share it.
GPU_MEMORY_CAP = 40 * 2**30

# Agreement with einfuse, relative to the largest magnitude of einfuse's result: float16
# and bfloat16 results are rounded to 11 and 8 significant bits, and peers (cuBLAS) may
# sum in another order or in reduced precision.
TOLERANCE = {"float32": 1e-3, "float16": 5e-3, "bfloat16": 1e-2}


@dataclass(frozen=True)
class Target:
    """A speed goal of issue 5.  kind "faster": versus's time / einfuse's >= bound;
    "within": einfuse's / versus's <= bound; "backward": (einfuse's time - einfuse's time
    on the forward case named by versus) / that forward time <= bound."""
    versus: str
    kind: str
    bound: float

    def __str__(self) -> str:
        if self.kind == "faster":
            return f"{self.versus} time / einfuse time >= {self.bound:g}"
        if self.kind == "within":
            return f"einfuse time / {self.versus} time <= {self.bound:g}"
        return f"einfuse backward / einfuse forward <= {self.bound:g}"


@dataclass
class GpuCase(Case):
    dtype: str = "float32"
    target: Optional[Target] = None

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]


# -- values on the device ------------------------------------------------------------------
def to_torch(arrays: Inputs, device: str, dtype: str = "float32", grad: bool = False):
    """Float arrays as ``dtype`` tensors on ``device`` (leaves requiring a gradient with
    ``grad``); index arrays stay int64."""
    import torch
    tensors = {}
    for name, array in arrays.items():
        tensor = torch.from_numpy(np.ascontiguousarray(array)).to(device)
        if array.dtype.kind == "f":
            tensor = tensor.to(getattr(torch, dtype)).requires_grad_(grad)
        tensors[name] = tensor
    return tensors


def synchronizer(device: str) -> Callable[[], None]:
    if device == "cuda":
        import torch
        return torch.cuda.synchronize
    return lambda: None


def _over_cap(nbytes: int) -> Optional[str]:
    return f"would allocate {nbytes / 2**30:.1f} GiB" if nbytes > GPU_MEMORY_CAP else None


# -- implementations ----------------------------------------------------------------------
def einfuse_forward(statement: str, device: str, dtype: str):
    def make(arrays, backend):
        import einfuse as ef
        kernel = ef.compile(statement, backend=backend)
        tensors = to_torch(arrays, device, dtype)
        return lambda: kernel(**tensors)
    return make


def torch_peer(name: str, fn, device: str, dtype: str = "float32", compiled: bool = False,
               nbytes: int = 0) -> Peer:
    def make(arrays):
        import torch
        tensors = to_torch(arrays, device, dtype)
        call = torch.compile(fn) if compiled else fn

        def run():
            with torch.no_grad():
                return call(**tensors)
        return run
    return Peer(name, make, "torch", None if compiled else _over_cap(nbytes))


def jax_peer(formula, device: str) -> Peer:
    def make(arrays):
        # jax takes 75% of the GPU's memory at start unless told not to, which would
        # leave torch and einfuse too little; it must be said before jax starts.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import jax
        import jax.numpy as jnp
        try:
            where = jax.devices("gpu" if device == "cuda" else "cpu")[0]
        except RuntimeError:
            raise PeerUnavailable("jax has no GPU backend here (install jax[cuda12])") \
                from None
        values = {k: jax.device_put(v, where) for k, v in arrays.items()}
        jitted = jax.jit(formula(jnp))
        return lambda: jitted(**values).block_until_ready()
    return Peer("jax.jit", make, "jax")


def in_torch(formula):
    """``formula(xp)`` (a function of the inputs written with the module ``xp``) on
    tensors, torch imported only when it runs."""
    def run(**tensors):
        import torch
        return formula(torch)(**tensors)
    return run


def device_broadcasting_peers(formula, device: str, nbytes: int) -> List[Peer]:
    """``formula(xp)`` run by torch eager, torch.compile and jax.jit on ``device``."""
    return [torch_peer("torch eager", in_torch(formula), device, nbytes=nbytes),
            torch_peer("torch.compile", in_torch(formula), device, compiled=True),
            jax_peer(formula, device)]


# -- the cases ----------------------------------------------------------------------------
def _normal(**shapes):
    return lambda rng: {name: rng.standard_normal(shape, dtype=np.float32)
                        for name, shape in shapes.items()}


def _count(n: int) -> str:
    """10**5 as '1e5' (as the CPU cases name gauss); other sizes as they are."""
    exponent = len(str(n)) - 1
    return f"1e{exponent}" if n >= 1000 and n == 10**exponent else str(n)


def _dist(xp):
    return lambda w, x: ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)


def dist_case(device: str, K: int, N: int) -> GpuCase:
    statement = "D[i,j] := (w[k,i] - x[k,j])**2"
    keops = Peer("pykeops", None, "pykeops", "KeOps reduces over an index; it does not "
                 "return the dense N x M matrix D")
    return GpuCase(f"dist K={K} N=M={N}", statement, _normal(w=(K, N), x=(K, N)),
                   device_broadcasting_peers(_dist, device, K * N * N * 4) + [keops],
                   einfuse_call=einfuse_forward(statement, device, "float32"),
                   target=Target("torch.compile", "faster", 2.0))


_KEOPS_PROBE = """
import torch
from pykeops.torch import LazyTensor
x = torch.randn(64, 3, device={device!r}); y = torch.randn(32, 3, device={device!r})
b = torch.randn(32, device={device!r})
xi, yj = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
out = ((-((xi - yj) ** 2).sum(-1)).exp() * LazyTensor(b[None, :, None])).sum(axis=1)
want = (torch.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)) * b).sum(1)
assert torch.allclose(out[:, 0], want, rtol=1e-4, atol=1e-4)
"""


@functools.lru_cache(maxsize=None)
def keops_probe(device: str) -> Optional[str]:
    """Why pykeops cannot be timed here, or None.  KeOps compiles its kernels in the
    process that calls it, and its code generator can crash the process (a segmentation
    fault was seen with CUDA 13): a small instance runs in a child process first, which
    also fills KeOps' on-disk cache for the timed run."""
    try:
        child = subprocess.run([sys.executable, "-c", _KEOPS_PROBE.format(device=device)],
                               capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "pykeops' probe did not finish in 10 minutes"
    if child.returncode == 0:
        return None
    how = f"signal {-child.returncode}" if child.returncode < 0 else \
        f"exit {child.returncode}"
    last = (child.stderr.strip().splitlines() or [""])[-1][:60]
    return f"pykeops failed in a probe process ({how}) {last}".strip()


def gauss_case(device: str, N: int, D: int = 3, target: bool = False) -> GpuCase:
    statement = "o[i] := sum[j](exp(-sum[d]((x[i,d] - y[j,d])**2)) * b[j])"

    def formula(xp):
        return lambda x, y, b: (xp.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))
                                * b[None, :]).sum(1)

    def keops(arrays):
        import pykeops.config
        if device == "cuda" and not pykeops.config.gpu_available:
            raise PeerUnavailable("pykeops found no CUDA here; it would run on the CPU")
        problem = keops_probe(device)
        if problem:
            raise PeerUnavailable(problem)
        from pykeops.torch import LazyTensor
        t = to_torch(arrays, device)
        xi, yj = LazyTensor(t["x"][:, None, :]), LazyTensor(t["y"][None, :, :])
        kernel = (-((xi - yj) ** 2).sum(-1)).exp() * LazyTensor(t["b"][None, :, None])
        return lambda: kernel.sum(axis=1)
    goal = Target("pykeops", "faster", 1.0) if target else None
    return GpuCase(f"gauss N={_count(N)}", statement, _normal(x=(N, D), y=(N, D), b=(N,)),
                   device_broadcasting_peers(formula, device, N * N * (D + 1) * 4)
                   + [Peer("pykeops", keops, "pykeops")],
                   einfuse_call=einfuse_forward(statement, device, "float32"), target=goal)


def matmul_case(device: str, n: int, dtype: str) -> GpuCase:
    statement = "C[i,k] := A[i,j] * B[j,k]"
    # the goal is cuBLAS's half-precision speed; float32 is there for reference
    goal = None if dtype == "float32" else Target("torch.matmul (cuBLAS)", "within", 1.2)
    return GpuCase(f"matmul {n}^3 {dtype}", statement, _normal(A=(n, n), B=(n, n)),
                   [torch_peer("torch.matmul (cuBLAS)", lambda A, B: A @ B, device, dtype)],
                   einfuse_call=einfuse_forward(statement, device, dtype), dtype=dtype,
                   target=goal)


def forward_cases(device: str, quick: bool) -> List[GpuCase]:
    """bmm_rev, conv2d, embed and logsumexp: the CPU cases' statements and torch peers."""
    n, batch = (16, 2) if quick else (512, 64)
    side, k = (48, 5) if quick else (4096, 7)
    V, D, B = (500, 32, 256) if quick else (50000, 256, 262144)
    rows, cols = (32, 128) if quick else (8192, 8192)

    def embed_inputs(rng):
        return {"W": rng.standard_normal((V, D), dtype=np.float32),
                "idx": rng.integers(0, V, B).astype(np.int64)}
    specs = [
        (f"bmm_rev b={batch} {n}^3", "C[i,j,b] := A[i,k,b] * B[k,j,b]",
         _normal(A=(n, n, batch), B=(n, n, batch)), "torch einsum",
         lambda t: lambda A, B: t.einsum("ikb,kjb->ijb", A, B)),
        (f"conv2d {side}x{side} * {k}x{k}", "o[i,j] := img[i+a, j+b] * ker[a,b]",
         _normal(img=(side, side), ker=(k, k)), "torch conv2d",
         lambda t: lambda img, ker: t.nn.functional.conv2d(img[None, None],
                                                           ker[None, None])[0, 0]),
        (f"embed V={V} D={D} B={B}", "E[b,d] := W[idx[b], d]", embed_inputs,
         "torch embedding", lambda t: lambda W, idx: t.nn.functional.embedding(idx, W)),
        (f"logsumexp {rows}x{cols}", "z[i] := logsumexp[j](X[i,j])",
         _normal(X=(rows, cols)), "torch logsumexp",
         lambda t: lambda X: t.logsumexp(X, 1)),
    ]
    return [GpuCase(name, statement, inputs, [torch_peer(peer, in_torch(fn), device)],
                    einfuse_call=einfuse_forward(statement, device, "float32"))
            for name, statement, inputs, peer, fn in specs]


# -- forward and backward (Tullio's dist benchmark) ---------------------------------------
def _forward_step(fn, leaves):
    return fn(**leaves)   # the graph for backward is recorded, as in training


def _training_step(fn, leaves):
    """Forward, then backward of the summed output; the output and every gradient are
    returned, so that the gradients are checked against einfuse's too."""
    import torch
    for tensor in leaves.values():
        tensor.grad = None
    out = fn(**leaves)
    out.backward(torch.ones_like(out))
    return (out.detach(), *(tensor.grad for tensor in leaves.values()))


def dist_training_cases(device: str, K: int, N: int) -> List[GpuCase]:
    """dist's forward with gradients recorded, and forward + backward, for einfuse,
    torch eager and torch.compile; the difference of einfuse's two is its backward."""
    statement = "D[i,j] := (w[k,i] - x[k,j])**2"
    formula = _dist(None)
    inputs = _normal(w=(K, N), x=(K, N))

    def ours(step):
        def make(arrays, backend):
            import einfuse as ef
            kernel, leaves = ef.compile(statement, backend=backend), to_torch(
                arrays, device, grad=True)
            return lambda: step(kernel, leaves)
        return make

    def peer(name, step, compiled, intermediates):
        def make(arrays):
            import torch
            fn, leaves = torch.compile(formula) if compiled else formula, to_torch(
                arrays, device, grad=True)
            return lambda: step(fn, leaves)
        # eager keeps K*N*M broadcasts: the difference and its square forward, two
        # more in backward (measured: peak about 4 of them)
        return Peer(name, make, "torch",
                    None if compiled else _over_cap(intermediates * K * N * N * 4))

    forward = f"dist fwd K={K} N=M={N} (grad recorded)"
    return [
        GpuCase(forward, statement, inputs, [peer("torch eager", _forward_step, False, 2),
                                             peer("torch.compile", _forward_step, True, 2)],
                einfuse_call=ours(_forward_step)),
        GpuCase(f"dist fwd+bwd K={K} N=M={N}", statement, inputs,
                [peer("torch eager", _training_step, False, 4),
                 peer("torch.compile", _training_step, True, 4)],
                einfuse_call=ours(_training_step),
                target=Target(forward, "backward", 3.0)),
    ]


# -- running ------------------------------------------------------------------------------
def _progress(message: str):
    print(message, file=sys.stderr, flush=True)


def _release(device: str):
    """Free what the last implementation left, so the next one has the device's memory."""
    gc.collect()
    torch = sys.modules.get("torch")
    if device == "cuda" and torch is not None:
        torch.cuda.empty_cache()


def run_gpu_case(case: GpuCase, device: str = "cuda", backend: str = "triton",
                 peers: Optional[Sequence[str]] = None, budget_s: float = 3.0,
                 progress=_progress) -> List[Measurement]:
    """einfuse, then each peer, by :func:`runner.run_case`: every timed call synchronises
    the device, results agree within the case's dtype tolerance, and the device's memory
    is freed between implementations."""
    return run_case(case, backend, peers, budget_s, progress, sync=synchronizer(device),
                    tolerance=case.tolerance, between_peers=lambda: _release(device),
                    device_time=kernel_time if device == "cuda" else None)


def kernel_time(fn: Callable[[], object], calls: int = 10) -> str:
    """What ``calls`` calls of ``fn`` cost the GPU itself, per call, from torch's profiler
    (CUPTI's kernel and copy records): their summed durations and how many there were.
    Beside the synchronised call's median it says whether a case is bound by the device
    or by the host (Python and launches).  A profiler that fails is a note, not a failure."""
    try:
        import torch
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as recorded:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        spans = [event.time_range.elapsed_us() for event in recorded.events()
                 if event.device_type == DeviceType.CUDA]
    except Exception as error:  # noqa: BLE001 - a profiler's failure is reported
        return f"GPU time unavailable: {type(error).__name__}: {error}"[:100]
    if not spans:
        return "no GPU work recorded"
    per_call = sum(spans) / calls * 1e-6
    launches = len(spans) / calls
    return f"GPU busy {_duration(per_call)} per call in {launches:g} kernels/copies"


def _duration(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.3f} ms"


def target_lines(cases: Sequence[GpuCase], results: Sequence[Measurement]) -> List[str]:
    """One line per case with a target: the measured figure and whether it is met."""
    medians: Dict[tuple, Optional[float]] = {(m.case, m.implementation): m.median_s
                                             for m in results}
    lines = []
    for case in cases:
        goal = case.target
        ours = medians.get((case.name, "einfuse"))
        if goal is None or ours is None:
            continue
        if goal.kind == "backward":
            forward = medians.get((goal.versus, "einfuse"))
            value = (ours - forward) / forward if forward else None
        else:
            other = medians.get((case.name, goal.versus))
            value = None if not other else (other / ours if goal.kind == "faster"
                                            else ours / other)
        if value is None:
            verdict = "not measured"
        else:
            met = value >= goal.bound if goal.kind == "faster" else value <= goal.bound
            verdict = f"{value:.2f} ({'met' if met else 'NOT met'})"
        lines.append(f"{case.name}: {goal}: {verdict}")
    return lines


def machine_line() -> str:
    """The GPU by name, and the versions that decide the figures."""
    import torch
    memory = torch.cuda.get_device_properties(0).total_memory / 2**30
    parts = [f"GPU: {torch.cuda.get_device_name()} ({memory:.0f} GiB), CUDA "
             f"{torch.version.cuda}", f"torch {torch.__version__}"]
    for module in ("triton", "jax", "pykeops"):
        if installed(module):
            parts.append(f"{module} {__import__(module).__version__}")
    parts.append(f"Python {platform.python_version()}, {os.cpu_count()} CPU cores")
    return ", ".join(parts)


def cuda_problem() -> Optional[str]:
    """Why ``--device cuda`` cannot run here, or None."""
    if not installed("torch"):
        return "torch is not installed"
    import torch
    if not torch.cuda.is_available():
        return (f"no CUDA GPU is visible to torch (torch.cuda.is_available() is False; "
                f"torch {torch.__version__}); run it on a machine with an NVIDIA GPU")
    if not installed("triton"):
        return "triton is not installed (einfuse's GPU backend): pip install triton"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 is set: Triton would interpret its kernels on the CPU"
    return None
