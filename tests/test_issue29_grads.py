"""Issue 29, gradients: empty gathers and empty axes give zero gradients (item 4); a
shifted read beside a gather, and forwards whose output ranges do not start at 0, have
their gradients (item 9), and an error in a gradient statement speaks of the user's
statement (item 9); forward mode through ``ef.jit`` (item 5).  Oracles: torch autograd
and jax.grad of the same formula written in torch / jax.numpy, finite differences and
float64 gradcheck, and jax.jit of the same function."""

import numpy as np
import pytest

import einfuse as ef
from einfuse import derive, run_reference
from einfuse.backends.c import build as c_build
from einfuse.errors import EinfuseError, EinfuseTypeError, OutOfBoundsError, ShapeError

torch = pytest.importorskip("torch")
try:
    import jax
    import jax.numpy as jnp
except ImportError:          # the JAX tests skip (pytest.importorskip in each)
    jax = jnp = None

REFERENCE_BACKENDS = ["numpy"] + (["c"] if c_build.find_compiler() is not None else [])
_rng = np.random.default_rng(29)


def floats(*shape):
    return _rng.standard_normal(shape)


def ints(high, *shape):
    return _rng.integers(0, high, size=shape)


# (statement, arrays, the same formula in torch or jax.numpy: f(xp, **arrays))
EMPTY = [
    ("y[i] := w[idx[i]] * 2", lambda: dict(w=floats(3), idx=ints(3, 0)),
     lambda xp, w, idx: w[idx] * 2),
    ("E[b,d] := W[idx[b], d]", lambda: dict(W=floats(4, 3), idx=ints(4, 0)),
     lambda xp, W, idx: W[idx]),
    ("E[b,d] := W[idx[b], d] * 3", lambda: dict(W=floats(4, 0), idx=ints(4, 5)),
     lambda xp, W, idx: W[idx] * 3),
    ("E[b,d] := W[idx[b], d] * x[b]", lambda: dict(W=floats(4, 3), idx=ints(4, 0),
                                                   x=floats(0)),
     lambda xp, W, idx, x: W[idx] * x[:, None]),
    ("y[i] := sum[j](w[idx[i,j]])", lambda: dict(w=floats(3), idx=ints(3, 3, 0)),
     lambda xp, w, idx: w[idx].sum(1)),
    ("y := sum[i](exp(x[i]) * w[idx[i]])", lambda: dict(x=floats(0), w=floats(3),
                                                        idx=ints(3, 0)),
     lambda xp, x, w, idx: (xp.exp(x) * w[idx]).sum()),
    ("y[i] := x[i] + sum[j](w[idx[j]])", lambda: dict(x=floats(3), w=floats(3),
                                                      idx=ints(3, 0)),
     lambda xp, x, w, idx: x + w[idx].sum()),
    ("y[i] := x[idx[i]] * x[i]", lambda: dict(x=floats(0), idx=ints(1, 0)),
     lambda xp, x, idx: x[idx] * x),
    ("s := sum[i](x[i])", lambda: dict(x=floats(0)), lambda xp, x: x.sum()),
    ("y[i] := sum[j](A[i,j])", lambda: dict(A=floats(3, 0)), lambda xp, A: A.sum(1)),
    ("C[i,j] := A[i,k] * B[k,j]", lambda: dict(A=floats(2, 0), B=floats(0, 3)),
     lambda xp, A, B: A @ B),
    ("y[i] := x[i] * s", lambda: dict(x=floats(0), s=1.5), lambda xp, x, s: x * s),
    ("h[i] := w[idx[i]] * 2\ny := sum[i](h[i])", lambda: dict(w=floats(3), idx=ints(3, 0)),
     lambda xp, w, idx: (w[idx] * 2).sum()),
    ("h[b,d] := W[idx[b], d]\ny[d] := sum[b](h[b,d] * h[b,d])",
     lambda: dict(W=floats(4, 3), idx=ints(4, 0)), lambda xp, W, idx: (W[idx] ** 2).sum(0)),
    ("h[i] := x[i] * 2\ny := sum[i](h[i] * w[idx[i]])",
     lambda: dict(x=floats(0), w=floats(3), idx=ints(3, 0)),
     lambda xp, x, w, idx: (x * 2 * w[idx]).sum()),
]


