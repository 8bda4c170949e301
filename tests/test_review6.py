"""Review of the prepared autograd call (program/autograd.py), the fused groups' prepared
runner (backends/c/fused_prepared.py) and programs under JAX transformations
(runtime/jax_program.py): the bugs found, each as the test that failed."""

import numpy as np
import pytest

import einfuse as ef

torch = pytest.importorskip("torch")


# -- PyTorch: one autograd node per program ------------------------------------------------

@pytest.mark.parametrize("source, formula", [
    ("T[i,j] := X[i,j]*2\ny[i] := sum[j](T[i,j])", lambda X, W: (X * 2).sum(1)),
    ("T[i,j] := X[i,j]*W[j]\nU[i,j] := T[i,j] + 1\ny[i] := sum[j](U[i,j])",
     lambda X, W: (X * W + 1).sum(1)),
    ("T[i,k] := X[i,k]*2\nS[i] := sum[k](T[i,k])\ny[i,j] := S[i] * W[j]",
     lambda X, W: (2 * X).sum(1)[:, None] * W),
])
def test_an_intermediate_the_backward_needs_the_shape_of_may_live_inside_a_fused_group(
        source, formula):
    """Past the fusing size the forward keeps only outputs and saved names, so ``T``
    (a per-thread row) never reached the environment, and the placeholder the backward
    needed for its shape raised a raw KeyError: 'T' on the first call."""
    program = ef.compile(source)
    for _ in range(2):      # the first call and the prepared one
        X = torch.randn(80, 64, dtype=torch.float64, requires_grad=True)
        W = torch.randn(64, dtype=torch.float64, requires_grad=True)
        inputs = dict(X=X, W=W) if "W" in source else dict(X=X)
        out = program(**inputs)
        seed = torch.randn_like(out)
        got = torch.autograd.grad(out, list(inputs.values()), seed)
        want = torch.autograd.grad(formula(X, W), list(inputs.values()), seed)
        torch.testing.assert_close(out, formula(X, W))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("source", [
    "T[i,j] := X[i,j] + b[j]\nY[i,j] := T[i,j]*2",          # a program: one node
    "P[i,j] := exp(X[i,j]*b[j] - max[k](X[i,k]*b[k])) / "
    "sum[k](exp(X[i,k]*b[k] - max[l](X[i,l]*b[l])))",         # its hoisted form
    "Y[i,j] := X[i,j] + b[j]",                               # a statement's node
])
def test_an_inference_tensor_beside_one_that_needs_a_gradient(source):
    """Every tensor of the call was saved for torch's version check, and torch refuses
    to save an inference tensor: a raw RuntimeError for a valid computation (torch's
    own ``X + b`` runs)."""
    with torch.inference_mode():
        X = torch.randn(70, 64, dtype=torch.float64)
    b = torch.randn(64, dtype=torch.float64, requires_grad=True)
    program = ef.compile(source)
    formula = (lambda X, b: torch.softmax(X * b, 1)) if "exp" in source else \
        (lambda X, b: (X + b) * 2) if "*2" in source else (lambda X, b: X + b)
    for create_graph in (False, False, True):
        out = program(X=X, b=b)
        seed = torch.randn_like(out)
        (got,) = torch.autograd.grad(out, b, seed, create_graph=create_graph)
        (want,) = torch.autograd.grad(formula(X.clone(), b), b, seed)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("source", [
    "T[i,j] := X[i,j]*g[j]\nY[i,j] := T[i,j]*2",
    "P[i,j] := exp(X[i,j] - max[k](X[i,k])) / sum[k](exp(X[i,k] - max[l](X[i,l])))",
    "Y[i,j] := X[i,j]*g[j]",
])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_forward_mode_dual_tensor_is_refused_not_its_tangent_dropped(source,
                                                                       requires_grad):
    """torch.autograd.forward_ad: the kernels read a dual tensor's values, so the
    result came back with no tangent at all (a silently wrong jvp), or, recorded, as
    torch's raw NotImplementedError (no jvp on the Function); also after calls of the
    same signature prepared the fast paths."""
    import torch.autograd.forward_ad as forward_ad
    program = ef.compile(source)
    X = torch.randn(70, 64, dtype=torch.float64, requires_grad=requires_grad)
    g = torch.randn(64, dtype=torch.float64)
    inputs = dict(X=X, g=g) if "g[" in source else dict(X=X)
    for _ in range(2):
        program(**inputs)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(X, torch.ones_like(X))
        with pytest.raises(ef.EinfuseError, match="X carries a forward-mode tangent"):
            program(**dict(inputs, X=dual))
        program(**inputs)       # a plain tensor inside the level runs as before


