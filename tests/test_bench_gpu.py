"""The GPU bench (``einfuse bench --device cuda``) without a GPU: its cases are built for
the CPU device and einfuse runs them with the Triton backend under TRITON_INTERPRET=1
(conftest sets it), at the --quick sizes.  What is checked is what the GPU run relies
on: einfuse's results agree with the peers', the agreement check can fail, the command
refuses cleanly where there is no CUDA, and the report carries every row and target."""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

import torch  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.bench import catalogue, gpu  # noqa: E402
from einfuse.bench.runner import Measurement, PeerUnavailable, agreement, host  # noqa: E402
from einfuse.cli import main  # noqa: E402

CASES = catalogue.gpu_cases("cpu", quick=True)
CUBLAS = "torch.matmul (cuBLAS)"
# eager torch formulations, on the same device and dtype as einfuse: the references
EAGER = ("torch eager", CUBLAS, "torch einsum", "torch conv2d", "torch embedding",
         "torch logsumexp", "torch SDPA")


def test_quick_cases_cover_the_issue():
    names = [case.name for case in CASES]
    for prefix in ("dist K=", "gauss", "matmul", "bmm_rev", "conv2d", "embed", "logsumexp",
                   "dist fwd K=", "dist fwd+bwd", "attention", "causal attention",
                   "softmax program", "softmax statement", "layernorm program",
                   "fwd+bwd softmax program", "fwd+bwd layernorm program"):
        assert any(name.startswith(prefix) for name in names), prefix
    assert {case.dtype for case in CASES if case.name.startswith("matmul")} == \
        {"float16", "bfloat16", "float32"}
    assert len([c for c in CASES if c.target is not None]) == 8
    full = [case.name for case in catalogue.gpu_cases("cuda", quick=False)]
    for prefix in ("attention B=4 H=8 N=4096 D=64 float16", "causal attention B=4",
                   "ef.jit seed MLP scan 8000 steps"):
        assert any(name.startswith(prefix) for name in full), prefix


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_einfuse_on_triton_agrees_with_eager_torch(case):
    """einfuse (Triton, interpreted) against every eager torch peer of the case and the
    NumPy reference backend on the same (dtype-rounded) inputs.  bfloat16 is included:
    the interpreted kernel converts it to float32 in registers, no bfloat16 tl.dot."""
    arrays = case.inputs(np.random.default_rng(0))
    ours = host(case.einfuse_call(arrays, "triton")())
    peers = [peer for peer in case.peers if peer.name in EAGER and peer.skip_reason is None]
    assert peers, "every case has an eager torch peer to agree with"
    for peer in peers:
        assert agreement(ours, peer.make(arrays)(), case.tolerance) == "", peer.name
    rounded = {name: host(tensor) for name, tensor in
               gpu.to_torch(arrays, "cpu", case.dtype).items()}
    forward = ours[0] if isinstance(ours, list) else ours
    reference = ef.ein(case.statement, backend="numpy", **rounded)
    assert agreement(forward, reference, case.tolerance) == ""


def test_training_case_returns_the_gradients_that_are_checked():
    case = next(c for c in CASES if c.name.startswith("dist fwd+bwd"))
    arrays = case.inputs(np.random.default_rng(0))
    out, dw, dx = host(case.einfuse_call(arrays, "triton")())
    w, x = arrays["w"], arrays["x"]
    difference = w[:, :, None] - x[:, None, :]
    np.testing.assert_allclose(dw, 2 * difference.sum(2), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dx, -2 * difference.sum(1), rtol=1e-4, atol=1e-3)
    assert out.shape == (w.shape[1], x.shape[1])


def test_agreement_reports_differences():
    reference = np.arange(1.0, 7.0).reshape(2, 3)
    assert agreement(reference, torch.tensor(reference).reshape(6), 1e-3) == ""
    wrong = reference.copy()
    wrong[1, 2] += 0.1
    assert "differs from einfuse by 1.7e-02" in agreement(reference, wrong, 1e-3)
    assert agreement(reference, wrong, 3e-2) == ""
    assert "shape" in agreement(reference, np.ones(5), 1e-3)
    assert "differs" in agreement(reference, np.full((2, 3), np.nan), 1e-3)
    assert "returns 1 values" in agreement([reference, reference], reference, 1e-3)
    half = torch.tensor(reference, dtype=torch.bfloat16)   # NumPy has no bfloat16
    assert agreement(reference, half, 3e-2) == ""
    assert "shape (1, 3)" in agreement(reference, half[:1], 3e-2)
    assert agreement(reference, np.array(list("abcdef")), 1e-3).startswith(
        "could not compare: ")


def test_run_gpu_case_times_with_synchronisation_and_notes_failures(monkeypatch):
    def without_gpu(arrays):
        raise PeerUnavailable("no GPU build here")
    matmul = next(c for c in CASES if c.name == "matmul 64^3 float32")
    case = gpu.GpuCase(matmul.name, matmul.statement, matmul.inputs, matmul.peers + [
        gpu.Peer("broken", lambda arrays: (lambda: 1 / 0), "torch"),
        gpu.Peer("no gpu", without_gpu, "torch"),
        gpu.Peer("absent", None, "no_such_module_for_einfuse")],
        einfuse_call=matmul.einfuse_call)
    synced, released = [], []
    monkeypatch.setattr(gpu, "synchronizer", lambda device: lambda: synced.append(device))
    monkeypatch.setattr(gpu, "_release", released.append)
    results = gpu.run_gpu_case(case, "cpu", budget_s=0.01, progress=lambda m: None)
    notes = {m.implementation: (m.median_s, m.note) for m in results}
    assert notes["einfuse"][0] > 0 and notes[CUBLAS][0] > 0
    assert notes[CUBLAS][1] == ""
    assert notes["broken"] == (None, "failed: ZeroDivisionError: division by zero")
    assert notes["no gpu"] == (None, "no GPU build here")
    assert notes["absent"] == (None, "no_such_module_for_einfuse not installed")
    assert len(synced) >= 8   # every timed call of einfuse and of the peer
    assert len(synced) == sum(m.runs + 1 for m in results if m.median_s is not None)
    assert released == ["cpu"] * 4   # after einfuse and after each peer that was tried