def _floats_of(arrays):
    return [n for n, v in arrays.items() if isinstance(v, float) or v.dtype.kind == "f"]


def _torch_gradients(statement, arrays, backend):
    tensors = {n: torch.tensor(v, requires_grad=True) if isinstance(v, np.ndarray) and
               v.dtype.kind == "f" else torch.tensor(v) if isinstance(v, np.ndarray) else v
               for n, v in arrays.items()}
    wanted = [n for n in _floats_of(arrays) if isinstance(tensors[n], torch.Tensor)]
    out = ef.ein(statement, backend=backend, **tensors)
    seed = torch.ones_like(out)
    grads = torch.autograd.grad((out * seed).sum(), [tensors[n] for n in wanted],
                                allow_unused=True)
    return {n: torch.zeros_like(tensors[n]) if g is None else g
            for n, g in zip(wanted, grads)}


def _torch_oracle(formula, arrays):
    tensors = {n: torch.tensor(v, requires_grad=True) if isinstance(v, np.ndarray) and
               v.dtype.kind == "f" else torch.tensor(v) if isinstance(v, np.ndarray) else v
               for n, v in arrays.items()}
    wanted = [n for n in _floats_of(arrays) if isinstance(tensors[n], torch.Tensor)]
    out = formula(torch, **tensors)
    grads = torch.autograd.grad(out.sum(), [tensors[n] for n in wanted], allow_unused=True)
    return {n: torch.zeros_like(tensors[n]) if g is None else g
            for n, g in zip(wanted, grads)}


@pytest.mark.parametrize("statement, make, formula", EMPTY, ids=[c[0] for c in EMPTY])
def test_empty_gathers_and_axes_have_zero_gradients_under_torch(statement, make, formula,
                                                                backend):
    arrays = make()
    want = _torch_oracle(formula, arrays)
    for _ in range(3):           # the first call, then the prepared repeated calls
        got = _torch_gradients(statement, arrays, backend)
        assert set(got) == set(want)
        for name in want:
            assert got[name].shape == want[name].shape
            torch.testing.assert_close(got[name], want[name])


@pytest.mark.parametrize("statement, make, formula", EMPTY, ids=[c[0] for c in EMPTY])
@pytest.mark.parametrize("backend_name", REFERENCE_BACKENDS)
def test_empty_gathers_and_axes_under_derive_and_run_reference(statement, make, formula,
                                                               backend_name):
    arrays = make()
    want = _torch_oracle(formula, arrays)
    out = ef.ein(statement, backend="numpy", **arrays)
    for name in want:
        grads = derive(statement, name)
        env = dict(arrays)
        seeds = getattr(grads, "outputs", None)
        if seeds is not None:          # a program: one seed per output
            env.update({"d" + o: np.ones(np.shape(out)) for o in seeds})
        else:
            env[grads[0].output_grad] = np.ones(np.shape(out))
        found = run_reference(grads, env, backend=backend_name)
        got = found.get("d" + name, np.zeros(np.shape(arrays[name])))
        assert np.shape(got) == tuple(want[name].shape)
        np.testing.assert_allclose(got, want[name].numpy())


