"""Sharded runs on 8 CPU devices, checked against NumPy and against the compiled HLO.

JAX must see 8 devices, which needs XLA_FLAGS set before jax is imported; other test
modules import jax first, so test_sharding_run.py runs this file in a subprocess
(``python sharding_checks.py``), which prints one JSON object: check name -> null when
it passed, else what failed.  Importing this module imports neither jax nor einfuse's
JAX path (test collection reads CHECKS)."""

from __future__ import annotations

import re

import numpy as np

CHECKS = {}


def check(function):
    CHECKS[function.__name__] = function
    return function


# -- HLO ------------------------------------------------------------------------------------
_KINDS = {"all-reduce": "all-reduce", "all-gather": "all-gather",
          "reduce-scatter": "reduce-scatter", "all-to-all": "all-to-all"}
_ITEMSIZE = {"f32": 4, "f64": 8, "s32": 4, "s64": 8, "bf16": 2, "f16": 2, "pred": 1}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")


def _shape_bytes(text: str) -> int:
    """Bytes of an HLO shape (a tuple's parts added)."""
    total = 0
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", text):
        if dtype in _ITEMSIZE:
            count = 1
            for d in filter(None, dims.split(",")):
                count *= int(d)
            total += count * _ITEMSIZE[dtype]
    return total


def hlo_collectives(text: str):
    """(kind, operand bytes) of every collective in compiled HLO text, in order."""
    shapes, found = {}, []
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        name, shape, op, rest = match.groups()
        shapes[name] = shape
        kind = _KINDS.get(op[:-len("-start")] if op.endswith("-start") else op)
        if kind is None:
            continue
        operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
        found.append((kind, sum(_shape_bytes(shapes[o]) for o in operands if o in shapes)))
    return found


def predicted(plan):
    return [(m.kind.value, m.operand_bytes) for m in plan.collectives]


# -- helpers ------------------------------------------------------------------------------
def _setup():
    global jax, jnp, ef
    import jax
    import jax.numpy as jnp

    import einfuse as ef


