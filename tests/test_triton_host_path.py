"""The Triton backend's host path per call (issue 36 item 3, backends/triton/launch.py):
a prepared launch keeps the compiled kernel that Triton's first launch returns and
launches it directly afterwards (no ``JITFunction.run`` binder per call); under
TRITON_INTERPRET=1, where no compiled kernel exists, every launch is the
interpreter's.  The GPU path's choices are checked with a fake JIT function and a fake
compiled kernel (no GPU here); the interpreter's on real statements and programs,
against NumPy and torch."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend, launch

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="Triton is not installed")
DEVICE = torch.device("cpu" if triton_backend.interpreted() else "cuda")


class _Param:
    def __init__(self, name):
        self.name = name


class FakeCompiled:
    """What Triton 3.x's launch returns on a GPU: ``run`` (the launcher), ``function``,
    ``packed_metadata`` and ``launch_metadata``."""
    function, packed_metadata = "fn-handle", "packed"

    def __init__(self):
        self.launches = []

    def launch_metadata(self, grid, stream, *args):
        return ("metadata", grid)

    def run(self, g0, g1, g2, stream, function, packed, metadata, enter, exit_, *args):
        self.launches.append(((g0, g1, g2), stream, function, packed, metadata, args))
        self.hooks = (enter, exit_)


class FakeJIT:
    """A @triton.jit function as the prepared launch sees it: ``params`` and
    ``kernel[grid](*args, **options)``, which returns ``compiled``."""

    def __init__(self, names, compiled):
        self.params = [_Param(n) for n in names]
        self.compiled = compiled
        self.binder_calls = []

    def __getitem__(self, grid):
        def bound(*args, **options):
            self.binder_calls.append((grid, args, options))
            return self.compiled
        return bound


@pytest.fixture
def streams(monkeypatch):
    """A stand-in for the driver's current-stream function: 'stream<device>'."""
    monkeypatch.setattr(launch, "stream_getter", lambda: lambda index: f"stream{index}")


def _tensor(offset=0):
    return torch.zeros(64, dtype=torch.float32)[offset:]


@pytest.mark.parametrize("hook", [False, True])
def test_a_compiled_kernel_is_launched_directly_after_the_first_call(streams, monkeypatch,
                                                                     hook):
    # Triton's launch hooks and launch metadata are passed as JITFunction.run passes
    # them; without an enter hook Triton's launch_metadata is None, and is not asked
    from triton import knobs
    enter = (lambda metadata: None) if hook else None
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", enter)
    compiled = FakeCompiled()
    kernel = FakeJIT(["x", "n", "scale", "out", "BLOCK", "RB"], compiled)
    prepared = launch.PreparedLaunch(kernel, (4, 2), {"num_warps": 4}, {"RB": 8, "BLOCK": 64},
                                     device_index=1)
    x, out = _tensor(), _tensor()
    prepared(x, 37, 0.5, out)
    assert len(kernel.binder_calls) == 1 and not compiled.launches and prepared.direct
    grid, args, options = kernel.binder_calls[0]
    assert grid == (4, 2) and args == (x, 37, 0.5, out)
    assert options == {"num_warps": 4, "RB": 8, "BLOCK": 64}
    for _ in range(3):
        prepared(x, 37, 0.5, out)
    assert len(kernel.binder_calls) == 1          # no binder per call
    assert len(compiled.launches) == 3
    dims, stream, function, packed, metadata, args = compiled.launches[-1]
    assert dims == (4, 2, 1) and stream == "stream1"
    assert (function, packed, metadata) == ("fn-handle", "packed",
                                            ("metadata", (4, 2)) if hook else None)
    assert compiled.hooks == (enter, knobs.runtime.launch_exit_hook)
    # the constexprs follow in the kernel's parameter order, as JITFunction.run passes them
    assert args == (x, 37, 0.5, out, 64, 8)


@pytest.mark.parametrize("change", ["misaligned pointer", "int becomes 1",
                                    "int becomes a multiple of 16", "int past int32",
                                    "another dtype"])
