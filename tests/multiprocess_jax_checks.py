"""One process of a multi-process JAX job (test_sharding_multiprocess.py starts them):
``python multiprocess_jax_checks.py RANK PROCESSES PORT CHECK[,CHECK...]``.

Each process joins the job (``jax.distributed.initialize`` on 127.0.0.1, JAX's gloo CPU
collectives, 2 CPU devices per process from XLA_FLAGS set by the launcher), builds the
global input arrays from its own data with JAX's helpers, runs the sharded einfuse call
over a mesh of every process's devices, and compares each of its result shards with the
one-process result (the unsharded einfuse call on NumPy, and NumPy itself).  It prints one
JSON object: check name -> null when it passed, else what failed.  Importing this module
imports neither jax nor einfuse (test collection reads CHECKS)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

from check_reports import check_registry, failure_after, run_checks

# QUICK: the checks of the quick smoke test (the default test run)
CHECKS, QUICK, check = check_registry()
DEVICES_PER_PROCESS = 2


def _setup(rank, processes, port):
    global jax, jnp, ef, P, NamedSharding, sharding_checks
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=processes, process_id=rank,
                               initialization_timeout=120)
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    import einfuse as ef
    import sharding_checks          # its HLO reader and the plan's predicted collectives
    assert jax.process_count() == processes
    assert len(jax.local_devices()) == DEVICES_PER_PROCESS, jax.local_devices()


def _devices():
    return len(jax.devices())


def _global(value, mesh, spec):
    """A global jax.Array of ``value`` laid out as ``spec``, each process supplying
    only the blocks of its own devices."""
    return jax.make_array_from_callback(value.shape, NamedSharding(mesh, spec),
                                        lambda index: value[index])


def _compare_shards(result, expected, what):
    """Every shard of ``result`` this process holds equals that block of ``expected``."""
    assert not result.is_fully_addressable, f"{what}: the result is not a global array"
    assert result.shape == expected.shape, (what, result.shape, expected.shape)
    for shard in result.addressable_shards:
        np.testing.assert_allclose(np.asarray(shard.data), expected[shard.index],
                                   rtol=2e-4, atol=2e-4, err_msg=what)


def _run(text, host, mesh, shard, specs, expected, kinds, **options):
    """Run sharded on global arrays (eagerly and under jax.jit), compare with the
    one-process result, and check the compiled HLO's collectives against the plan:
    the kinds and counts ``kinds``, and each one's operand bytes."""
    one_process = ef.ein(text, **host, **options)
    if isinstance(one_process, tuple):
        one_process = one_process[-1]
    np.testing.assert_allclose(np.asarray(one_process), expected, rtol=2e-4, atol=2e-4,
                               err_msg="the one-process result differs from NumPy")
    jax_mesh = mesh if not isinstance(mesh, dict) else jax.make_mesh(
        tuple(mesh.values()), tuple(mesh))
    arrays = {name: _global(value, jax_mesh, specs.get(name, P()))
              for name, value in host.items()}
    f = ef.compile(text, mesh=mesh, shard=shard, **options)
    jitted = jax.jit(lambda a: f(**a))
    for value, how in ((f(**arrays), "eager"), (jitted(arrays), "jit")):
        value = value[-1] if isinstance(value, tuple) else value
        _compare_shards(value, np.asarray(one_process, np.float64), how)
    hlo = sharding_checks.hlo_collectives(jitted.lower(arrays).compile().as_text())
    counted = {}
    for kind, _ in hlo:
        counted[kind] = counted.get(kind, 0) + 1
    assert counted == kinds, f"HLO has {counted}, expected {kinds}"
    plan = f.plan(**arrays)
    predicted = sharding_checks.predicted(plan)
    assert sorted(hlo) == sorted(predicted), \
        f"HLO collectives {hlo} but the plan predicts {predicted}"
    # explain's collectives are the plan's
    explained = ef.explain(text, mesh=mesh, shard=shard, **arrays).collectives
    assert [(m.kind.value, m.operand_bytes) for m in explained] == predicted
    return f, plan, arrays


def _rng():
    return np.random.default_rng(11)      # the same data in every process


MLP = "h[b,f] := relu(sum[d](x[b,d]*W1[d,f])); y[b,o] := sum[f](h[b,f]*W2[f,o])"


