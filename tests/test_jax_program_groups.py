"""A program's backward under jax.grad runs the C backend's fusion groups, each as one
XLA custom call (runtime/jax_groups.py, backends/c/fused_xla.py): custom calls counted
in the compiled HLO and at the emitter, gradients against jax.grad of the jax.numpy
formulations (float32 and float64; eager, jit, vmap), the groups' results bit for bit
those of a NumPy caller's run of the same backward kernels, and what is declined
(vmap's batched values, gathers) running statement by statement as before."""

import re

import numpy as np
import pytest

import einfuse as ef
from program_texts import LAYERNORM, SOFTMAX

jax = pytest.importorskip("jax")
jnp = jax.numpy
from jit_support import x64  # noqa: E402,F401  (x64 on for every test here)
from einfuse.runtime import jax_groups, jax_program  # noqa: E402
from einfuse.runtime.run_groups import run_statements  # noqa: E402

N = 128     # rows and columns: past schedule/fusion.MIN_FUSED_ELEMENTS
RMSNORM = (f"ms[i] := sum[j](X[i,j] * X[i,j]) / {N}\n"
           "y[i,j] := X[i,j] / sqrt(ms[i] + 0.00001) * g[j]")
CROSS_ENTROPY = (f"m[i] := max[j](X[i,j])\n"
                 f"l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]\n"
                 f"L := sum[i](l[i]) / {N}")
B, D, F = 32, 64, 128
BLOCK = f"""r[b] := sqrt(sum[d](X[b,d]**2) / {D} + 0.000001)
n[b,d] := X[b,d] / r[b] * G[d]
h[b,f] := sum[d](n[b,d] * W1[d,f])
g[b,f] := 0.5 * h[b,f] * (1 + erf(h[b,f] * 0.7071067811865476))
y[b,e] := X[b,e] + sum[f](g[b,f] * W2[f,e])"""