def test_a_repeated_recorded_hoisted_statement_falls_back_to_the_statement_as_written():
    """The hoisted runner's prepared autograd call ran outside the fallback that its
    own hoisted run has: an index array that only the hoisted temporary reads (``x``
    empty: the statement reads no ``A[I[k]]``) raised OutOfBoundsError naming the
    temporary ``h1 := max[k](A[I[k]])`` on a repeated call, where the first call (and
    NumPy) give the empty result; an index the statement does read was reported with
    the temporary's text instead of the statement's."""
    kernel = ef.compile("y[i] := x[i] * max[k](A[I[k]])")
    x = torch.randn(0, dtype=torch.float64, requires_grad=True)
    A = torch.randn(5, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        kernel(x=x, A=A, I=torch.tensor([0, 1, 2]))
    assert kernel(x=x, A=A, I=torch.tensor([0, 9, 2])).shape == (0,)
    softmax = ef.compile("P[i,j] := exp(A[I[i],j] - max[k](A[I[i],k])) / "
                         "sum[k](exp(A[I[i],k] - max[l](A[I[i],l])))")
    A = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        softmax(A=A, I=torch.tensor([0, 1, 2, 5]))
    from einfuse.errors import OutOfBoundsError
    with pytest.raises(OutOfBoundsError, match=r"(?s)I\[3\] = 11.*P\[i,j\] := exp"):
        softmax(A=A, I=torch.tensor([0, 1, 2, 11]))


@pytest.mark.parametrize("source", [
    "T[i] := W[i]*2\ny[i] := exp(T[i])",
    "y[i] := exp(W[i]*2)",
    "P[i] := exp(W[i] - max[k](W[k])) / sum[k](exp(W[k] - max[l](W[l])))",
])
def test_a_tensor_closed_over_inside_a_torch_func_transform(source):
    """Inside torch.func.grad even ``W.detach()`` is a wrapper with no storage: reading
    a closed-over constant raised torch's raw 'Cannot access data pointer of Tensor that
    doesn't have storage'; one that requires a gradient reached Function.apply's
    'must override the setup_context staticmethod' (both raw RuntimeErrors)."""
    program = ef.compile(source)
    x = torch.randn(5, dtype=torch.float64)
    formula = (lambda W: torch.softmax(W, 0)) if "max" in source else \
        (lambda W: torch.exp(W * 2))
    for requires_grad in (False, True):
        W = torch.randn(5, dtype=torch.float64, requires_grad=requires_grad)
        for _ in range(2):      # the first call, then the prepared paths
            program(W=W)
        for transform in (torch.func.grad, torch.func.vmap):
            inputs = x if transform is torch.func.grad else x.expand(3, 5)
            call = transform(lambda x: (program(W=W) * x).sum())
            if requires_grad:
                with pytest.raises(ef.EinfuseError, match="W requires a gradient inside a "
                                                         "torch.func transform"):
                    call(inputs)
            else:
                want = formula(W) if transform is torch.func.grad else \
                    (formula(W) * inputs).sum(1)
                torch.testing.assert_close(call(inputs), want)


@pytest.mark.parametrize("source", [
    "T[i,j] := X[i,j]*2\nY[i,j] := exp(T[i,j])",
    "P[i,j] := exp(X[i,j] - max[k](X[i,k])) / sum[k](exp(X[i,k] - max[l](X[i,l])))",
    "Y[i,j] := exp(X[i,j]*2)",
])
def test_enable_grad_inside_inference_mode_records_nothing(source):
    """torch.enable_grad() inside torch.inference_mode turns grad mode on, but torch
    records nothing there (its results are inference tensors, requires_grad False);
    einfuse's nodes recorded the call: an inference tensor that requires grad, whose
    backward then failed."""
    program = ef.compile(source)
    X = torch.randn(70, 64, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        program(X=X)          # the first call, then the prepared paths
    formula = (lambda X: torch.softmax(X, 1)) if "max" in source else \
        (lambda X: torch.exp(X * 2))
    with torch.inference_mode(), torch.enable_grad():
        got, want = program(X=X), formula(X)
    assert not want.requires_grad and not got.requires_grad
    torch.testing.assert_close(got, want)


# -- the fused groups' prepared runner ----------------------------------------------------

def test_the_prepared_fused_runner_never_runs_more_threads_than_its_scratch_holds(
        monkeypatch):
    """Per-thread rows and column accumulators are made once, for OMP_NUM_THREADS as it
    was when the runner was prepared, but each call took the free cores as they are
    now: with OMP_NUM_THREADS raised later on a busy machine, the kernel's extra threads
    wrote past the scratch (heap corruption: 'double free or corruption')."""
    from einfuse.backends.c import (build as c_build, call as c_call,
                                    fused_prepared as c_fused_prepared)
    if c_build.find_compiler() is None or c_call.caller() is None:
        pytest.skip("needs the C backend and its call extension")
    counts = []
    real = c_call.caller()

    def caller(entry, arrays, *rest):
        counts.append(rest[-1])
        if rest[-1] > 1:      # (running it would corrupt the heap)
            raise AssertionError(f"{rest[-1]} threads on scratch made for 1")
        return real(entry, arrays, *rest)
    monkeypatch.setattr(c_call, "caller", lambda: caller)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # e: a per-thread row of the fused group; c: a column sum (per-thread accumulators)
    program = ef.compile("e[i,j] := exp(X[i,j]*W[j])\ns[i] := sum[j](e[i,j])\n"
                         "c[j] := sum[i](e[i,j])\ny[i,j] := e[i,j]/s[i] + X[i,j]",
                         outputs=("y", "c"))
    X = np.random.default_rng(4).standard_normal((600, 300))
    W = np.random.default_rng(5).standard_normal(300) * 0.1
    program(X=X, W=W)                 # prepares the runner: rows for one thread
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    monkeypatch.setattr(c_fused_prepared, "free_threads", lambda: 8)   # cores left now
    y, c = program(X=X, W=W)
    assert counts and max(counts) == 1
    e = np.exp(X * W)
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True) + X, rtol=1e-12)
    np.testing.assert_allclose(c, e.sum(0), rtol=1e-12)


