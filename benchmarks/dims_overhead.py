"""Per-call overhead of named dimensions (docs/dims.md): materialising a built expression,
rebuilding it and materialising, and ef.ein of the same program text, on tiny arrays (so
that only overhead is measured).  CPU time of this process (time.process_time), so that
other work on a shared machine counts less.  Run:
PYTHONPATH=src python benchmarks/dims_overhead.py"""

import math, time, timeit
import numpy as np, einfuse as ef

def best(*fs, n=500, rounds=25):
    """min over rounds, the variants measured in turn (the machine is shared)."""
    for f in fs:
        f()
    found = [float("inf")] * len(fs)
    for _ in range(rounds):
        for m, f in enumerate(fs):
            found[m] = min(found[m], timeit.Timer(f, timer=time.process_time).timeit(n) / n * 1e6)
    return found

rng = np.random.default_rng(0)
w, x = rng.standard_normal((3, 5)), rng.standard_normal((3, 4))
i, j, k = ef.dims("i j k")
def build_dist():
    return ((ef.wrap(w)[k, i] - ef.wrap(x)[k, j]) ** 2).sum(k)
D = build_dist()
text = "out[i, j] := sum[k]((A[k, i] - B[k, j])**2)"
assert D.order(i, j).shape == (5, 4)
rows = [("dist, one statement", *best(lambda: D.order(i, j), lambda: build_dist().order(i, j),
                                      lambda: ef.ein(text, A=w, B=x)))]
# a training step's case: new input arrays (of the same shapes) every call
pool = [(rng.standard_normal((3, 5)), rng.standard_normal((3, 4))) for _ in range(16)]
turn = [0]
def fresh():
    turn[0] = (turn[0] + 1) % len(pool)
    return pool[turn[0]]
def build_fresh():
    a, c = fresh()
    return ((ef.wrap(a)[k, i] - ef.wrap(c)[k, j]) ** 2).sum(k)
D2 = build_fresh()
rows.append(("dist, new arrays each call", *best(lambda: D2.order(i, j),
                                                lambda: build_fresh().order(i, j),
                                                lambda: ef.ein(text, **dict(zip("AB", fresh()))))))
Q, K, V = (rng.standard_normal((1, 8, 2, 4)) for _ in range(3))
b, t, T, h, r = ef.dims("b t T h r")
def build_attention():
    s = (ef.wrap(Q)[b, t, h, r] * ef.wrap(K)[b, T, h, r]).sum(r) * 0.5
    return (ef.where(T <= t, s, -math.inf).softmax(T) * ef.wrap(V)[b, T, h, r]).sum(T)
O = build_attention()
program = ef.explain(O).program
rows.append(("attention, program of 3", *best(lambda: O.order(b, t, h, r),
                                             lambda: build_attention().order(b, t, h, r),
                                             lambda: ef.ein(program, A=Q, B=K, C=V, c0=0.5),
                                             n=100)))
for name, order, rebuild, ein in rows:
    print(f"| {name} | {order:.0f} us | {rebuild:.0f} us | {ein:.0f} us | {order / ein:.2f}x | {rebuild / ein:.2f}x |")
