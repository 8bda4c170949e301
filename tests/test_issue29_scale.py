"""Issue 29, items 2, 3, 3a, 3b: size is never a raw exception, a hang or a runaway
compiler.

* 2: programs of thousands of statements compile in time linear in their length, on
  every path (the attention recogniser, program checks, fusion groups, gradients);
* 3: ``ef.jit`` of a long straight-line chain of operations;
* 3a: nested reductions are linear in code and time; every compiler process runs under
  a memory and CPU-time limit and dies with its caller;
* 3b: an intermediate larger than memory is an AllocationError on every backend; a
  fault in the kernel cache (a directory in the way, a damaged record) recovers or says
  which path."""

import os
import shlex
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import einfuse as ef
from einfuse import errors
from einfuse.backends.c import backend as c_backend, build as c_build
from einfuse.backends import disk_cache

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
HAVE_C = c_build.find_compiler() is not None
needs_c = pytest.mark.skipif(not HAVE_C, reason="no C compiler with OpenMP")


def chain(length: int, step: str = "{prev}[i] + 1", name: str = "t") -> str:
    """``t1[i] := x[i] * 2`` then ``t<k>[i] := <step>`` for k = 2..length."""
    lines = [f"{name}1[i] := x[i] * 2"]
    lines += [f"{name}{k}[i] := " + step.format(prev=f"{name}{k - 1}")
              for k in range(2, length + 1)]
    return "\n".join(lines)


def python_calls(fn) -> int:
    """The Python function calls ``fn()`` makes (a count of work, not a timing)."""
    count = [0]

    def profile(frame, event, arg):
        if event == "call":
            count[0] += 1
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0]


# -- 2: long programs ----------------------------------------------------------------------

def test_a_chain_of_2000_statements_runs():
    x = np.arange(4.0)
    got = ef.ein(chain(2000), x=x, backend="numpy")
    np.testing.assert_array_equal(got, x * 2 + 1999)


def test_compiling_a_chain_is_linear_in_its_length():
    # a fresh program (new names) each time: nothing cached from the other
    x = np.arange(3.0)
    short = python_calls(lambda: ef.ein(chain(200, name="a"), x=x, backend="numpy"))
    long = python_calls(lambda: ef.ein(chain(400, name="b"), x=x, backend="numpy"))
    assert long < 2.6 * short, (short, long)


def test_the_attention_recogniser_inlines_within_a_bound(monkeypatch):
    # each intermediate read twice: inlining the program doubled the expression per
    # statement (2**40 nodes), where no attention can be
    from einfuse.lang.ast import expression_size
    from einfuse.rewrite import online_softmax
    biggest = [0]
    real = online_softmax.rename_indices

    def measured(expr, names):
        found = real(expr, names)
        biggest[0] = max(biggest[0], expression_size(found)[0])
        return found
    monkeypatch.setattr(online_softmax, "rename_indices", measured)
    text = chain(40, "{prev}[i] * 0.5 + {prev}[i] * 0.5", name="h")
    x = np.linspace(0, 1, 5)
    np.testing.assert_allclose(ef.ein(text, x=x, backend="numpy"), x * 2)
    assert biggest[0] <= online_softmax.INLINED_NODES


@needs_c
def test_a_long_chain_on_the_c_backend_shares_its_kernels(tmp_path, monkeypatch):
    """Fusion groups hold at most MAX_GROUP_STATEMENTS statements, so a long regular
    chain compiles a few kernels, not one per length (or one huge one)."""
    from einfuse.schedule import fusion
    monkeypatch.setenv("EINFUSE_CACHE_DIR", str(tmp_path))
    c_build.clear_memory_cache()
    before = c_build.compile_count
    x = np.arange(float(fusion.MIN_FUSED_ELEMENTS))
    got = ef.ein(chain(8 * fusion.MAX_GROUP_STATEMENTS), x=x, backend="c")
    np.testing.assert_array_equal(got, x * 2 + 8 * fusion.MAX_GROUP_STATEMENTS - 1)
    assert c_build.compile_count - before <= 4
    c_build.clear_memory_cache()


def test_gradients_of_a_long_chain_torch():
    torch = pytest.importorskip("torch")
    n = 400      # folding the backward into one gather made it 400 deep: RecursionError
    x = torch.linspace(0.5, 1.5, 6, dtype=torch.float64, requires_grad=True)
    w = torch.full((6,), 1.001, dtype=torch.float64)
    ef.ein(chain(n, "{prev}[i] * w[i]"), x=x, w=w).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * 1.001 ** (n - 1))


