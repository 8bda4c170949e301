"""One table of JAX's elementwise primitives (frontends/jaxpr_rules.ELEMENTWISE_PRIMITIVES):
the jaxpr front end's generic rule converts those with a renderer operation, and the
chain rewrite (runtime/jit_chain_rules.ELEMENTWISE) takes all of them per chain but the
shifts -- the primitives it took before the table was shared, no more and no fewer."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from einfuse.frontends import jaxpr_rules                      # noqa: E402
from einfuse.runtime import jit_chain_rules                    # noqa: E402
from einfuse.runtime.jit_chain_kinds import Kind, NotPerChain, Val, SHARED   # noqa: E402

# runtime/jit_chain_rules.ELEMENTWISE as it was written out before (main 5912eb1)
CHAIN_LIST_BEFORE = frozenset("""
abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type
copy copy_p cos cosh div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow
is_finite le lgamma digamma log log1p logistic lt max min mul ne neg nextafter not or pow real
reduce_precision rem round rsqrt select_n sign sin sinh sqrt square sub tan tanh xor
""".split())
SHIFTS = {"shift_left", "shift_right_logical", "shift_right_arithmetic"}


def test_the_chain_rewrite_takes_what_it_took_before():
    assert jit_chain_rules.ELEMENTWISE == CHAIN_LIST_BEFORE
    assert not SHIFTS & jit_chain_rules.ELEMENTWISE
    assert jit_chain_rules.ELEMENTWISE | SHIFTS == set(jaxpr_rules.ELEMENTWISE_PRIMITIVES)


def test_the_front_ends_generic_rule_converts_the_rendered_ones():
    table = jaxpr_rules.ELEMENTWISE_PRIMITIVES
    assert jaxpr_rules.ELEMENTWISE == {p: op for p, op in table.items() if op is not None}
    assert SHIFTS <= set(jaxpr_rules.ELEMENTWISE)
    assert jaxpr_rules.ELEMENTWISE["add_any"] == "add"
    for primitive in table:
        rule = jaxpr_rules.RULES.get(primitive)
        if table[primitive] is None:    # a rule of its own, or none (the front end refuses)
            assert rule is not jaxpr_rules.elementwise
        else:
            assert rule is jaxpr_rules.elementwise


def _equation(function, *args):
    (eqn,) = jax.make_jaxpr(function)(*args).jaxpr.eqns
    return eqn


CHAINED = Kind(chain=0)
BROADCAST = Kind(uniform=frozenset({0}))      # shared, the same along the chain axis


def test_a_shift_of_a_chains_values_is_not_taken_per_chain():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    eqn = _equation(jax.lax.shift_left, x, x)
    with pytest.raises(NotPerChain, match=r"shift_left of .*\(no rule takes it per chain\)"):
        jit_chain_rules.apply(eqn, [Val(CHAINED, x[0]), Val(BROADCAST, x)])
    # on values every chain shares it runs as written
    (out,) = jit_chain_rules.apply(eqn, [Val(SHARED, x), Val(SHARED, x)])
    assert out.kind == SHARED
    np.testing.assert_array_equal(np.asarray(out.value), x << x)


def test_an_elementwise_primitive_of_a_chains_values_is_taken_per_chain():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    w = np.broadcast_to(x[:1], x.shape)
    for function in (jax.lax.mul, jax.lax.atan2, jax.lax.max):
        eqn = _equation(function, x, w)
        (out,) = jit_chain_rules.apply(eqn, [Val(CHAINED, x[1]), Val(BROADCAST, w)])
        assert out.kind == CHAINED
        np.testing.assert_allclose(np.asarray(out.value), np.asarray(function(x, w))[1],
                                   rtol=1e-6)