@pytest.mark.parametrize("statement, make, formula", EMPTY, ids=[c[0] for c in EMPTY])
def test_empty_gathers_and_axes_under_jax_grad(statement, make, formula, x64):
    jax, jnp = x64, x64.numpy
    arrays = make()
    names = [n for n in _floats_of(arrays) if isinstance(arrays[n], np.ndarray)]

    def loss(run):
        def f(*values):
            named = {n: jnp.asarray(v) if isinstance(v, np.ndarray) else v
                     for n, v in arrays.items()}
            named.update(zip(names, values))
            return run(named).sum()
        return f
    values = [jnp.asarray(arrays[n]) for n in names]
    argnums = tuple(range(len(names)))
    got = jax.grad(loss(lambda named: ef.ein(statement, **named)), argnums)(*values)
    want = jax.grad(loss(lambda named: formula(jnp, **named)), argnums)(*values)
    for g, v in zip(got, want):
        assert g.shape == v.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(v))


ATTENTION = ("S[h,i,j] := sum[d](Q[h,i,d]*K[h,j,d])\nm[h,i] := max[j](S[h,i,j])\n"
             "P[h,i,j] := exp(S[h,i,j] - m[h,i])\n"
             "O[h,i,e] := sum[j](P[h,i,j] * V[h,j,e]) / sum[j](P[h,i,j])")


@pytest.mark.parametrize("keys, queries", [(0, 3), (3, 0)])
def test_attention_gradient_with_no_keys_or_no_queries(keys, queries, backend):
    q = torch.randn(2, queries, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, keys, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, keys, 5, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        out = ef.ein(ATTENTION, Q=q, K=k, V=v, backend=backend)
        assert out.shape == (2, queries, 5)
        grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out), allow_unused=True)
        # nothing is read from a query or a key that does not exist: every gradient 0
        for g, t in zip(grads, (q, k, v)):
            g = torch.zeros_like(t) if g is None else g
            assert g.shape == t.shape
            assert not g.any()


# -- item 9: shifted reads beside gathers, output ranges that start elsewhere than 0 ------
def test_the_reported_shifted_read_beside_a_gather(backend):
    x = torch.arange(1.0, 6.0, dtype=torch.float64, requires_grad=True)
    w = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
    idx = torch.zeros(4, dtype=torch.int64)
    for _ in range(2):
        y = ef.ein("y[j] := x[j+1] * w[idx[j]]", x=x, w=w, idx=idx, backend=backend)
        dx, dw = torch.autograd.grad(y.sum(), (x, w))
        torch.testing.assert_close(dx, torch.tensor([0.0, 2, 2, 2, 2], dtype=torch.float64))
        torch.testing.assert_close(dw, torch.tensor([14.0], dtype=torch.float64))


def test_the_reported_case_under_derive_and_jax(x64):
    arrays = dict(x=np.arange(1.0, 6.0), w=np.array([2.0]), idx=np.zeros(4, np.int64))
    for backend_name in REFERENCE_BACKENDS:
        for name, want in (("x", [0.0, 2, 2, 2, 2]), ("w", [14.0])):
            grads = derive("y[j] := x[j+1] * w[idx[j]]", name)
            found = run_reference(grads, dict(arrays, dy=np.ones(4)), backend=backend_name)
            np.testing.assert_allclose(found["d" + name], want)
    jax, jnp = x64, x64.numpy
    dx, dw = jax.grad(lambda x, w: ef.ein("y[j] := x[j+1] * w[idx[j]]", x=x, w=w,
                                          idx=jnp.zeros(4, jnp.int32)).sum(),
                      (0, 1))(jnp.arange(1.0, 6.0), jnp.array([2.0]))
    np.testing.assert_allclose(dx, [0.0, 2, 2, 2, 2])
    np.testing.assert_allclose(dw, [14.0])


