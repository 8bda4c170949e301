"""Scaling of sharded einfuse programs on a CPU mesh, 1 -> 8 devices (docs/sharding.md).

    python benchmarks/sharding_scaling.py [--quick] [--out benchmarks/results/sharding.md]

JAX must see 8 CPU devices, so this script sets XLA_FLAGS before importing jax (run it
as its own process).  For each case and device count n it times, in one process:

* einfuse: ``ef.compile(program, mesh={"d": n}, shard={index: "d"})`` under jax.jit;
* jax: the same computation in jax.numpy under jax.jit with the same inputs placed
  with the same shardings (GSPMD partitions it), as the peer.

and reports medians, speed-up over n=1 for each, and jax time / einfuse time.  The
devices are threads of one host: with fewer cores than devices they share the cores,
which bounds the speed-up (the table says how many cores there were)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import einfuse as ef  # noqa: E402


def cases(quick: bool):
    s = 1 if quick else 2
    rng = np.random.default_rng(0)

    def rand(*shape):
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32))
    mlp = dict(
        name=f"Megatron MLP, f sharded (B=64, D={256 * s}, F={1024 * s}, O={256 * s})",
        program="h[b,f] := relu(sum[d](x[b,d]*W1[d,f])); y[b,o] := sum[f](h[b,f]*W2[f,o])",
        shard={"f": "d"}, arrays=dict(x=rand(64, 256 * s), W1=rand(256 * s, 1024 * s),
                                       W2=rand(1024 * s, 256 * s)),
        specs=dict(x=P(), W1=P(None, "d"), W2=P("d", None)),
        jax=lambda x, W1, W2: jnp.maximum(x @ W1, 0) @ W2)
    dist = dict(
        name=f"dist, i sharded (K=256, N=M={512 * s})",
        program="D[i,j] := sum[k]((w[k,i] - x[k,j])**2)", shard={"i": "d"},
        arrays=dict(w=rand(256, 512 * s), x=rand(256, 512 * s)),
        specs=dict(w=P(None, "d"), x=P()),
        # the peer in its fastest form (a matrix product), not as a broadcast
        jax=lambda w, x: (w * w).sum(0)[:, None] + (x * x).sum(0)[None, :] - 2 * w.T @ x)
    heads = 8
    attention = dict(
        name=f"attention, heads sharded (B=2, T={128 * s}, H={heads}, R=64)",
        program="""S[b,h,t,s] := sum[r](Q[b,t,h,r]*K[b,s,h,r]) / 8
                   m[b,h,t] := max[s](S[b,h,t,s])
                   E[b,h,t,s] := exp(S[b,h,t,s] - m[b,h,t])
                   O[b,t,h,r] := sum[s](E[b,h,t,s]*V[b,s,h,r]) / sum[s](E[b,h,t,s])""",
        shard={"h": "d"}, arrays=dict(Q=rand(2, 128 * s, heads, 64),
                                      K=rand(2, 128 * s, heads, 64),
                                      V=rand(2, 128 * s, heads, 64)),
        specs=dict(Q=P(None, None, "d"), K=P(None, None, "d"), V=P(None, None, "d")),
        jax=lambda Q, K, V: jnp.einsum("bhts,bshr->bthr", jax.nn.softmax(
            jnp.einsum("bthr,bshr->bhts", Q, K) / 8, axis=-1), V))
    return [mlp, dist, attention]


def median_time(fn, budget=2.0, runs=(3, 30)):
    jax.block_until_ready(fn())
    times, deadline = [], time.perf_counter() + budget
    while len(times) < runs[0] or (len(times) < runs[1] and time.perf_counter() < deadline):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    counts = (1, 2, 4, 8)
    lines = [f"Sharded on a CPU mesh: {os.cpu_count()} cores, "
             f"{len(jax.devices())} JAX CPU devices; float32; medians; "
             f"speed-up = time at 1 device / time at n", "",
             "| case | devices | einfuse | speed-up | jax.jit (GSPMD) | speed-up | "
             "jax / einfuse |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for case in cases(args.quick):
        base = {}
        for n in counts:
            mesh = jax.make_mesh((n,), ("d",), axis_types=(AxisType.Auto,),
                                 devices=jax.devices()[:n])
            placed = {k: jax.device_put(v, NamedSharding(mesh, case["specs"][k]))
                      for k, v in case["arrays"].items()}
            program = ef.compile(case["program"], mesh=mesh, shard=case["shard"])
            ours = jax.jit(lambda a: program(**a))
            theirs = jax.jit(lambda a: case["jax"](**a))
            np.testing.assert_allclose(np.asarray(ours(placed)), np.asarray(theirs(placed)),
                                       rtol=2e-3, atol=2e-3)
            t_ours, t_jax = median_time(lambda: ours(placed)), median_time(
                lambda: theirs(placed))
            base.setdefault("ours", t_ours)
            base.setdefault("jax", t_jax)
            lines.append(f"| {case['name']} | {n} | {t_ours * 1e3:.2f} ms | "
                         f"{base['ours'] / t_ours:.2f}x | {t_jax * 1e3:.2f} ms | "
                         f"{base['jax'] / t_jax:.2f}x | {t_jax / t_ours:.2f}x |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