def test_another_specialisation_takes_tritons_launch(streams, change):
    compiled = FakeCompiled()
    kernel = FakeJIT(["x", "n", "out"], compiled)
    prepared = launch.PreparedLaunch(kernel, (1,), {}, {})
    x, out = _tensor(), _tensor()
    prepared(x, 37, out)
    prepared(x, 37, out)
    assert len(kernel.binder_calls) == 1 and len(compiled.launches) == 1
    changed = {"misaligned pointer": (_tensor(1), 37, out),
               "int becomes 1": (x, 1, out),
               "int becomes a multiple of 16": (x, 32, out),
               "int past int32": (x, 2 ** 31 + 1, out),
               "another dtype": (x.double(), 37, out)}[change]
    prepared(*changed)
    assert len(kernel.binder_calls) == 2 and len(compiled.launches) == 1
    prepared(x, 37, out)           # the first specialisation: direct again
    assert len(compiled.launches) == 2
    prepared(x, 41, out)           # another value of the same kind: direct
    assert len(compiled.launches) == 3


@pytest.mark.parametrize("returned", ["nothing (the interpreter)", "no run method",
                                      "unknown constexprs"])
def test_no_direct_path_without_a_compiled_kernel(streams, returned):
    compiled = None if returned.startswith("nothing") else FakeCompiled()
    if returned == "no run method":
        compiled = type("Old", (), {"function": 1, "packed_metadata": 2,
                                    "launch_metadata": lambda *a: None})()
    names = ["x", "out", "BLOCK"] if returned != "unknown constexprs" else \
        ["x", "out", "OTHER"]
    kernel = FakeJIT(names, compiled)
    prepared = launch.PreparedLaunch(kernel, (1,), {}, {"BLOCK": 64})
    for _ in range(3):
        prepared(_tensor(), _tensor())
    assert not prepared.direct and len(kernel.binder_calls) == 3


def test_no_gpu_driver_keeps_tritons_launch(monkeypatch):
    def no_driver():
        raise RuntimeError("0 active drivers")
    monkeypatch.setattr(launch, "stream_getter", no_driver)
    compiled = FakeCompiled()
    kernel = FakeJIT(["x"], compiled)
    prepared = launch.PreparedLaunch(kernel, (1,), {}, {})
    prepared(_tensor())
    prepared(_tensor())
    assert not prepared.direct and len(kernel.binder_calls) == 2 and not compiled.launches


def test_stubbed_launches_are_observed_and_not_run(streams):
    compiled = FakeCompiled()
    kernel = FakeJIT(["x"], compiled)
    prepared = launch.PreparedLaunch(kernel, (3,), {}, {})
    with launch.observed() as seen, launch.stubbed():
        prepared(_tensor())
        launch.launch_once(kernel, (2,), (_tensor(),), {})
    assert not kernel.binder_calls and not compiled.launches
    assert [r.grid for r in seen] == [(3,), (2,)]
    prepared(_tensor())                # outside: runs
    assert len(kernel.binder_calls) == 1


def test_the_interpreter_runs_each_repeated_call(monkeypatch):
    """Under the interpreter the prepared launch has no compiled kernel: each repeated
    call of a statement is one interpreted launch, with the right values."""
    if not triton_backend.interpreted():
        pytest.skip("checks the interpreter's path")
    rng = np.random.default_rng(3)
    kernel = ef.compile("y[i,j] := x[i,j] * a + 1.0", backend="triton")
    for call in range(3):
        x = rng.standard_normal((5, 7))
        with launch.observed() as seen:
            got = kernel(x=torch.from_numpy(x), a=0.25 * call)
        assert len(seen) == 1 and seen[0].kernel == "einfuse_kernel"
        np.testing.assert_allclose(got.numpy(), x * (0.25 * call) + 1.0, rtol=1e-15)
    ready = next(r for r in triton_backend._launches.values()
                 if r.prepared.total == 35 and r.prepared.params)
    assert not ready.launcher.direct