def _mlp():
    rng, hidden = _rng(), 8 * _devices()
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32)
                 for s in ((8, 16), (16, hidden), (hidden, 12)))
    return dict(x=x, W1=w1, W2=w2), np.maximum(x.astype(np.float64) @ w1, 0) @ w2


DIST = "D[i,j] := sum[k]((w[k,i] - x[k,j])**2)"


def _dist():
    rng, n = _rng(), _devices()
    w, x = (rng.standard_normal(s).astype(np.float32) for s in ((4 * n, 2 * n), (4 * n, 6)))
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    return dict(w=w, x=x), ((w64[:, :, None] - x64[:, None, :]) ** 2).sum(0)


# -- the checks -----------------------------------------------------------------------------
@check(quick=True)
def mlp_hidden_split_one_all_reduce():
    host, expected = _mlp()
    mesh = jax.make_mesh((_devices(),), ("model",))
    _, plan, _ = _run(MLP, host, mesh, {"f": "model"},
                      {"W1": P(None, "model"), "W2": P("model", None)}, expected,
                      {"all-reduce": 1})
    assert [m.tensor for m in plan.collectives] == ["y"]


@check(quick=True)
def dist_split_over_k_across_processes():
    host, expected = _dist()
    mesh = jax.make_mesh((jax.process_count(), DEVICES_PER_PROCESS), ("x", "y"))
    _run(DIST, host, mesh, {"k": ("x", "y")}, {"w": P(("x", "y")), "x": P(("x", "y"))},
         expected, {"all-reduce": 1})


@check
def dist_split_over_i_and_j():
    host, expected = _dist()
    mesh = jax.make_mesh((jax.process_count(), DEVICES_PER_PROCESS), ("x", "y"))
    _run(DIST, host, mesh, {"i": "x", "j": "y"}, {"w": P(None, "x")}, expected, {})
    _, _, arrays = _run(DIST, host, mesh, {"k": "x", "j": "y"}, {}, expected,
                        {"all-reduce": 1})
    _compare_shards(ef.ein(DIST, mesh=mesh, shard={"k": "x", "j": "y"}, **arrays),
                    expected, "ef.ein with mesh=")


@check
def dict_mesh_and_host_callback_route():
    # a dict mesh takes every process's devices (jax.devices()); backend="numpy" runs
    # the statement as a host callback on each process's own devices
    host, expected = _dist()
    _run(DIST, host, {"x": _devices()}, {"k": "x"}, {}, expected, {"all-reduce": 1},
         backend="numpy")


@check
def attention_heads_split():
    rng, heads = _rng(), _devices()
    q, k, v = (rng.standard_normal((2, 6, heads, 8)).astype(np.float32) for _ in range(3))
    text = """S[b,h,t,s] := sum[r](Q[b,t,h,r]*K[b,s,h,r]) / 8
              m[b,h,t] := max[s](S[b,h,t,s])
              E[b,h,t,s] := exp(S[b,h,t,s] - m[b,h,t])
              O[b,t,h,r] := sum[s](E[b,h,t,s]*V[b,s,h,r]) / sum[s](E[b,h,t,s])"""
    nq, nk, nv = (a.astype(np.float64) for a in (q, k, v))
    scores = np.einsum("bthr,bshr->bhts", nq, nk) / 8
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    mesh = jax.make_mesh((heads,), ("heads",))
    spec = P(None, None, "heads", None)
    _run(text, dict(Q=q, K=k, V=v), mesh, {"h": "heads"}, dict(Q=spec, K=spec, V=spec),
         np.einsum("bhts,bshr->bthr", weights, nv), {})


@check
def program_gradient():
    host, _ = _mlp()
    # Auto axes: with jax.make_mesh's default Explicit axes, jax.grad of a sharded call
    # on arrays placed on that mesh fails in one process too (a cotangent's sharding
    # type; docs/sharding.md, Limits)
    from jax.sharding import AxisType
    mesh = jax.make_mesh((_devices(),), ("model",), axis_types=(AxisType.Auto,))
    f = ef.compile(MLP, mesh=mesh, shard={"f": "model"})
    x = _global(host["x"], mesh, P())
    w1 = _global(host["W1"], mesh, P(None, "model"))
    w2 = _global(host["W2"], mesh, P("model", None))
    grads = jax.jit(jax.grad(lambda a, b: (f(x=x, W1=a, W2=b) ** 2).sum(),
                             argnums=(0, 1)))(w1, w2)
    nx, n1, n2 = (host[n].astype(np.float64) for n in ("x", "W1", "W2"))
    pre = nx @ n1
    y = np.maximum(pre, 0) @ n2
    dy = 2 * y
    dh = (dy @ n2.T) * (pre > 0)
    for got, want, what in ((grads[0], nx.T @ dh, "dW1"),
                            (grads[1], np.maximum(pre, 0).T @ dy, "dW2")):
        _compare_shards(got, want, what)