# -- JAX: one custom_jvp per program -----------------------------------------------------

@pytest.fixture
def jax64():
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", previous)


def test_jax_grad_with_respect_to_a_python_number(jax64):
    """jax.grad of a Python float reaches the tangent's transpose as JAX's literal
    (TypedFloat: a float with a dtype, no shape): AttributeError 'shape'."""
    jnp = jax64.numpy
    x = jnp.asarray(np.random.default_rng(0).standard_normal(5))
    program = ef.compile("s[] := sum[i](x[i]*x[i])\nt[] := s[]*c")
    got = jax64.grad(lambda x, c: program(x=x, c=c), (0, 1))(x, 2.0)
    np.testing.assert_allclose(got[0], 4 * x)
    np.testing.assert_allclose(got[1], jnp.sum(x * x))
    zero_d = ef.compile("T[] := a[]*2\ny[i] := T[]*x[i]")
    got = jax64.grad(lambda a: jnp.sum(jnp.sin(zero_d(a=a, x=x))))(1.5)
    np.testing.assert_allclose(got, jnp.sum(jnp.cos(3 * x) * 2 * x))


def test_jax_jvp_with_a_python_number_as_primal(jax64):
    """jax.jvp hands a Python float primal to the custom_jvp rule as it is:
    AttributeError 'float' object has no attribute 'dtype'."""
    jnp = jax64.numpy
    X = jnp.asarray(np.random.default_rng(1).standard_normal((4, 5)))
    program = ef.compile("Y[i,j] := X[i,j]*c\nz[i] := sum[j](exp(Y[i,j]))")
    got = jax64.jvp(lambda c: program(X=X, c=c), (0.5,), (1.0,))
    want = jax64.jvp(lambda c: jnp.exp(X * c).sum(1), (0.5,), (1.0,))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    softmax = ef.compile("P[i,j] := exp(c*X[i,j] - max[k](c*X[i,k])) / "
                         "sum[k](exp(c*X[i,k] - max[l](c*X[i,l])))")
    got = jax64.jvp(lambda c: softmax(X=X, c=c), (0.5,), (1.0,))
    want = jax64.jvp(lambda c: jax64.nn.softmax(c * X, axis=1), (0.5,), (1.0,))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_jax_a_python_number_for_an_array_under_grad_is_a_shape_error(jax64):
    """A Python float given for ``b[j]`` under jax.grad reached the statement's impl as
    JAX's literal and raised AttributeError instead of the ShapeError it gets eagerly."""
    jnp = jax64.numpy
    program = ef.compile("mu[i] := mean[j](X[i,j])\n"
                         "Y[i,j] := (X[i,j]-mu[i]) * g[j] + b[j]")
    X = jnp.ones((4, 5))
    from einfuse.errors import ShapeError
    with pytest.raises(ShapeError, match="b has 0 axes"):
        jax64.grad(lambda X: jnp.sum(program(X=X, g=jnp.ones(5), b=0.5)))(X)