def _rand(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


def _run(text, arrays, mesh, shard, expected, kinds, **options):
    """Run sharded (eagerly and under jax.jit), compare with ``expected`` (NumPy),
    count the HLO's collectives (``kinds``: kind -> count) and match each one's operand
    bytes with the plan's."""
    f = ef.compile(text, mesh=mesh, shard=shard, **options)
    got = f(**arrays)
    jitted = jax.jit(lambda a: f(**a))
    under_jit = jitted(arrays)
    for value, how in ((got, "eager"), (under_jit, "jit")):
        for g, e in zip(value if isinstance(value, tuple) else (value,),
                        expected if isinstance(expected, tuple) else (expected,)):
            np.testing.assert_allclose(np.asarray(g), e, rtol=2e-4, atol=2e-4,
                                       err_msg=f"{how} result differs")
    hlo = hlo_collectives(jitted.lower(arrays).compile().as_text())
    counted = {}
    for kind, _ in hlo:
        counted[kind] = counted.get(kind, 0) + 1
    assert counted == kinds, f"HLO has {counted}, expected {kinds}"
    plan = f.plan(**arrays)
    assert sorted(hlo) == sorted(predicted(plan)), \
        f"HLO collectives {hlo} but the plan predicts {predicted(plan)}"
    return f, plan


def _np(*arrays):
    return [np.asarray(a, np.float64) for a in arrays]


# -- the checks -----------------------------------------------------------------------------
DIST = "D[i,j] := sum[k]((w[k,i] - x[k,j])**2)"


def _dist_inputs():
    rng = np.random.default_rng(1)
    w, x = _rand(rng, 16, 8), _rand(rng, 16, 12)
    nw, nx = _np(w, x)
    return dict(w=w, x=x), ((nw[:, :, None] - nx[:, None, :]) ** 2).sum(0)


@check
def dist_split_ij_no_collective():
    arrays, expected = _dist_inputs()
    _run(DIST, arrays, {"x": 4, "y": 2}, {"i": "x", "j": "y"}, expected, {})


@check
def dist_split_k_one_reduction():
    arrays, expected = _dist_inputs()
    _run(DIST, arrays, {"x": 4, "y": 2}, {"k": "x"}, expected, {"all-reduce": 1})


@check
def dist_split_k_over_both_axes():
    arrays, expected = _dist_inputs()
    _run(DIST, arrays, {"x": 4, "y": 2}, {"k": ("x", "y")}, expected, {"all-reduce": 1})


@check
def dist_split_k_and_j():
    arrays, expected = _dist_inputs()
    _run(DIST, arrays, {"x": 4, "y": 2}, {"k": "y", "j": "x"}, expected, {"all-reduce": 1})


@check
def dist_auto_and_default_by_name():
    arrays, expected = _dist_inputs()
    _run(DIST, arrays, {"x": 4, "y": 2}, "auto", expected, {})
    _, plan = _run(DIST, arrays, {"i": 2, "k": 4}, None, expected, {"all-reduce": 1})
    assert plan.assignment.as_dict == {"i": ("i",), "k": ("k",)}, plan.assignment


MLP = "h[b,f] := relu(sum[d](x[b,d]*W1[d,f])); y[b,o] := sum[f](h[b,f]*W2[f,o])"


def _mlp_inputs():
    rng = np.random.default_rng(2)
    x, w1, w2 = _rand(rng, 8, 16), _rand(rng, 16, 32), _rand(rng, 32, 12)
    nx, n1, n2 = _np(x, w1, w2)
    return dict(x=x, W1=w1, W2=w2), np.maximum(nx @ n1, 0) @ n2


@check
def mlp_hidden_split_one_all_reduce():
    arrays, expected = _mlp_inputs()
    _, plan = _run(MLP, arrays, {"x": 8}, {"f": "x"}, expected, {"all-reduce": 1})
    assert [m.tensor for m in plan.collectives] == ["y"]


@check
def mlp_on_a_jax_mesh_with_explicit_axes():
    arrays, expected = _mlp_inputs()
    mesh = jax.make_mesh((4, 2), ("model", "data"))     # Explicit axes by default
    _run(MLP, arrays, mesh, {"f": "model", "b": "data"}, expected, {"all-reduce": 1})
    from jax.sharding import NamedSharding, PartitionSpec
    placed = dict(arrays, x=jax.device_put(arrays["x"], NamedSharding(
        mesh, PartitionSpec("data", None))), W1=jax.device_put(arrays["W1"], NamedSharding(
            mesh, PartitionSpec(None, "model"))))
    _run(MLP, placed, mesh, {"f": "model", "b": "data"}, expected, {"all-reduce": 1})


PARTIAL = "t[b,o] := sum[f](h[b,f]*W2[f,o]); "


def _partial_inputs():
    rng = np.random.default_rng(3)
    h, w2, bias = _rand(rng, 8, 32), _rand(rng, 32, 12), _rand(rng, 12)
    nh, n2, nb = _np(h, w2, bias)
    return dict(h=h, W2=w2), nh @ n2, bias, nb


@check
def partial_sum_reduced_before_relu():
    arrays, t, _, _ = _partial_inputs()
    _, plan = _run(PARTIAL + "y[b,o] := relu(t[b,o])", arrays, {"x": 4}, {"f": "x"},
                   np.maximum(t, 0), {"all-reduce": 1})
    assert [m.tensor for m in plan.collectives] == ["t"]
    # the check can fail: relu of each device's partial sum, added up, is another value
    h, w2 = _np(arrays["h"], arrays["W2"])
    wrong = sum(np.maximum(h[:, 8 * d:8 * d + 8] @ w2[8 * d:8 * d + 8], 0) for d in range(4))
    assert np.abs(wrong - np.maximum(t, 0)).max() > 0.1


@check
def partial_sum_deferred_through_linear_statement():
    arrays, t, _, _ = _partial_inputs()
    _, plan = _run(PARTIAL + "y[b,o] := 2*t[b,o] - t[b,o]/4", arrays, {"x": 4}, {"f": "x"},
                   1.75 * t, {"all-reduce": 1})
    assert [m.tensor for m in plan.collectives] == ["y"]
    assert plan.statements[1].deferred == ("t",)


@check
def partial_sum_reduced_before_bias():
    arrays, t, bias, nb = _partial_inputs()
    _, plan = _run(PARTIAL + "y[b,o] := t[b,o] + bias[o]", dict(arrays, bias=bias),
                   {"x": 4}, {"f": "x"}, t + nb, {"all-reduce": 1})
    assert [m.tensor for m in plan.collectives] == ["t"]


@check
def partial_sum_reduce_scattered_for_a_split_reader():
    arrays, t, _, _ = _partial_inputs()
    _, plan = _run(PARTIAL + "y[b,l] := relu(t[b,l])", arrays, {"x": 4},
                   {"f": "x", "l": "x"}, np.maximum(t, 0), {"reduce-scatter": 1})
    assert plan.outputs[0][1].layout == ((), ("x",))


@check
def all_gather_when_a_reduction_is_not_outermost():
    rng = np.random.default_rng(4)
    a = _rand(rng, 8, 16)
    (na,) = _np(a)
    text = "h[b,f] := relu(A[b,f]); s[b] := log(sum[f](exp(h[b,f])))"
    expected = np.log(np.exp(np.maximum(na, 0)).sum(1))
    _, plan = _run(text, dict(A=a), {"x": 4}, {"f": "x"}, expected, {"all-gather": 1})
    assert plan.statements[1].notes, "the statement that runs f whole says why"


@check
def all_to_all_when_the_split_moves_to_another_axis():
    rng = np.random.default_rng(5)
    a = _rand(rng, 8, 16)
    (na,) = _np(a)
    text = "h[i,j] := exp(A[i,j]); y[p,q] := 2*h[p,q]"
    _run(text, dict(A=a), {"x": 4}, {"i": "x", "q": "x"}, 2 * np.exp(na),
         {"all-to-all": 1})


@check
def gather_and_slice_over_two_mesh_axes():
    rng = np.random.default_rng(9)
    a, vec, b = _rand(rng, 4, 16), _rand(rng, 16), _rand(rng, 16, 3)
    na, nv, nb = _np(a, vec, b)
    text = "h[r,f] := relu(A[r,f]); s[r] := log(sum[f](exp(h[r,f])))"
    _run(text, dict(A=a), {"x": 4, "y": 2}, {"f": ("x", "y")},
         np.log(np.exp(np.maximum(na, 0)).sum(1)), {"all-gather": 1})
    # t is computed whole on every device, then each keeps its block of p (no collective)
    _, plan = _run("t[i] := exp(v[i]); y[p,q] := t[p] * B[p,q]", dict(v=vec, B=b),
                   {"x": 4, "y": 2}, {"p": ("x", "y")}, np.exp(nv)[:, None] * nb, {})
    assert [m.kind.value for m in plan.steps if not hasattr(m, "split")] == ["local slice"]


@check
def max_over_a_split_index():
    rng = np.random.default_rng(6)
    a = _rand(rng, 8, 16)
    (na,) = _np(a)
    _, plan = _run("m[i] := max[j](X[i,j])", dict(X=a), {"x": 4, "y": 2},
                   {"j": "x", "i": "y"}, na.max(1), {"all-reduce": 1})
    assert plan.collectives[0].op == "max"


@check
def attention_heads_split_no_collective():
    rng = np.random.default_rng(7)
    q, k, v = _rand(rng, 2, 6, 4, 8), _rand(rng, 2, 6, 4, 8), _rand(rng, 2, 6, 4, 8)
    nq, nk, nv = _np(q, k, v)
    text = """S[b,h,t,s] := sum[r](Q[b,t,h,r]*K[b,s,h,r]) / 8
              m[b,h,t] := max[s](S[b,h,t,s])
              P[b,h,t,s] := exp(S[b,h,t,s] - m[b,h,t])
              O[b,t,h,r] := sum[s](P[b,h,t,s]*V[b,s,h,r]) / sum[s](P[b,h,t,s])"""
    scores = np.einsum("bthr,bshr->bhts", nq, nk) / 8
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    _run(text, dict(Q=q, K=k, V=v), {"heads": 4, "batch": 2},
         {"h": "heads", "b": "batch"}, np.einsum("bhts,bshr->bthr", weights, nv), {})


@check
def shifted_and_gathered_reads():
    rng = np.random.default_rng(8)
    x, ker = _rand(rng, 20), _rand(rng, 5)
    nx, nk = _np(x, ker)
    conv = np.array([(nx[i:i + 5] * nk).sum() for i in range(16)])
    f, plan = _run("y[i] := x[i+a] * ker[a]", dict(x=x, ker=ker), {"x": 4}, {"i": "x"},
                   conv, {})
    assert plan.statements[0].notes and not plan.statements[0].split.pairs
    table, idx = _rand(rng, 10, 8), jnp.asarray(np.array([3, 0, 9, 9, 1, 2, 5, 7]))
    _run("E[b,d] := W[idx[b], d]", dict(W=table, idx=idx), {"x": 4, "y": 2},
         {"b": "x", "d": "y"}, np.asarray(table)[np.asarray(idx)], {})


@check
def scalar_parameters_python_and_jax():
    arrays, expected = _dist_inputs()
    text = "D[i,j] := alpha * sum[k]((w[k,i] - x[k,j])**2)"
    _run(text, dict(arrays, alpha=0.5), {"x": 4}, {"k": "x"}, 0.5 * expected,
         {"all-reduce": 1})
    _run(text, dict(arrays, alpha=jnp.float32(2.0)), {"x": 4}, {"i": "x"},
         2 * expected, {})
    # two sums over the split k: partial results would divide each other, so k runs whole
    _, plan = _run("r[i] := sum[k](w[k,i]) / sum[k](w[k,i]**2)", dict(w=arrays["w"]),
                   {"x": 4}, {"k": "x"}, np.asarray(arrays["w"], np.float64).sum(0) /
                   (np.asarray(arrays["w"], np.float64) ** 2).sum(0), {})
    assert plan.statements[0].notes and not plan.statements[0].split.pairs


@check
def ein_one_shot_and_errors():
    arrays, expected = _dist_inputs()
    got = ef.ein(DIST, mesh={"x": 4}, shard={"k": "x"}, **arrays)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-4)
    for kwargs, words in (
            (dict(mesh={"x": 16}, shard={"k": "x"}), "needs 16 devices"),
            (dict(mesh={"x": 4}, shard={"k": "x"}, w=np.ones((16, 8), np.float32)),
             "runs on JAX arrays")):
        try:
            ef.ein(DIST, **{**arrays, **kwargs})
        except ef.EinfuseError as error:
            assert words in str(error), str(error)
        else:
            raise AssertionError(f"{kwargs} did not raise")