def test_targets_are_evaluated_from_the_medians():
    by_name = {case.name: case for case in CASES}
    dist, half = by_name["dist K=16 N=M=64"], by_name["matmul 64^3 float16"]
    forward = next(c for c in CASES if c.name.startswith("dist fwd K="))
    training = next(c for c in CASES if c.name.startswith("dist fwd+bwd"))
    results = [Measurement(dist.name, "einfuse", 1.0),
               Measurement(dist.name, "torch.compile", 3.0),
               Measurement(half.name, "einfuse", 1.5), Measurement(half.name, CUBLAS, 1.0),
               Measurement(forward.name, "einfuse", 1.0),
               Measurement(training.name, "einfuse", 5.0)]
    lines = gpu.target_lines([dist, half, forward, training], results)
    assert lines == [f"{dist.name}: torch.compile time / einfuse time >= 2: 3.00 (met)",
                     f"{half.name}: einfuse time / {CUBLAS} time <= 1.2: 1.50 (NOT met)",
                     f"{training.name}: einfuse backward / einfuse forward <= 3: 4.00 "
                     "(NOT met)"]


def test_cli_device_cuda_refuses_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--device", "cuda", "--quick"]) == 1
    message = capsys.readouterr().err
    assert "--device cuda" in message and "torch.cuda.is_available() is False" in message


def test_cli_device_cuda_refuses_under_the_interpreter(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert main(["bench", "--device", "cuda"]) == 1
    assert "TRITON_INTERPRET=1" in capsys.readouterr().err


def test_cli_device_cuda_writes_the_table_and_targets(monkeypatch, tmp_path, capsys):
    """The command's own path, with the device swapped for the CPU (the only thing a
    machine without a GPU cannot do is the CUDA part)."""
    cases_for, run_on = catalogue.gpu_cases, gpu.run_gpu_case
    monkeypatch.setattr(gpu, "cuda_problem", lambda: None)
    monkeypatch.setattr(catalogue, "gpu_cases", lambda device, quick: cases_for("cpu", quick))
    monkeypatch.setattr(gpu, "run_gpu_case", lambda case, device, *rest, **options:
                        run_on(case, "cpu", *rest, progress=lambda m: None, **options))
    monkeypatch.setattr(gpu, "machine_line", lambda: "GPU: test double")
    assert main(["bench", "--device", "cuda", "--quick", "--case", "matmul", "--peer",
                 "torch.matmul", "--backend", "triton", "--budget", "0.01", "--out",
                 str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    markdown = (tmp_path / "gpu.md").read_text()
    for dtype in ("float16", "bfloat16", "float32"):
        assert f"| matmul 64^3 {dtype} | einfuse |" in markdown
        assert f"| matmul 64^3 {dtype} | {CUBLAS} |" in markdown
        assert f"matmul 64^3 {dtype}" in printed
    assert markdown.startswith("# einfuse bench --device cuda --quick")
    assert "GPU: test double" in markdown and "einfuse backend triton" in markdown
    assert "## Targets" in markdown and "(cuBLAS) time <= 1.2: " in markdown
    assert "differs" not in markdown


def test_first_triton_launches_are_reported_beside_the_first_call():
    from einfuse.bench.report import rows
    from einfuse.bench.runner import Measurement
    table = rows([Measurement("c", "einfuse", 1e-3, 5, 2.0, compiled=0, first_launches=2),
                  Measurement("d", "einfuse", 1e-3, 5, 0.1, compiled=0)])
    assert "first launch of 2 Triton kernels" in table[1][4]
    assert "kernels from the cache" in table[2][4]


def test_device_time_notes_reach_the_report():
    """What the device's own time per call is (the profiler's kernels, on a GPU) is noted
    for einfuse and the torch peers, not for jax's (two profilers in one process)."""
    from einfuse.bench.report import rows
    from einfuse.bench.runner import run_case
    case = next(c for c in CASES if c.name.startswith("dist K="))
    measured = []

    def device_time(fn):
        measured.append(fn)
        return "GPU busy 1.0 µs per call in 1 kernels/copies"
    results = run_case(case, "triton", ["torch eager", "jax"], 0.01, lambda m: None,
                       device_time=device_time)
    noted = {r[1]: r[4] for r in rows(results)[1:]}
    assert noted["einfuse"].startswith("first call ")
    assert noted["einfuse"].endswith("; GPU busy 1.0 µs per call in 1 kernels/copies")
    assert noted["torch eager"].endswith("GPU busy 1.0 µs per call in 1 kernels/copies")
    assert "GPU busy" not in noted.get("jax.jit", "")
    assert len(measured) == 2
    assert "unavailable" in gpu.kernel_time(lambda: None) or \
        "no GPU work" in gpu.kernel_time(lambda: None)
