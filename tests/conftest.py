"""Shared fixtures: every backend-parametrised test runs once per available backend,
so a failure names the backend that broke.  The Triton backend runs on the CPU under
TRITON_INTERPRET=1 (set here, before triton is imported), so CI checks the GPU code
path without a GPU."""

import os
import sys

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))  # lets tests import oracle.py, strategies.py

from einfuse.backends.c import build as c_build
from einfuse.backends.triton import backend as triton_backend  # noqa: E402

BACKENDS = ["numpy"] + (["c"] if c_build.find_compiler() is not None else []) + \
    (["triton"] if triton_backend.available() else [])


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow_on(*backends): slow (see the slow marker) on these backends only, "
        "e.g. slow_on('triton') for what the Triton interpreter takes long over")


def pytest_collection_modifyitems(config, items):
    """``slow_on(...)`` becomes ``slow`` for the tests whose backend parameter it names."""
    for item in items:
        marker = item.get_closest_marker("slow_on")
        params = getattr(getattr(item, "callspec", None), "params", {})
        if marker is not None and params.get("backend") in marker.args:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def jax_x64_restored():
    """JAX's x64 flag as each test found it: a test that turns it on and forgets to turn it
    off changed what later tests saw (one skipped, others ran in float64)."""
    jax = sys.modules.get("jax")
    before = jax.config.jax_enable_x64 if jax is not None else None
    yield
    if before is None:      # JAX imported during the test: its default is the environment's
        before = os.environ.get("JAX_ENABLE_X64", "").lower() in ("1", "true", "yes")
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", before)


@pytest.fixture
def x64():
    """JAX's x64 mode on for the test (jax_x64_restored turns it back)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)


@pytest.fixture
def bind_count(monkeypatch):
    """One entry per full binding of a call (runtime/kernel.bind_call): a repeated call
    on the fast path adds none."""
    from einfuse.runtime import kernel as kernel_module
    calls = []
    real = kernel_module.bind_call

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(kernel_module, "bind_call", counting)
    return calls


@pytest.fixture
def row_launches(monkeypatch):
    """The statements each Triton row-group launch ran (backends/triton/rows.py), one
    entry per launch."""
    from einfuse.backends.triton import rows as triton_rows
    count = []
    original = triton_rows.RowRunner.__call__

    def counted(self, env):
        count.append(self.group.statements)
        return original(self, env)
    monkeypatch.setattr(triton_rows.RowRunner, "__call__", counted)
    return count


# EINFUSE_TEST_CPU_LOG=FILE appends "<cpu seconds>\t<test id>" per test (this process's
# CPU time plus its finished children's, compilers included): on a shared, loaded
# machine it says where the suite's time goes when wall-clock durations cannot.
_CPU_LOG = os.environ.get("EINFUSE_TEST_CPU_LOG")
if _CPU_LOG:
    import resource
    import time as _time

    def _cpu_now():
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return _time.process_time() + children.ru_utime + children.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        start = _cpu_now()
        yield
        with open(_CPU_LOG, "a") as handle:
            handle.write(f"{_cpu_now() - start:.3f}\t{item.nodeid}\n")


@pytest.fixture
def row_patterns(monkeypatch):
    """The patterns of the C row kernels that ran in the test (backends/c/rows.py)."""
    from einfuse.backends.c import rows as c_rows
    seen = []
    call = c_rows._call

    def spy(group, *args):
        seen.append(group.pattern)
        return call(group, *args)
    monkeypatch.setattr(c_rows, "_call", spy)
    return seen


@pytest.fixture
def full_runs(monkeypatch):
    """The sizes of the groups the C backend's full fused path ran (a prepared run goes
    around it).  ef.compile of one text may give a program an earlier test prepared, so
    a test counts the groups fused after a call of its own, not from zero."""
    from einfuse.backends.c import fused as c_fused
    seen = []
    run = c_fused.run

    def spy(members, thread_rows=frozenset()):
        seen.append(len(members))
        return run(members, thread_rows)
    monkeypatch.setattr(c_fused, "run", spy)
    return seen


@pytest.fixture
def backward_calls(monkeypatch):
    """How many times the fused attention backward kernel ran (the C kernel
    counted where it is fetched: tests/test_attention*.py)."""
    from einfuse.backends.c import attention_grad as c_attention_grad
    calls = []
    original = c_attention_grad.backward_function

    def counting(dtype):
        function = original(dtype)

        def run(*args):
            calls.append(dtype)
            return function(*args)
        return run
    monkeypatch.setattr(c_attention_grad, "backward_function", counting)
    return calls


@pytest.fixture
def fused_calls(monkeypatch):
    """How many calls ran the fused attention: the C kernel or the NumPy key-block pass
    (tests/test_attention*.py, tests/test_dims_torchdim.py); each entry whether it
    gave the output (False: it declined the call)."""
    from einfuse.runtime import attention as attention_runtime
    from einfuse.runtime import attention_run
    calls = []
    for module, name in ((attention_run, "run_c"), (attention_runtime, "_run_numpy")):
        original = getattr(module, name)

        def counting(*args, _original=original):
            out = _original(*args)
            calls.append(out is not None)
            return out
        monkeypatch.setattr(module, name, counting)
    return calls


@pytest.fixture(scope="module")
def node():
    """The C++ autograd node (backends/c/torch_node.py), built or loaded: a failed build
    fails the test, it does not skip; skipped only where there is no C compiler."""
    from einfuse.backends.c import build as c_build, torch_node as c_torch_node
    if c_build.find_compiler() is None:
        pytest.skip("no C compiler: the C backend itself is unavailable")
    found = c_torch_node.module(wait=True)
    assert found is not None, c_torch_node.reason()
    return found