def test_a_gradient_of_many_contributions_is_a_shallow_sum():
    """w is read by every statement: its gradient adds 399 contributions, which one
    chain of '+' made a statement too deep to analyse."""
    torch = pytest.importorskip("torch")
    n = 400
    x = torch.linspace(0.5, 1.5, 3, dtype=torch.float64)
    w = torch.full((3,), 0.5, dtype=torch.float64, requires_grad=True)
    ef.ein(chain(n, "{prev}[i] + w[i]"), x=x, w=w).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), n - 1)


def test_sums_of_many_terms_are_built_shallow():
    from einfuse.lang.ast import SUM_CHAIN, Access, expression_size, sum_tree
    terms = [Access(f"a{k}", ()) for k in range(5000)]
    nodes, depth = expression_size(sum_tree(terms))
    assert nodes == 2 * len(terms) - 1 and depth < SUM_CHAIN + 16
    few = sum_tree(terms[:3])            # as few terms as ever: ((a0 + a1) + a2)
    assert few.left.left == terms[0] and few.left.right == terms[1] and few.right == terms[2]


def test_gradients_of_a_long_chain_jax():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    n = 400
    text = chain(n, "{prev}[i] * w[i]")
    w = jnp.full((6,), 1.001, dtype=jnp.float32)
    grad = jax.grad(lambda x: ef.ein(text, x=x, w=w).sum())(jnp.linspace(0.5, 1.5, 6))
    np.testing.assert_allclose(np.asarray(grad), 2 * 1.001 ** (n - 1), rtol=1e-4)


def test_the_backward_fold_looks_at_each_step_a_bounded_number_of_times(monkeypatch):
    """autodiff/backward_fold.py: a rescan of every step after each fold made a long
    program's backward quadratic."""
    torch = pytest.importorskip("torch")
    from einfuse.runtime import backward_fold
    looked = []
    real = backward_fold._inputs
    monkeypatch.setattr(backward_fold, "_inputs", lambda step: looked.append(1) or real(step))

    def backward(n, name):
        looked.clear()
        x = torch.linspace(0.5, 1.5, 4, dtype=torch.float64, requires_grad=True)
        ef.ein(chain(n, "sin({prev}[i])", name=name), x=x).sum().backward()
        return len(looked)
    short, long = backward(60, "p"), backward(120, "q")
    assert 0 < short and long < 2.6 * short, (short, long)


# -- 3: ef.jit of long chains ----------------------------------------------------------------

@pytest.fixture
def x64():
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


@needs_c
def test_jit_of_a_chain_of_700_tanh(x64):
    import jax.numpy as jnp

    def f(x):
        for _ in range(700):
            x = jnp.tanh(x)
        return x
    x = np.linspace(-2, 2, 64).astype(np.float64)
    want = x.copy()
    for _ in range(700):
        want = np.tanh(want)
    np.testing.assert_allclose(np.asarray(ef.jit(f)(x)), want, rtol=1e-12)


@needs_c
def test_jit_gradient_of_a_long_chain(x64):
    import jax
    import jax.numpy as jnp
    n = 650

    def f(x):
        for _ in range(n):
            x = jnp.sin(x)
        return jnp.sum(x)
    x = np.linspace(-1, 1, 16)
    want, value = np.ones_like(x), x.copy()
    for _ in range(n):
        want, value = want * np.cos(value), np.sin(value)
    np.testing.assert_allclose(np.asarray(ef.jit(jax.grad(f))(x)), want, rtol=1e-10,
                               atol=1e-300)