# (statement, float arrays' shapes, index arrays (high, shape), options)
SHIFTED = [
    ("y[j] := x[j+1] * w[idx[j]]", {"x": (6,), "w": (3,)}, {"idx": (3, (5,))}, {}),
    ("y[j] := x[j+2] * w[idx[j]]", {"x": (6,), "w": (3,)}, {"idx": (3, (4,))}, {}),
    ("y[j] := x[2*j+1] * w[idx[j]]", {"x": (7,), "w": (3,)}, {"idx": (3, (3,))}, {}),
    ("y[j] := sum[a](x[j+a] * w[idx[a]])", {"x": (6,), "w": (3,)}, {"idx": (3, (2,))}, {}),
    ("y[j] := sum[a](x[j+a] * w[idx[j]] * k[a])", {"x": (6,), "w": (3,), "k": (3,)},
     {"idx": (3, (4,))}, {}),
    ("y[j] := x[j+1] * x[j+2] * w[idx[j]]", {"x": (6,), "w": (3,)}, {"idx": (3, (4,))}, {}),
    ("y[j] := x[j] * w[idx[j+1]]", {"x": (5,), "w": (3,)}, {"idx": (3, (5,))}, {}),
    ("y[j] := x[j+1] * w[idx[j+1]]", {"x": (5,), "w": (3,)}, {"idx": (3, (5,))}, {}),
    ("y[j] := x[j+1] * w[idx[j+2]]", {"x": (6,), "w": (3,)}, {"idx": (3, (6,))}, {}),
    ("y[j] := x[j] * w[idx[j]] * z[j+1]", {"x": (5,), "w": (3,), "z": (5,)},
     {"idx": (3, (5,))}, {}),
    ("y[j,d] := x[j+1, d] * W[idx[j], d]", {"x": (5, 3), "W": (4, 3)}, {"idx": (4, (4,))},
     {}),
    ("y[j] := x[j+1] * w[idx[j] + j]", {"x": (5,), "w": (9,)}, {"idx": (3, (4,))}, {}),
    ("y[j] := exp(x[j+1]) * log(1 + w[idx[j]]**2)", {"x": (5,), "w": (3,)},
     {"idx": (3, (4,))}, {}),
    ("y[j] := x[j+1] * w[idx[j]]", {"x": (5,), "w": (3,)}, {"idx": (3, (6,))}, {"pad": 0}),
    ("y[j] := x[j+1] * w[idx[j]]", {"x": (5,), "w": (3,)}, {"idx": (3, (4,))},
     {"bounds": "clip"}),
    # two shifts, and shifts alone: output ranges starting at -1 or 1 (notation.md 6.3)
    ("y[j] := x[j+1] * x[j+2]", {"x": (6,)}, {}, {}),
    ("y[j] := x[j+1] * z[j+2]", {"x": (6,), "z": (6,)}, {}, {}),
    ("y[j] := x[j] * x[j-1]", {"x": (6,)}, {}, {}),
    ("y[j] := x[j-1]", {"x": (6,)}, {}, {}),
    ("y[j] := exp(x[j-1]) * w[idx[j]]", {"x": (6,), "w": (3,)}, {"idx": (3, (6,))}, {}),
    ("y[j] := where(j < 1, x[j+1], 2 * x[j+2]) * j", {"x": (5,)}, {}, {}),
    ("y[r, c] := img[r+1, c-1] * img[r+2, c]", {"img": (5, 4)}, {}, {}),
    ("y[j] := max[a](x[j+a-1] * k[a])", {"x": (6,), "k": (2,)}, {}, {}),
    ("y[j] := x[2*j - 3]", {"x": (9,)}, {}, {}),
    ("y[i] := x[i] * w[idx[i]]", {"x": (6,), "w": (3,)}, {"idx": (3, (6,))},
     {"ranges": {"i": range(1, 5)}}),
    ("h[j] := x[j-1]\nq[j] := h[j] * h[j+1]", {"x": (6,)}, {}, {}),
    ("h[j] := x[j+1] * w[idx[j+1]]\nq[j] := exp(h[j])", {"x": (5,), "w": (3,)},
     {"idx": (3, (5,))}, {}),
    ("h[j] := x[j+1] * w[idx[j]]\nq := sum[j](h[j] * h[j])", {"x": (5,), "w": (3,)},
     {"idx": (3, (4,))}, {}),
]


