"""ef.jit on what newer JAX versions emit (the rules are written from JAX 0.11's source;
the JAX installed here may be older, so a primitive it lacks is made here under the same
name with the meaning JAX gives it, and compared with NumPy)."""

from types import SimpleNamespace

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402
from einfuse.frontends.jaxpr_values import JaxprConversionError  # noqa: E402
from einfuse.frontends.jaxpr_control import scan_layout  # noqa: E402

from jit_support import close, x64  # noqa: E402,F401  (x64: an autouse fixture)

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")


def _primitive(name, impl, multiple_results=False, jax_own=True):
    """JAX's own primitive ``name`` where this JAX has it (and ``jax_own``: its
    parameters are known), else one of that name."""
    from jax._src.lax import lax as lax_internal
    found = getattr(lax_internal, f"{name}_p", None)
    if found is not None and jax_own:
        return found
    from jax.extend.core import Primitive
    prim = Primitive(name)
    prim.multiple_results = multiple_results
    prim.def_impl(impl)
    from jax._src.core import ShapedArray

    def abstract(*avals, **params):
        shapes = jax.eval_shape(lambda *xs: impl(*xs, **params), *avals)
        return jax.tree_util.tree_map(lambda s: ShapedArray(s.shape, s.dtype), shapes)
    prim.def_abstract_eval(abstract)
    return prim


def _one_minus_square():
    """JAX's ``lax.one_minus_square`` (0.11), else a primitive of that name."""
    if hasattr(lax, "one_minus_square"):
        return lax.one_minus_square
    return _primitive("one_minus_square", lambda x, **_: 1 - x * x, jax_own=False).bind


def test_one_minus_square_the_derivative_of_tanh_in_jax_0_11():
    one_minus_square = _one_minus_square()
    x = np.linspace(-1.5, 1.5, 31)
    got = ef.jit(lambda v: one_minus_square(jnp.tanh(v)) * 2.0)(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), (1 - np.tanh(x) ** 2) * 2.0, rtol=1e-12,
                               atol=1e-15)
    # (1 - t)(1 + t) keeps the digits that 1 - t*t loses where t is near 1
    t = np.float64(1 - 2.0 ** -30)
    exact = (1 - t) * (1 + t)
    assert float(ef.jit(one_minus_square)(jnp.asarray(t))) == exact
    # and the gradient of tanh, which JAX 0.11 writes with it
    close(ef.jit(jax.grad(lambda v: jnp.tanh(v).sum()))(jnp.asarray(x)), 1 - np.tanh(x) ** 2)


def test_one_minus_square_on_integers_is_refused_by_name():
    prim = _primitive("one_minus_square", lambda x, **_: 1 - x * x, jax_own=False)
    with pytest.raises(JaxprConversionError, match="one_minus_square"):
        ef.jit(lambda v: prim.bind(v))(jnp.arange(3))


def test_unstack_one_result_per_position_along_the_axis():
    prim = _primitive("unstack", lambda x, *, axis: [jnp.take(x, k, axis=axis)
                                                     for k in range(x.shape[axis])],
                      multiple_results=True)
    x = np.arange(24.0).reshape(2, 3, 4)
    for axis in range(3):
        def parts(v, axis=axis):
            return [p * (k + 1) for k, p in enumerate(prim.bind(v, axis=axis))]
        got = ef.jit(parts)(jnp.asarray(x))
        want = [np.take(x, k, axis=axis) * (k + 1) for k in range(x.shape[axis])]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w)


def test_jax_checkpoint_is_inlined():
    def f(w, x):
        return jax.checkpoint(lambda w: jnp.tanh(x @ w).sum())(w)
    w, x = jnp.asarray(np.ones((3, 2)) * 0.1), jnp.asarray(np.arange(12.0).reshape(4, 3))
    close(ef.jit(f)(w, x), jax.jit(f)(w, x))
    close(ef.jit(jax.grad(f))(w, x), jax.jit(jax.grad(f))(w, x))


class _Parts:
    """A stand-in for JAX 0.11's flat trees (jax/_src/flattree.py): ``update`` fills the
    leaves in order, ``unpack`` gives the parts."""

    def __init__(self, sizes, values=None):
        self.sizes = sizes
        self.values = values

    def update(self, values):
        return _Parts(self.sizes, list(values))

    def unpack(self):
        out, start = [], 0
        for size in self.sizes:
            out.append(self.values[start:start + size])
            start += size
        return tuple(out)


def _scan_eqn():
    def f(c, w, xs):
        return lax.scan(lambda c, x: (c * w + x, c), c, xs)
    jaxpr = jax.make_jaxpr(f)(1.0, 2.0, jnp.ones(3)).jaxpr
    return next(e for e in jaxpr.eqns if e.primitive.name == "scan")


def test_scan_operands_told_apart_from_jax_0_11s_flat_trees():
    eqn = _scan_eqn()
    n_consts, n_carry = scan_layout(eqn)
    n_xs = len(eqn.invars) - n_consts - n_carry
    n_ys = len(eqn.outvars) - n_carry
    params = {k: v for k, v in eqn.params.items() if k not in ("num_consts", "num_carry")}
    as_0_11 = SimpleNamespace(params={**params, "ft_in": _Parts((n_consts, n_carry, n_xs)),
                                      "ft_out": _Parts((n_carry, n_ys))},
                              invars=eqn.invars, outvars=eqn.outvars,
                              primitive=eqn.primitive, source_info=eqn.source_info)
    assert scan_layout(as_0_11) == (n_consts, n_carry)
    # a layout that does not add up is refused with the primitive's name, not guessed
    as_0_11.params["ft_out"] = _Parts((n_carry + 1, n_ys - 1))
    with pytest.raises(JaxprConversionError, match="'scan'"):
        scan_layout(as_0_11)
    as_0_11.params.pop("ft_in")
    with pytest.raises(JaxprConversionError, match="'scan'"):
        scan_layout(as_0_11)