def _layernorm(X, g, b):
    mu = X.mean(1, keepdims=True)
    return (X - mu) / jnp.sqrt(((X - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + b


def _rmsnorm(X, g):
    return X / jnp.sqrt((X * X).mean(1, keepdims=True) + 1e-5) * g


def _block(X, G, W1, W2):
    n = X / jnp.sqrt((X ** 2).sum(1, keepdims=True) / D + 1e-6) * G
    h = jnp.matmul(n, W1, precision="highest")
    g = 0.5 * h * (1 + jax.scipy.special.erf(h * 0.7071067811865476))
    return X + jnp.matmul(g, W2, precision="highest")


LABELS = np.random.default_rng(5).integers(0, N, N)


def _cross_entropy(X):
    return jnp.mean(jax.nn.logsumexp(X, 1) - X[jnp.arange(N), LABELS])


# name: (program, inputs, shapes, jax.numpy formulation, (group custom calls, most
# einfuse calls of the backward): the NumPy caller's groups, extra constant inputs)
CASES = {
    "softmax": (SOFTMAX, ("X",), [(N, N)], lambda X: jax.nn.softmax(X, axis=1), (2, 1), {}),
    "layernorm": (LAYERNORM.format(n=N), ("X", "g", "b"), [(N, N), (N,), (N,)],
                  _layernorm, (2, 1), {}),
    "rmsnorm": (RMSNORM, ("X", "g"), [(N, N), (N,)], _rmsnorm, (2, 1), {}),
    "cross-entropy": (CROSS_ENTROPY, ("X",), [(N, N)], _cross_entropy, (1, 1),
                      {"t": LABELS}),
    "mlp block": (BLOCK, ("X", "G", "W1", "W2"), [(B, D), (D,), (D, F), (F, D)], _block, (2, 3),
                  {}),
}


def _setup(name, dtype, seed=0):
    source, names, shapes, formula, calls, extra = CASES[name]
    program = ef.compile(source)
    # (a program keeps its backward's plans, with how they run: planned here afresh)
    program.__dict__.pop("_jax_rules", None)
    rng = np.random.default_rng(seed)
    arrays = [jnp.asarray((rng.standard_normal(s) * 0.5).astype(dtype)) for s in shapes]
    extra = {k: jnp.asarray(v) for k, v in extra.items()}

    def ours(*values):
        out = program(**dict(zip(names, values)), **extra)
        return out[-1] if isinstance(out, tuple) else out

    def loss(f):
        def scalar(*values):
            out = f(*values)
            weights = jnp.cos(jnp.arange(out.size, dtype=out.dtype)).reshape(out.shape)
            return (out * weights).sum()
        return scalar
    argnums = tuple(range(len(names)))
    return loss(ours), loss(formula), arrays, argnums, calls


def _einfuse_calls(hlo: str) -> int:
    return len(re.findall(r'custom_call_target="einfuse_', hlo))


def _close(got, want, dtype):
    tol = dict(rtol=1e-9, atol=1e-10) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-5)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert np.asarray(a).dtype == np.asarray(b).dtype and np.shape(a) == np.shape(b)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", list(CASES))
def test_backward_is_its_groups_and_equals_jax(name, dtype):
    ours, formula, arrays, argnums, calls = _setup(name, dtype)
    want = jax.grad(formula, argnums)(*arrays)
    forward = _einfuse_calls(jax.jit(ours).lower(*arrays).compile().as_text())
    graded = jax.jit(jax.grad(ours, argnums))
    before = jax_groups.emitted[0]
    hlo = graded.lower(*arrays).compile().as_text()
    assert jax_groups.emitted[0] > before
    # the forward's calls (XLA drops those nothing reads), then the backward's: its
    # groups and the statements that join none
    groups, most = calls
    assert hlo.count('custom_call_target="einfuse_group"') == groups
    assert _einfuse_calls(hlo) <= forward + most
    _close(graded(*arrays), want, dtype)
    _close(jax.grad(ours, argnums)(*arrays), want, dtype)      # eager: the same calls


def test_statement_by_statement_was_more_calls(monkeypatch):
    """What the groups replace: the same backward with every statement its own call."""
    ours, _, arrays, argnums, calls = _setup("layernorm", np.float64)
    grouped = _einfuse_calls(jax.jit(jax.grad(ours, argnums)).lower(*arrays)
                             .compile().as_text())
    monkeypatch.setattr(jax_program, "run_kernels",
                        lambda kernels, env, keep: run_statements(kernels, env, "jax", keep))
    ours, _, arrays, argnums, _ = _setup("layernorm", np.float64)
    alone = _einfuse_calls(jax.jit(jax.grad(ours, argnums)).lower(*arrays)
                           .compile().as_text())
    assert alone >= grouped + 4


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "mlp block"])
def test_groups_give_the_numpy_callers_bits(name, monkeypatch):
    """Each run of backward kernels, given the same values, gives in the custom calls
    exactly what the NumPy caller's fused run of those kernels gives.  (The forward's
    softmax and layernorm groups run their merged loop nests, where a NumPy caller's
    run the hand-written row kernels: equal up to rounding, so not compared here.)"""
    seen = []
    real = jax_program.run_kernels
    forward = set(ef.compile(CASES[name][0])._kernels)

    def watched(kernels, env, keep):
        if set(kernels) <= forward:
            return real(kernels, env, keep)
        given = {k: v if isinstance(v, (int, float)) else np.array(v)
                 for k, v in env.items()}
        real(kernels, env, keep)
        seen.append((kernels, given, keep, {k: np.asarray(env[k]) for k in env
                                            if k not in given}))
    monkeypatch.setattr(jax_program, "run_kernels", watched)
    ours, _, arrays, argnums, _ = _setup(name, np.float64)
    before = jax_groups.emitted[0]
    jax.grad(ours, argnums)(*arrays)          # eager: the values are concrete
    assert seen and jax_groups.emitted[0] > before
    for kernels, given, keep, made in seen:
        env = dict(given)
        run_statements(kernels, env, "numpy", keep=keep)
        for key, value in made.items():
            np.testing.assert_array_equal(value, np.asarray(env[key]), err_msg=key)


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_vmap_of_grad_runs_statements_and_equals_jax(name):
    ours, formula, arrays, argnums, _ = _setup(name, np.float64)
    stacked = [jnp.stack([a, a * 0.5 + 0.1]) for a in arrays]
    before = jax_groups.emitted[0]
    got = jax.vmap(jax.grad(ours, argnums))(*stacked)
    assert jax_groups.emitted[0] == before        # batched values: no group custom call
    _close(got, jax.vmap(jax.grad(formula, argnums))(*stacked), np.float64)
    # batched after tracing (vmap of a jitted gradient): the call once per element
    got = jax.vmap(jax.jit(jax.grad(ours, argnums)))(*stacked)
    _close(got, jax.vmap(jax.grad(formula, argnums))(*stacked), np.float64)