def _shifted_inputs(shapes, index_arrays, seed):
    generator = torch.Generator().manual_seed(seed)
    values = {n: torch.randn(s, dtype=torch.float64, generator=generator).requires_grad_()
              for n, s in shapes.items()}
    indices = {n: torch.randint(0, high, shape, generator=generator)
               for n, (high, shape) in index_arrays.items()}
    return values, indices


@pytest.mark.slow_on("triton")
@pytest.mark.parametrize("statement, shapes, index_arrays, options", SHIFTED,
                         ids=[c[0] + (f" {c[3]}" if c[3] else "") for c in SHIFTED])
def test_shifted_reads_gradcheck(statement, shapes, index_arrays, options, backend):
    values, indices = _shifted_inputs(shapes, index_arrays, len(statement))
    names = list(values)

    def run(*tensors):
        return ef.ein(statement, backend=backend, **dict(zip(names, tensors)), **indices,
                      **options)
    # nondet_tol=0: a first backward and the repeats give the same bits (item 10)
    assert torch.autograd.gradcheck(run, tuple(values.values()), eps=1e-6, atol=1e-5,
                                    nondet_tol=0.0)


def _finite_differences(statement, arrays, options, seed, names):
    """d(sum(out * seed))/d(name) by central differences of the NumPy forward."""
    def loss(named):
        return float((np.asarray(ef.ein(statement, backend="numpy", **named, **options))
                      * seed).sum())
    found = {}
    for name in names:
        grad = np.zeros(arrays[name].shape)
        for at in np.ndindex(*grad.shape):
            up, down = dict(arrays), dict(arrays)
            up[name], down[name] = arrays[name].copy(), arrays[name].copy()
            up[name][at] += 1e-6
            down[name][at] -= 1e-6
            grad[at] = (loss(up) - loss(down)) / 2e-6
        found[name] = grad
    return found


@pytest.fixture
def x64():
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", previous)


# every statement runs through torch's gradcheck above on each backend; here (derive,
# run_reference on NumPy and C, jax.grad against finite differences) every other one by
# default, the rest in the slow run
@pytest.mark.parametrize("statement, shapes, index_arrays, options", [
    pytest.param(*case, id=case[0] + (f" {case[3]}" if case[3] else ""),
                 marks=[pytest.mark.slow] if number % 2 else [])
    for number, case in enumerate(SHIFTED)])
def test_shifted_reads_under_derive_and_jax_match_finite_differences(
        statement, shapes, index_arrays, options, x64):
    jnp = x64.numpy
    values, indices = _shifted_inputs(shapes, index_arrays, len(statement) + 1)
    floats_ = {n: v.detach().numpy() for n, v in values.items()}
    index_values = {n: v.numpy() for n, v in indices.items()}
    arrays = dict(floats_, **index_values)
    out = ef.ein(statement, backend="numpy", **arrays, **options)
    seed = np.random.default_rng(1).standard_normal(np.shape(out))
    want = _finite_differences(statement, arrays, options, seed, list(floats_))
    for name in floats_:
        grads = derive(statement, name, options=options or None)
        seeds = getattr(grads, "outputs", None)
        env = dict(arrays)
        env["d" + seeds[0] if seeds is not None else grads[0].output_grad] = seed
        for backend_name in REFERENCE_BACKENDS:
            found = run_reference(grads, env, backend=backend_name)
            np.testing.assert_allclose(found["d" + name], want[name], atol=1e-6)

    def loss(*moving):
        named = dict(zip(floats_, moving))
        named.update({n: jnp.asarray(v) for n, v in index_values.items()})
        return (ef.ein(statement, **named, **options) * jnp.asarray(seed)).sum()
    got = x64.grad(loss, tuple(range(len(floats_))))(*[jnp.asarray(v)
                                                       for v in floats_.values()])
    for g, name in zip(got, floats_):
        np.testing.assert_allclose(np.asarray(g), want[name], atol=1e-6)