def test_jax_jit_of_a_hoisted_statement_keeps_a_weak_scalars_promotion(jax64):
    """Under jax.jit a Python float parameter is a weakly typed tracer; the hoisted
    form was chosen by binding its placeholder (a strong float64), so float32 inputs
    gave a float64 result under jit (float32 eagerly, in a program, and in jax.numpy)."""
    jnp = jax64.numpy
    X = jnp.asarray(np.random.default_rng(2).standard_normal((4, 5)), jnp.float32)
    softmax = ef.compile("P[i,j] := exp(c*X[i,j] - max[k](c*X[i,k])) / "
                         "sum[k](exp(c*X[i,k] - max[l](c*X[i,l])))")
    variance = ef.compile("y[i] := sum[j]((X[i,j] - mean[k](X[i,k]))**2) * c")
    for ours, formula in ((lambda X, c: softmax(X=X, c=c),
                           lambda X, c: jax64.nn.softmax(c * X, axis=1)),
                          (lambda X, c: variance(X=X, c=c),
                           lambda X, c: ((X - X.mean(1, keepdims=True)) ** 2).sum(1) * c)):
        got = jax64.jit(ours)(X, 0.5)
        assert got.dtype == formula(X, 0.5).dtype == jnp.float32
        np.testing.assert_allclose(got, formula(X, 0.5), rtol=1e-5, atol=1e-6)


def test_jax_grad_of_a_program_given_a_python_list(jax64):
    """A list is an array to einfuse (eagerly and statement by statement under grad),
    but the program's custom_jvp took it for a constant, a parameter of its tangent
    primitive, which JAX must hash: a raw TypeError 'not hashable'."""
    jnp = jax64.numpy
    program = ef.compile("T[i,j] := X[i,j]*W[j]\ny[i] := sum[j](exp(T[i,j]))")
    X = jnp.asarray(np.random.default_rng(3).standard_normal((4, 5)))
    W = [0.5, -1.0, 2.0, 0.0, 1.5]
    want = jax64.grad(lambda X: jnp.sum(jnp.exp(X * jnp.asarray(W)).sum(1)))(X)
    np.testing.assert_allclose(jax64.grad(lambda X: jnp.sum(program(X=X, W=W)))(X), want)
    np.testing.assert_allclose(
        jax64.jit(jax64.grad(lambda X: jnp.sum(program(X=X, W=tuple(W)))))(X), want)


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax", "jax.grad"])
def test_a_ragged_list_is_an_error_naming_it(framework):
    """NumPy (or JAX) could not make an array of it: their raw ValueError came out of
    binding, for programs and statements alike."""
    program = ef.compile("T[i,j] := X[i,j]*W[j]\ny[i] := sum[j](exp(T[i,j]))")
    X = np.ones((4, 2))
    if framework == "torch":
        X = torch.ones(4, 2, dtype=torch.float64, requires_grad=True)
    elif framework.startswith("jax"):
        jax = pytest.importorskip("jax")
        X = jax.numpy.ones((4, 2))
    call = lambda X: program(X=X, W=[1.0, [2.0]])
    if framework == "jax.grad":
        call = jax.grad(lambda X: program(X=X, W=[1.0, [2.0]]).sum())
    with pytest.raises(ef.EinfuseError, match="W cannot be read as an array"):
        call(X)


def test_a_programs_gradient_through_argmax_alone_is_the_statements_error():
    """programs.md 5: asking for a gradient that reaches the result only through argmax
    (sign, //, %) is an error naming it -- as the one-statement form says, and
    ef.derive of the program.  The program's torch node and custom_jvp fell back to the
    statements, whose argmax has an int output: X.grad stayed None (torch), zeros came
    back (jax.grad)."""
    from einfuse.errors import NoGradientError
    program = ef.compile("m[i] := argmax[j](X[i,j])\ny[i] := m[i]*W[i]")
    for requires_grad in (False, True):
        X = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
        W = torch.randn(4, dtype=torch.float64, requires_grad=requires_grad)
        with pytest.raises(NoGradientError, match="only through argmax"):
            program(X=X, W=W)
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    X, W = jnp.asarray(np.random.default_rng(6).standard_normal((4, 5))), jnp.ones(4)
    with pytest.raises(NoGradientError, match="only through argmax"):
        jax.grad(lambda X: jnp.sum(program(X=X, W=W)))(X)
    # a gradient of W alone is fine: m
    np.testing.assert_allclose(jax.grad(lambda W: jnp.sum(program(X=X, W=W)))(W),
                               jnp.argmax(X, axis=1))
