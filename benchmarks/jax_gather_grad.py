"""JAX gradients of gathers (issue 32 item 4): ``jax.grad`` of an embedding lookup under
``vmap`` (Equinox #920: ``weight[x]`` per sequence, the table shared by the batch),
with respect to the table, through each einfuse route against JAX's own.

One thread (OMP_NUM_THREADS=1, XLA without its thread pool), CPU time of this process
(time.process_time), the contenders interleaved round by round, the median of the
rounds; every route's gradient is first checked against jax.jit's.  Run:

    PYTHONPATH=src python benchmarks/jax_gather_grad.py [V D B T]

Routes: ``ef.ein`` (the statement ``e[t, d] := W[idx[t], d]`` under ``jax.vmap``; its
reverse mode is runtime/jax_scatter_grad.py's compiled kernel), ``ef.jit`` of the
vmapped lookup, ``jax.vmap`` of an ``ef.jit`` lookup; each inside ``jax.jit`` and
eagerly (``jax.grad`` without ``jax.jit``, against JAX's eager gradient)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1")

import sys   # noqa: E402
import time  # noqa: E402

import jax   # noqa: E402
import jax.numpy as jnp   # noqa: E402
import numpy as np   # noqa: E402

from einfuse.bench.jax_gather_cases import ROUTES, gather_inputs, gradient   # noqa: E402


def main(V=10000, D=64, B=64, T=64, rounds=7, calls=10):
    arrays = gather_inputs(V, D, B, T)(np.random.default_rng(0))
    values = [jnp.asarray(arrays[k]) for k in ("W", "ids", "G")]
    contenders = {"jax.jit": jax.jit(gradient("jax"))}
    contenders.update((f"{route} in jax.jit", jax.jit(gradient(route))) for route in ROUTES)
    contenders["jax eager"] = gradient("jax")
    contenders.update((f"{route} eager", gradient(route)) for route in ROUTES)
    want = np.asarray(contenders["jax.jit"](*values))
    for name, fn in contenders.items():
        start = time.perf_counter()
        got = np.asarray(fn(*values))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
        print(f"# {name}: first call {time.perf_counter() - start:.2f} s", flush=True)
    times = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.process_time()
            for _ in range(calls):
                jax.block_until_ready(fn(*values))
            times[name].append((time.process_time() - start) / calls)
    print(f"\nV={V} D={D} B={B} T={T}, float32, one thread, CPU time, median of {rounds}")
    print("| contender | time | jax / contender |")
    print("| --- | --- | --- |")
    for name in contenders:
        base = np.median(times["jax eager" if name.endswith("eager") else "jax.jit"])
        median = np.median(times[name])
        print(f"| {name} | {median * 1e6:.0f} us | {base / median:.2f}x |")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