def test_out_of_range_label_raises_the_statements_error():
    program = ef.compile(CROSS_ENTROPY)
    X = jnp.asarray(np.random.default_rng(1).standard_normal((N, N)))
    bad = jnp.asarray(np.where(np.arange(N) == 3, N + 2, LABELS))
    message = rf"t\[3\] = {N + 2} is outside its valid range"
    loss = lambda X, t: program(X=X, t=t)       # noqa: E731
    with pytest.raises(ef.EinfuseError, match=message):
        jax.grad(loss)(X, bad)
    with pytest.raises(Exception, match=message):
        jax.jit(jax.value_and_grad(loss))(X, bad)[1].block_until_ready()
    # jax.grad alone needs no value of the gathering statement, which XLA would drop
    # with the only check of t: the check is kept (it passed silently before)
    with pytest.raises(Exception, match=message):
        jax.jit(jax.grad(loss))(X, bad).block_until_ready()
    stacked = jnp.stack([jnp.asarray(LABELS), bad])
    with pytest.raises(Exception, match=message):
        jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0)))(X, stacked).block_until_ready()
    good = jax.grad(_cross_entropy)(X)
    _close(jax.jit(jax.grad(loss))(X, jnp.asarray(LABELS)), good, np.float64)


def test_small_arrays_keep_the_statements():
    """Below the size where fusing pays, the statements run alone (as for NumPy)."""
    program = ef.compile(SOFTMAX)
    X = jnp.asarray(np.random.default_rng(2).standard_normal((4, 5)))
    before = jax_groups.emitted[0]
    got = jax.jit(jax.grad(lambda X: (program(X=X) * X).sum()))(X)
    assert jax_groups.emitted[0] == before
    want = jax.grad(lambda X: (jax.nn.softmax(X, axis=1) * X).sum())(X)
    _close(got, want, np.float64)


@pytest.mark.parametrize("threads", [2, None])
def test_threads_and_column_slices(threads):
    """Per-thread rows and column sums sized for the threads the group was lowered
    for (threads=2 on a 2-core machine: two slices of the rows), and OpenMP's default."""
    source, names, shapes, formula, _, _ = CASES["layernorm"]
    options = {} if threads is None else {"threads": threads}
    program = ef.compile(source, **options)
    program.__dict__.pop("_jax_rules", None)
    rng = np.random.default_rng(7)
    arrays = [jnp.asarray(rng.standard_normal((512,) + s[1:] if len(s) == 2 else s))
              for s in shapes]
    weights = jnp.asarray(rng.standard_normal((512, N)))
    ours = lambda *v: (program(**dict(zip(names, v))) * weights).sum()     # noqa: E731
    want = jax.grad(lambda *v: (formula(*v) * weights).sum(), (0, 1, 2))(*arrays)
    before = jax_groups.emitted[0]
    graded = jax.jit(jax.grad(ours, (0, 1, 2)))
    _close(graded(*arrays), want, np.float64)
    assert jax_groups.emitted[0] > before
    for _ in range(3):          # every execution has its own rows and sums
        _close(graded(*arrays), want, np.float64)


def test_float32_without_x64():
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        ours, formula, arrays, argnums, _ = _setup("rmsnorm", np.float32)
        before = jax_groups.emitted[0]
        got = jax.jit(jax.grad(ours, argnums))(*arrays)
        assert jax_groups.emitted[0] > before
        _close(got, jax.grad(formula, argnums)(*arrays), np.float32)
    finally:
        jax.config.update("jax_enable_x64", previous)


def test_traced_parameter_declines_its_groups():
    """A scalar parameter traced as an array (its value is one of the kernel's doubles,
    fixed when lowered) keeps its statements apart: values still right."""
    source = (f"ms[i] := sum[j](X[i,j] * X[i,j]) / {N}\n"
              "y[i,j] := X[i,j] / sqrt(ms[i] + eps) * g[j]")
    program = ef.compile(source)
    program.__dict__.pop("_jax_rules", None)
    rng = np.random.default_rng(3)
    X, g = jnp.asarray(rng.standard_normal((N, N))), jnp.asarray(rng.standard_normal(N))
    weights = jnp.cos(jnp.arange(N * N, dtype=X.dtype)).reshape(N, N)

    def loss(f):
        return lambda X, g, eps: (f(X, g, eps) * weights).sum()
    ours = loss(lambda X, g, eps: program(X=X, g=g, eps=eps))
    theirs = loss(lambda X, g, eps: X / jnp.sqrt((X * X).mean(1, keepdims=True) + eps) * g)
    for value in (jnp.asarray(1e-3), 0.25):      # (jit traces a Python number too)
        got = jax.jit(jax.grad(ours, (0, 1)))(X, g, value)
        _close(got, jax.grad(theirs, (0, 1))(X, g, value), np.float64)
    # a Python number the function closes over is fixed: its groups are custom calls
    before = jax_groups.emitted[0]
    got = jax.jit(jax.grad(lambda X, g: ours(X, g, 0.25), (0, 1)))(X, g)
    assert jax_groups.emitted[0] > before
    _close(got, jax.grad(theirs, (0, 1))(X, g, 0.25), np.float64)