@check
def batch_from_process_local_rows():
    # each process supplies only its own rows of x (jax.make_array_from_process_local_data)
    host, expected = _mlp()
    mesh = jax.make_mesh((jax.process_count(), DEVICES_PER_PROCESS), ("data", "model"))
    rows = host["x"].shape[0] // jax.process_count()
    mine = host["x"][jax.process_index() * rows:(jax.process_index() + 1) * rows]
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data", None)), mine,
                                               host["x"].shape)
    w1 = _global(host["W1"], mesh, P(None, "model"))
    w2 = _global(host["W2"], mesh, P("model", None))
    f = ef.compile(MLP, mesh=mesh, shard={"b": "data", "f": "model"})
    _compare_shards(f(x=x, W1=w1, W2=w2), expected, "process-local rows")


@check
def arrays_of_one_process_are_placed_or_refused():
    # process-local arrays (jnp.asarray): the same data on every process
    host, expected = _mlp()
    f = ef.compile(MLP, mesh={"model": _devices()}, shard={"f": "model"})
    try:
        result = f(**{n: jnp.asarray(v) for n, v in host.items()})
    except ef.EinfuseError as error:
        assert "make_array_from" in str(error), str(error)
    else:
        _compare_shards(result, expected, "process-local inputs")


@check
def kernel_error_on_a_device_is_an_einfuse_error():
    table = np.arange(8 * _devices(), dtype=np.float32).reshape(_devices() * 2, 4)
    idx = np.array([0, 1, 2, 99] * (_devices() // 2), dtype=np.int32)
    mesh = jax.make_mesh((_devices(),), ("x",))
    from einfuse.errors import OutOfBoundsError
    f = ef.compile("E[b,d] := W[idx[b], d]", mesh=mesh, shard={"b": "x"}, bounds="check")
    try:
        jax.block_until_ready(f(W=_global(table, mesh, P()), idx=_global(idx, mesh, P("x"))))
    except OutOfBoundsError as error:
        assert "idx" in str(error) and "99" in str(error), str(error)
    else:
        raise AssertionError("an index out of range gave no error")


@check
def inputs_with_no_elements():
    # computed whole (XLA does not compile a shard_map of empty operands), then placed
    mesh = jax.make_mesh((_devices(),), ("model",))
    host = dict(x=np.zeros((0, 16), np.float32), W1=np.ones((16, 8 * _devices()), np.float32),
                W2=np.ones((8 * _devices(), 12), np.float32))
    f = ef.compile(MLP, mesh=mesh, shard={"f": "model"})
    arrays = {n: _global(v, mesh, P()) for n, v in host.items()}
    result = f(**arrays)
    assert result.shape == (0, 12) and not result.is_fully_addressable, result


def killed_peer(rank, processes):
    """The last process dies while the others wait in a collective for it: they must
    raise an EinfuseError naming the cause, not hang."""
    host, expected = _mlp()
    mesh = jax.make_mesh((_devices(),), ("model",))
    f = ef.compile(MLP, mesh=mesh, shard={"f": "model"})
    arrays = dict(x=_global(host["x"], mesh, P()),
                  W1=_global(host["W1"], mesh, P(None, "model")),
                  W2=_global(host["W2"], mesh, P("model", None)))
    _compare_shards(f(**arrays), expected, "before the kill")   # everyone compiled it
    if rank == processes - 1:
        time.sleep(1.0)                 # the others are in the all-reduce by now
        os.kill(os.getpid(), signal.SIGKILL)
    return failure_after(lambda: jax.block_until_ready(f(**arrays)), ef.EinfuseError)


def main():
    rank, processes, port = (int(a) for a in sys.argv[1:4])
    names = sys.argv[4].split(",")
    _setup(rank, processes, port)
    if names == ["killed_peer"]:
        print(json.dumps({"killed_peer": killed_peer(rank, processes)}), flush=True)
        os._exit(0)       # a peer is dead: JAX's shutdown barrier would wait for it
    results = run_checks({name: CHECKS[name] for name in names})
    print(json.dumps(results), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