def test_row_group_parameters_are_kept_per_value():
    """A repeated row-group call with a scalar parameter reuses its device array for the
    same value and makes a new one for another (values against torch)."""
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((6, 9))).to(DEVICE)
    program = ef.compile("ms[i] := sum[j](X[i,j] * X[i,j]) / 9\n"
                         "y[i,j] := X[i,j] / sqrt(ms[i] + eps)", backend="triton")
    for eps in (1e-6, 1e-6, 0.5, -0.0, 0.0):
        with launch.observed() as seen:
            got = program(X=x, eps=eps)
        assert [r.kernel for r in seen] == ["einfuse_rows"]
        want = x / torch.sqrt((x * x).mean(1, keepdim=True) + eps)
        np.testing.assert_allclose(got.cpu().numpy(), want.cpu().numpy(), rtol=1e-12)


def test_recorded_program_repeated_with_a_differentiable_backward():
    """The Triton program node's repeated call (torch's C entry, the signature's node),
    then a backward with create_graph=True (the statements again, recorded): first and
    second derivatives against torch's softmax."""
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((4, 6))).to(DEVICE)
    seed = torch.from_numpy(np.random.default_rng(6).standard_normal((4, 6))).to(DEVICE)
    program = ef.compile("m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])\n"
                         "P[i,j] := e[i,j] / sum[k](e[i,k])", backend="triton")
    for _ in range(2):              # the first call makes the node, the second repeats it
        ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = program(X=ours)
        assert type(out.grad_fn).__name__ == "TritonProgramFunctionBackward"
        (grad,) = torch.autograd.grad(out, ours, seed, create_graph=True)
        (want,) = torch.autograd.grad(torch.softmax(theirs, 1), theirs, seed,
                                      create_graph=True)
        np.testing.assert_allclose(grad.detach().cpu().numpy(), want.detach().cpu().numpy(),
                                   rtol=1e-10, atol=1e-12)
        (second,) = torch.autograd.grad((grad * grad).sum(), ours)
        (second_want,) = torch.autograd.grad((want * want).sum(), theirs)
        np.testing.assert_allclose(second.cpu().numpy(), second_want.cpu().numpy(),
                                   rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("mode", ["grad on", "no_grad"])
def test_unrecorded_program_repeats_through_its_signature(mode):
    """A program call whose tensors need no gradient is remembered by its signature and
    repeated as its prepared run (one row-group launch a call): new values on every call,
    fresh outputs, a leaf that requires a gradient under no_grad computed alike, and a
    recorded call of the same program afterwards still a node (against torch)."""
    import contextlib
    rng = np.random.default_rng(7)
    program = ef.compile("m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])\n"
                         "P[i,j] := e[i,j] / sum[k](e[i,k])", backend="triton")
    context = torch.no_grad if mode == "no_grad" else contextlib.nullcontext
    results = []
    for call in range(4):
        x = torch.from_numpy(rng.standard_normal((5, 7))).to(DEVICE)
        if call == 3 and mode == "no_grad":
            x.requires_grad_()     # recorded nothing either: no_grad
        with context(), launch.observed() as seen:
            got = program(X=x)
        assert [r.kernel for r in seen] == ["einfuse_rows"]
        assert got.grad_fn is None
        np.testing.assert_allclose(got.detach().cpu().numpy(),
                                   torch.softmax(x.detach(), 1).cpu().numpy(), rtol=1e-12)
        assert all(got.data_ptr() != other.data_ptr() for other in results)
        results.append(got)
    leaf = torch.from_numpy(rng.standard_normal((5, 7))).to(DEVICE).requires_grad_()
    out = program(X=leaf)
    assert type(out.grad_fn).__name__ == "TritonProgramFunctionBackward"
    (grad,) = torch.autograd.grad(out, leaf, torch.ones_like(out))
    np.testing.assert_allclose(grad.cpu().numpy(), np.zeros((5, 7)), atol=1e-12)
