"""ef.jit's programs are made of the one IR's nodes, and their threading is a value decided
before rendering (plan/jit_threads.py)."""

import numpy as np
import pytest

from einfuse import ir
from einfuse.analysis.cost import step_flops, typed_work
from einfuse.plan.jit_threads import PARALLEL_WORK, batch_threads, decide

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from einfuse.frontends.jaxpr import convert  # noqa: E402


def _assigns(steps):
    for step in steps:
        if isinstance(step, ir.Assign):
            yield step
        elif isinstance(step, ir.Loop):
            yield from _assigns(step.condition_steps + step.body)
        elif isinstance(step, ir.Switch):
            for body in step.branches:
                yield from _assigns(body)


def _program(fn, *args):
    return convert(jax.make_jaxpr(fn)(*args))


def test_a_converted_program_is_made_of_the_ir_nodes():
    def fn(x, w):
        def body(h, _):
            return jnp.tanh(h @ w), None
        h, _ = lax.scan(body, x, None, length=3)
        return lax.cond(h.sum() > 0, lambda: h, lambda: -h)

    x, w = np.ones((2, 4), np.float32), np.ones((4, 4), np.float32)
    program = _program(fn, x, w)
    loops = [s for s in program.steps if isinstance(s, ir.Loop)]
    assert [loop.kind for loop in loops] == [ir.LoopKind.SCAN]
    assert loops[0].length == 3 and loops[0].updates
    assert any(isinstance(s, ir.Switch) for s in program.steps)
    for buffer in program.buffers:
        assert isinstance(buffer, ir.Buffer) and isinstance(buffer.dtype, ir.ScalarType)
        assert buffer.shape is not None
    ops = {node.op for node in ir.walk(program) if isinstance(node, ir.Apply)}
    assert ops and all(isinstance(op, ir.ElementOp) for op in ops)
    assert ir.ElementOp.TANH in ops


def test_unknown_words_fail_when_a_node_is_built():
    x = ir.Read("x", (ir.Index("i"),), ir.ScalarType.FLOAT32)
    with pytest.raises(ValueError):
        ir.Apply("frobnicate", (x,), ir.ScalarType.FLOAT32)
    with pytest.raises(ValueError):
        ir.Reduction("mean", (("i", 4),), x)
    with pytest.raises(TypeError):
        ir.Const("1", ir.ScalarType.INT64)
    assert ir.Const(np.float32(2), ir.ScalarType.FLOAT64).value == 2.0
    assert ir.ScalarType.of(np.float32) is ir.ScalarType.FLOAT32
    assert ir.ScalarType.of(np.complex64) is None


def test_threading_is_decided_before_rendering_from_the_one_count():
    big, small = np.ones((256, 256)), np.ones((4, 4))

    def fn(a, b):
        def body(h, _):
            return jnp.tanh(h @ b), None
        h, _ = lax.scan(body, jnp.ones((4, 4)), None, length=2)
        return a @ a, h

    program = _program(fn, big, small)
    assert not any(s.parallel for s in _assigns(program.steps))   # undecided: none
    decided = decide(program)
    top = [s for s in decided.steps if isinstance(s, ir.Assign)]
    inner = [s for s in _assigns(decided.steps) if s not in top]
    heavy = [s for s in top if step_flops(s) >= PARALLEL_WORK]
    assert heavy and all(s.parallel for s in heavy)
    assert inner and not any(s.parallel for s in inner)
    # a caller running the program on its own thread team: no statement gets threads
    assert not any(s.parallel for s in _assigns(decide(program, threads_inside=False).steps))
    # the batch's elements get threads when all of them together are worth it
    one = typed_work(program.steps)
    assert batch_threads(program, 2) == (2 * one >= PARALLEL_WORK)
    assert not batch_threads(program, 1)