@needs_c
def test_jit_of_many_materialised_steps_is_split_into_functions():
    """Each ``%`` of an int is read twice (rem, then its sign fix): 2 steps an iteration,
    past backends/c/loops_parts.PART_THRESHOLD; the parts compute what one function did."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from einfuse.backends.c import loops_parts as c_loops_parts

    iterations = c_loops_parts.PART_THRESHOLD
    def f(x):
        for _ in range(iterations):
            x = (x * 3 + 1) % 1000
        return x
    x = np.arange(-50, 50, dtype=np.int32)
    want = x.astype(np.int64)
    for _ in range(iterations):
        want = (want * 3 + 1) % 1000
    np.testing.assert_array_equal(np.asarray(ef.jit(f)(x)), want)


# -- 3a: nested reductions -------------------------------------------------------------------

def nested(depth: int) -> str:
    """``s := sum[a0](x[a0] * sum[a1](x[a1] * ... sum[a<depth-1>](x[a<depth-1>])))``."""
    body = f"x[a{depth - 1}]"
    for k in range(depth - 2, -1, -1):
        body = f"x[a{k}] * sum[a{k + 1}]({body})"
    return f"s := sum[a0]({body})"


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_deeply_nested_reductions_take_linear_time(backend, dtype):
    if backend == "triton":
        pytest.skip("the Triton backend takes torch tensors")
    x = np.array([1, 1, 0], dtype=dtype)          # each sum is 2: s = 2**depth
    assert ef.ein(nested(40), x=x, backend=backend) == 2 ** 40


@needs_c
def test_generated_code_is_linear_in_the_nesting():
    # int32 statements are not hoisted: every level is lowered in the kernel itself,
    # whose tiled loops wrote their body twice per level (2**(depth/2) copies)
    x = np.array([1, 1, 0], dtype=np.int32)
    size = {d: len(ef.compile(nested(d), backend="c").source(x=x)) for d in (6, 12)}
    assert size[12] < 2.5 * size[6], size
    assert ef.ein(nested(12), x=x, backend="c") == 2 ** 12


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty kernel cache, with every in-process memo of libraries cleared."""
    directory = tmp_path / "cache"
    directory.mkdir()
    monkeypatch.setenv("EINFUSE_CACHE_DIR", str(directory))
    monkeypatch.setattr(c_backend, "_kernels", {})
    monkeypatch.setattr(disk_cache, "_warned_dirs", set())
    monkeypatch.setattr(disk_cache, "_fallback", [])
    c_build.clear_memory_cache()
    yield directory
    c_build.clear_memory_cache()


@needs_c
def test_a_compile_past_its_memory_limit_is_an_einfuse_error(cache, monkeypatch):
    monkeypatch.setenv("EINFUSE_COMPILE_MEMORY_MB", "8")
    with pytest.raises(c_build.CompileLimitError, match="EINFUSE_COMPILE_MEMORY_MB") as info:
        c_build.load("int einfuse_tiny_limit(void) { return 1; }\n")
    assert isinstance(info.value, errors.EinfuseError)
    assert not [n for n in os.listdir(cache) if n.endswith(".so")]


@needs_c
def test_the_compile_time_limit_comes_from_the_environment(cache, tmp_path, monkeypatch):
    spinning = tmp_path / "spinning-cc"
    spinning.write_text("#!/bin/sh\nwhile :; do :; done\n")
    spinning.chmod(0o755)
    monkeypatch.setattr(c_build, "_compiler", ((str(spinning),), "spinning"))
    monkeypatch.setattr(c_build, "_probed", True)
    monkeypatch.setenv("EINFUSE_COMPILE_TIMEOUT", "1")
    started = time.monotonic()
    with pytest.raises(c_build.CompileLimitError, match="EINFUSE_COMPILE_TIMEOUT"):
        c_build.load("int einfuse_spun(void) { return 1; }\n")
    assert time.monotonic() - started < 30


def test_a_bad_limit_setting_is_an_einfuse_error(cache, monkeypatch):
    monkeypatch.setenv("EINFUSE_COMPILE_MEMORY_MB", "lots")
    with pytest.raises(errors.EinfuseError, match="EINFUSE_COMPILE_MEMORY_MB='lots'"):
        c_build.run_compiler(["true"], str(cache), 10)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")     # a zombie is dead, waiting for a reaper


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_compile_dies_with_its_caller(tmp_path):
    """The caller is killed outright mid-compile: the compiler and what it started (cc1
    in a real compile) are gone within seconds."""
    state = tmp_path / "state"
    state.mkdir()
    fake = tmp_path / "slow-cc"
    fake.write_text(f"#!/bin/sh\necho $$ > {shlex.quote(str(state))}/cc.pid\n"
                    "sleep 120 </dev/null >/dev/null 2>&1 &\n"
                    f"echo $! > {shlex.quote(str(state))}/helper.pid\nwait\n")
    fake.chmod(0o755)
    code = ("from einfuse.backends.c import build as c_build\n"
            f"c_build._compiler, c_build._probed = (({str(fake)!r},), 'slow'), True\n"
            "c_build.load('int einfuse_orphaned(void) { return 0; }\\n')\n")
    env = dict(os.environ, EINFUSE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    caller = subprocess.Popen([sys.executable, "-c", code], env=env)
    pids = []
    try:
        deadline = time.monotonic() + 60
        while not (state / "helper.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int((state / name).read_text()) for name in ("cc.pid", "helper.pid")]
        caller.kill()
        caller.wait()
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids), "the compile outlived its caller"
    finally:
        caller.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, 9)