def test_shifted_read_beside_a_gather_matches_the_torch_formula(backend):
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([2, 0, 0, 1, 2])
    seed = torch.randn(5, dtype=torch.float64)
    y = ef.ein("y[j] := x[j+2] * w[idx[j]]", x=x, w=w, idx=idx, backend=backend)
    got = torch.autograd.grad((y * seed).sum(), (x, w))
    want = torch.autograd.grad(((x[2:] * w[idx]) * seed).sum(), (x, w))
    for g, v in zip(got, want):
        torch.testing.assert_close(g, v)


def test_an_output_starting_at_minus_one_under_torch_repeated(backend):
    # y[j] := x[j+1] * x[j+2]: j runs over -1..3, y[p] = x[p] * x[p+1]
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    seed = torch.randn(5, dtype=torch.float64)
    want = torch.autograd.grad(((x[:-1] * x[1:]) * seed).sum(), x)[0]
    for _ in range(3):
        y = ef.ein("y[j] := x[j+1] * x[j+2]", x=x, backend=backend)
        torch.testing.assert_close(torch.autograd.grad((y * seed).sum(), x)[0], want)


def test_an_output_starting_at_one_second_derivative():
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    run = lambda x: ef.ein("y[j] := exp(x[j-1]) * x[j]", x=x)  # noqa: E731
    assert torch.autograd.gradgradcheck(run, (x,), nondet_tol=0.0)


# -- item 9: errors of gradient statements speak of the user's statement --------------------
def _user_statement_error(error: EinfuseError, statement: str, wrt: str):
    text = str(error)
    assert text.startswith(f"computing the gradient of {statement!r} with respect to {wrt}")
    assert error.source == statement
    start, end = error.span
    assert statement[start:end].startswith(wrt)         # the carets under wrt's read
    lines = text.split("\n")
    assert lines[-2].strip() == statement               # the user's statement, shown
    assert set(lines[-1].strip()) == {"^"}


def test_a_gradient_statement_error_names_the_users_statement():
    statement = "y[j] := sum[i](x[j, i] * w[i])"
    grads = derive(statement, "x")
    arrays = dict(x=np.ones((5, 3)), w=np.ones(3), dy=np.ones(5, dtype=np.complex128))
    with pytest.raises(EinfuseTypeError) as caught:
        run_reference(grads, arrays)
    _user_statement_error(caught.value, statement, "x")
    # the statement einfuse derived is only the detail
    assert grads[0].text in str(caught.value)


def test_a_scatter_error_names_the_users_statement():
    statement = "y[j] := x[j] * w[idx[j]]"
    grads = derive(statement, "w")
    arrays = dict(x=np.ones(5), w=np.ones(4), idx=np.arange(5), dy=np.ones(5))
    with pytest.raises(OutOfBoundsError) as caught:
        run_reference(grads, arrays)
    _user_statement_error(caught.value, statement, "w")
    assert "index value 4" in str(caught.value)


def test_a_program_gradient_error_names_the_statement_it_differentiates():
    program = "h[j] := x[j+1] * w[idx[j]]\nq[j] := exp(h[j])"
    grads = derive(program, "x")
    arrays = dict(x=np.ones(5), w=np.ones(4), idx=np.arange(4),
                  dq=np.ones(4, dtype=np.complex128))
    with pytest.raises(EinfuseTypeError) as caught:
        run_reference(grads, arrays)
    _user_statement_error(caught.value, "q[j] := exp(h[j])", "h")


def test_an_output_gradient_of_the_wrong_shape_is_an_error_not_padding():
    # a padded gradient statement would read a short dy as zeros past its end
    statement = "y[j] := x[j+1] * w[j]"
    grads = derive(statement, "x")
    with pytest.raises(ShapeError, match=r"has shape \(3,\), but this statement's output "
                                         r"has shape \(4,\)") as caught:
        run_reference(grads, dict(x=np.ones(5), w=np.ones(4), dy=np.ones(3)))
    assert caught.value.source == statement