@check
def gradients_and_vmap_through_a_sharded_program():
    arrays, _ = _mlp_inputs()
    f = ef.compile(MLP, mesh={"x": 4}, shard={"f": "x"})

    def reference(w1, w2):
        return ((jnp.maximum(arrays["x"] @ w1, 0) @ w2) ** 2).sum()
    loss = lambda w1, w2: (f(x=arrays["x"], W1=w1, W2=w2) ** 2).sum()   # noqa: E731
    want = jax.grad(reference, argnums=(0, 1))(arrays["W1"], arrays["W2"])
    for how in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
        for g, w in zip(how(arrays["W1"], arrays["W2"]), want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-3)
    dist = ef.compile(DIST, mesh={"x": 4, "y": 2}, shard={"k": "x", "i": "y"})
    inputs, _ = _dist_inputs()
    got = jax.grad(lambda w: dist(w=w, x=inputs["x"]).sum())(inputs["w"])
    want = jax.grad(lambda w: ((w[:, :, None] - inputs["x"][:, None, :]) ** 2).sum())(
        inputs["w"])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
    batch = jnp.stack([arrays["x"], 2 * arrays["x"]])
    mapped = jax.vmap(lambda x: f(x=x, W1=arrays["W1"], W2=arrays["W2"]))(batch)
    for n in range(2):
        np.testing.assert_allclose(np.asarray(mapped[n]), np.asarray(
            jnp.maximum(batch[n] @ arrays["W1"], 0) @ arrays["W2"]), rtol=2e-4, atol=2e-4)


if __name__ == "__main__":
    from eight_devices import report
    report(CHECKS, _setup)