# -- 3b: too large for memory; cache faults --------------------------------------------------

PROGRAM = "t[i,j] := x[i] * y[j]\nu[i,j] := t[i,j] + 1\ns[i] := sum[j](u[i,j])"


def test_an_intermediate_larger_than_memory_is_an_allocation_error(backend):
    if backend == "triton":
        pytest.skip("the Triton backend takes torch tensors")
    x = np.ones(3_200_000)            # t: 3.2e6 x 3.2e6 float64, 82 TB
    with pytest.raises(errors.AllocationError, match="the result t has shape"):
        ef.ein(PROGRAM, x=x, y=x, backend=backend)


def test_an_intermediate_larger_than_memory_is_an_allocation_error_torch():
    torch = pytest.importorskip("torch")
    x = torch.ones(3_200_000, dtype=torch.float64, requires_grad=True)
    with pytest.raises(errors.AllocationError, match="the result t has shape"):
        ef.ein(PROGRAM, x=x, y=x)


@needs_c
def test_an_intermediate_of_a_group_past_memory_is_refused(monkeypatch):
    # the machine is said to have 64 kB: the fused group's intermediate (640 kB) is the
    # statement's AllocationError, checked before the group allocates it (as NumPy's
    # MemoryError, where it does not fit)
    from einfuse.analysis import result_size
    from einfuse.schedule import fusion
    monkeypatch.setattr(result_size, "_physical_memory", lambda: 1 << 16)
    y = np.ones(fusion.MIN_FUSED_ELEMENTS)         # enough work to be worth fusing
    with pytest.raises(errors.AllocationError, match="larger than this machine's memory"):
        ef.ein(PROGRAM, x=np.ones(20), y=y, backend="c")


@needs_c
@pytest.mark.parametrize("where", [".so", ".so.sha256"])
def test_a_directory_where_a_cached_library_goes(cache, where):
    source = f"int einfuse_in_the_way(void) {{ return 7; }} /* {where} */\n"
    key = c_build.library_key(source, c_build.flags_for(False))
    blocked = cache / (key + where)
    blocked.mkdir()
    (blocked / "kept").write_text("not einfuse's")
    with pytest.warns(errors.EinfuseWarning, match=str(blocked)):
        assert c_build.load(source).einfuse_in_the_way() == 7
    assert (blocked / "kept").read_text() == "not einfuse's"
    c_build.clear_memory_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # said once per path
        assert c_build.load(source).einfuse_in_the_way() == 7


@needs_c
def test_a_directory_where_the_jit_library_goes(cache):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    def f(x):
        return jnp.sin(x) * 3 + 1
    x = np.linspace(0, 1, 8).astype(np.float32)
    want = np.asarray(ef.jit(f)(x))
    libraries = [n for n in os.listdir(cache) if n.endswith(".so")]
    assert libraries
    for name in libraries:          # every library it built now has a directory there
        os.unlink(cache / name)
        os.unlink(cache / (name + ".sha256"))
        (cache / name).mkdir()
    c_build.clear_memory_cache()
    with pytest.warns(errors.EinfuseWarning, match="cannot be written"):
        got = np.asarray(ef.jit(lambda x: jnp.sin(x) * 3 + 1)(x))
    np.testing.assert_array_equal(got, want)


@needs_c
@pytest.mark.parametrize("record", [b"[1, 2]", b"\xff\xfe", b'{"ok": "yes"}'])
def test_a_damaged_compiler_probe_record_is_probed_again(cache, monkeypatch, record):
    command, fingerprint = c_build.find_compiler()
    monkeypatch.setattr(c_build, "_probed", False)
    monkeypatch.setattr(c_build, "_compiler", None)
    monkeypatch.setenv("CC", " ".join(command))
    c_build.find_compiler()                      # writes its record into this cache
    records = [n for n in os.listdir(cache) if n.startswith("compiler-")]
    assert records
    (cache / records[0]).write_bytes(record)
    monkeypatch.setattr(c_build, "_probed", False)
    assert c_build.find_compiler() is not None