def test_explain_shows_the_gradients_of_an_output_starting_at_minus_one():
    text = str(ef.explain("y[j] := x[j+1] * x[j+2]", x=np.ones(6), gradients=True))
    assert "Gradients" in text and "dx[" in text


# -- item 5: forward mode through ef.jit -----------------------------------------------------
def _cond(x):
    return jax.lax.cond(x.sum() > 0, lambda v: jnp.sin(v) * 2, lambda v: v ** 3,
                          x).sum()


def _switch(x):
    return jax.lax.switch(jnp.int32(x.sum() > 0),
                            [lambda v: jnp.sin(v), lambda v: v ** 2, lambda v: -v], x).sum()


def _scan(x):
    def body(c, xi):
        c = jnp.tanh(c * 0.5 + xi)
        return c, c.sum()
    c, ys = jax.lax.scan(body, jnp.zeros(x.shape[1], x.dtype), x)
    return ys.sum() + (c ** 2).sum()


def _fori(x):
    return jax.lax.fori_loop(0, 3, lambda i, v: jnp.sin(v) + v * 0.5, x).sum()


def _while(x):
    return jax.lax.while_loop(lambda c: c[0] < 3,
                                lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.1), (0, x))[1].sum()


FUNCTIONS = {"cond": _cond, "switch": _switch, "scan": _scan, "fori_loop": _fori,
             "while_loop": _while}
REVERSE = ("cond", "switch", "scan", "fori_loop")   # JAX has no reverse mode of while_loop


@pytest.fixture
def forward_kernels(monkeypatch):
    """The names of the ef.jit kernels compiled while the test runs."""
    from einfuse.runtime import jit as jit_module
    made = []
    original = jit_module.CompiledFunction.__init__

    def counted(self, flat_fn, leaves, name="fn", *rest, **options):
        made.append(name)
        original(self, flat_fn, leaves, name, *rest, **options)
    monkeypatch.setattr(jit_module.CompiledFunction, "__init__", counted)
    return made


def _close(got, want):
    jax = pytest.importorskip("jax")
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


# jax.hessian of one branch (cond) and one loop (scan) by default; of switch and
# fori_loop, whose jvp, linearize and jacfwd run here too, in the slow run
_SLOW_HESSIANS = ("switch", "fori_loop")


@pytest.mark.parametrize("transform, name", [
    pytest.param(transform, name, id=f"{transform}-{name}", marks=[pytest.mark.slow] if
                 transform in ("jit linearize", "vmap linearize") or
                 (transform == "hessian" and name in _SLOW_HESSIANS) else [])
    for transform in ("jvp", "linearize", "jit linearize", "jacfwd", "vmap linearize",
                      "hessian")
    for name in FUNCTIONS])
def test_forward_mode_of_ef_jit_equals_jax_jit(name, transform, forward_kernels):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    if transform == "hessian" and name not in REVERSE:
        pytest.skip("jax.hessian is forward over reverse: JAX has no reverse while_loop")
    fn = FUNCTIONS[name]
    x = jnp.asarray(np.random.default_rng(4).standard_normal((3, 4)), jnp.float32)
    t = jnp.asarray(np.random.default_rng(5).standard_normal((3, 4)), jnp.float32)
    run = {"jvp": lambda f: jax.jvp(f, (x,), (t,)),
           "linearize": lambda f: jax.linearize(f, x)[1](t),
           "jit linearize": lambda f: jax.jit(lambda x: jax.linearize(f, x)[1](t))(x),
           "jacfwd": lambda f: jax.jacfwd(f)(x),
           "vmap linearize": lambda f: jax.vmap(jax.linearize(f, x)[1])(jnp.stack([t, -t])),
           "hessian": lambda f: jax.hessian(f)(x)}[transform]
    _close(run(ef.jit(fn)), run(jax.jit(fn)))
    # the forward mode ran as a kernel of its own (the jvp of fn, converted), not as JAX
    assert any(made.startswith("the forward mode of") for made in forward_kernels)


@pytest.mark.parametrize("name", REVERSE)
def test_reverse_mode_stays_on_the_fused_backward(name, forward_kernels):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    fn = FUNCTIONS[name]
    x = jnp.asarray(np.random.default_rng(6).standard_normal((3, 4)), jnp.float32)
    fused = ef.jit(fn)
    _close(jax.grad(fused)(x), jax.grad(fn)(x))
    _close(jax.jit(jax.grad(fused))(x), jax.jit(jax.grad(fn))(x))
    _close(jax.vmap(jax.grad(fused))(jnp.stack([x, -x])),
           jax.vmap(jax.grad(fn))(jnp.stack([x, -x])))
    # jax.linear_transpose of the linearized function is reverse mode too
    linear = jax.linearize(fused, x)[1]
    _close(jax.linear_transpose(linear, x)(jnp.float32(1.0)), jax.grad(fn)(x))
    assert forward_kernels[:2] == [fn.__name__, f"the gradient of {fn.__name__}"]
    # reverse mode neither evaluates a tangent nor compiles the forward-mode kernel
    assert not any(made.startswith("the forward mode") for made in forward_kernels)


def test_grad_of_a_vmap_with_an_unbatched_input_and_jvp_of_grad():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def f(w, x):
        def body(c, xi):
            c = jnp.tanh(c @ w + xi)
            return c, c.sum()
        c, ys = jax.lax.scan(body, jnp.zeros(w.shape[0], w.dtype), x)
        return ys.sum() + (c ** 2).sum()
    rng = np.random.default_rng(7)
    w = jnp.asarray(rng.standard_normal((4, 4)) * 0.3, jnp.float32)
    xs = jnp.asarray(rng.standard_normal((2, 6, 4)), jnp.float32)
    fused = ef.jit(f)

    def batched_loss(g):
        return lambda w: jax.vmap(g, in_axes=(None, 0))(w, xs).sum()
    _close(jax.grad(batched_loss(fused))(w), jax.grad(batched_loss(f))(w))
    t = jnp.ones_like(w)
    _close(jax.jvp(jax.grad(fused), (w, xs[0]), (t, jnp.zeros_like(xs[0]))),
           jax.jvp(jax.grad(f), (w, xs[0]), (t, jnp.zeros_like(xs[0]))))
    _close(jax.jacfwd(jax.jacfwd(fused))(w, xs[0]), jax.jacfwd(jax.jacfwd(f))(w, xs[0]))


def test_forward_mode_with_integer_inputs_and_outputs():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def f(x, n):
        y = jax.lax.fori_loop(0, n, lambda i, v: jnp.sin(v) + 0.1 * i, x)
        return y.sum(), n * 2
    x = jnp.asarray(np.random.default_rng(8).standard_normal(5), jnp.float32)
    n = jnp.int32(3)
    zero = np.zeros((), jax.dtypes.float0)
    got = jax.jvp(ef.jit(f), (x, n), (jnp.ones_like(x), zero))
    want = jax.jvp(jax.jit(f), (x, n), (jnp.ones_like(x), zero))
    _close(got[0], want[0])
    np.testing.assert_allclose(np.asarray(got[1][0]), np.asarray(want[1][0]), rtol=1e-5)
    assert got[1][1].dtype == jax.dtypes.float0
    _close(jax.linearize(lambda x: ef.jit(f)(x, n)[0], x)[1](jnp.ones_like(x)),
           jax.linearize(lambda x: f(x, n)[0], x)[1](jnp.ones_like(x)))
