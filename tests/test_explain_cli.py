"""explain's content, the einfuse command, and the README's examples."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import einfuse as ef
from einfuse.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_explain_matmul_with_arrays():
    A, B = np.ones((100, 50), np.float32), np.ones((50, 30), np.float32)
    report = ef.explain("C[i,j] := A[i,k] * B[k,j]", A=A, B=B)
    text = str(report)
    assert "the sum over k of A[i, k] * B[k, j]" in text
    assert re.search(r"k\s+reduced \(sum\)\s+50\s+0\.\.49\s+A axis 1", text)
    assert "for k in 0..49:   # sum" in text and "for i in 0..99:   # parallel" in text
    assert report.flops == 2 * 100 * 30 * 50
    assert report.bytes_read == A.nbytes + B.nbytes
    assert report.bytes_written == 100 * 30 * 4
    # a matmul builds no broadcast product in eager NumPy/PyTorch: none is claimed
    assert not report.naive_intermediate_bytes and "naive broadcast" not in text
    assert report.arithmetic_intensity == pytest.approx(report.flops / (A.nbytes + B.nbytes
                                                                          + 12000))


def test_explain_without_shapes_and_with_shapes():
    symbolic = str(ef.explain("y[i] := x[i+a] * ker[a]"))
    assert "per call" in symbolic and "pass arrays or shapes=" in symbolic
    shaped = ef.explain("y[i] := x[i+a] * ker[a]", shapes={"x": (100,), "ker": (7,)})
    assert "0..93" in str(shaped) and "x axis 0 (i + a)" in str(shaped)


def test_explain_nested_loops_and_gather_words():
    text = str(ef.explain("o[i] := sum[j](exp(-sum[d]((x[i,d]-y[j,d])**2)) * b[j])",
                          shapes={"x": (10, 3), "y": (20, 3), "b": (20,)}))
    assert "acc2 += (x[i, d] - y[j, d])**2" in text
    assert "acc1 += exp(-acc2) * b[j]" in text
    gather = str(ef.explain("E[b,d] := W[idx[b], d]", bounds="wrap",
                            shapes={"W": (50, 4), "idx": (8,)}))
    assert "W is gathered" in gather and "bounds='wrap'" in gather


def test_explain_reports_errors_like_ein():
    with pytest.raises(ef.EinfuseError, match="index k: A gives 50"):
        ef.explain("C[i,j] := A[i,k]*B[k,j]", shapes={"A": (100, 50), "B": (40, 30)})
    with pytest.raises(ef.EinfuseError, match="not a tensor"):
        ef.explain("C[i,j] := A[i,k]*B[k,j]", shapes={"Q": (1,)})


def test_cli_explain(capsys):
    assert main(["explain", "C[i,j] := A[i,k]*B[k,j]", "--shape", "A=100x50",
                 "--shape", "B=50x30"]) == 0
    out = capsys.readouterr().out
    assert "FLOPs                 300,000" in out
    assert main(["explain", "y[i] := x[i+a]*k[a]", "--shape", "x=10", "--range", "i=3",
                 "--shape", "k=3"]) == 0
    assert "ranges=" in capsys.readouterr().out


def test_cli_errors_are_messages_not_tracebacks(capsys):
    assert main(["explain", "C[i,j] := A[i,k]*B[k,j]", "--shape", "A=100x50",
                 "--shape", "B=40x30"]) == 1
    err = capsys.readouterr().err
    assert "ShapeError" in err and "^^^^^^" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["explain", "C[i] := A[i]", "--shape", "A=ten"])


def test_console_script_runs():
    done = subprocess.run([sys.executable, "-m", "einfuse.cli", "explain", "s := x[i]",
                           "--shape", "x=4"], capture_output=True, text=True)
    assert done.returncode == 0 and "the sum over i of x[i]" in done.stdout


def test_readme_python_example_prints_what_it_says():
    readme = open(os.path.join(ROOT, "README.md")).read()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    scope = {}
    exec(code, scope)
    assert "`y` is `[-2. -2. -2. -2. -2. -2. -2. -2.]`" in readme
    np.testing.assert_array_equal(scope["y"], np.full(8, -2.0))
    np.testing.assert_array_equal(scope["E"], np.eye(4)[[3, 0]])


@pytest.mark.parametrize("statement", ["C[i,j] := A[i,k] * B[k,j]",
                                       "E[b,d] := W[idx[b], d]"])
def test_readme_explain_blocks_are_current(statement, tmp_path):
    readme = open(os.path.join(ROOT, "README.md")).read()
    block = re.search(r'\$ einfuse explain "' + re.escape(statement) + r'" (.*?)\n(.*?)```',
                      readme, re.S)
    args = block.group(1).split()
    # a fresh cache, as the README shows it: explain says whether a first call compiles
    done = subprocess.run([sys.executable, "-m", "einfuse.cli", "explain", statement, *args],
                          capture_output=True, text=True,
                          env=dict(os.environ, EINFUSE_CACHE_DIR=str(tmp_path)))
    assert done.stdout.strip() == block.group(2).strip()


def test_explain_shows_the_compiled_kernel_on_the_c_backend():
    from einfuse.backends.c import build as c_build
    if c_build.find_compiler() is None:
        pytest.skip("no C compiler")
    shapes = {"w": (784, 64), "x": (784, 48)}
    report = ef.explain("D[i,j] := (w[k,i] - x[k,j])**2", backend="c", shapes=shapes)
    text = str(report)
    assert "Compiled kernel (pseudo-code)" in text
    assert "# registers" in text and "SIMD lanes" in text and "threads (OpenMP)" in text
    assert "for k in 0..783:" in text and "D[i0 + row, j0 + lane]" in text
    reference = ef.explain("D[i,j] := (w[k,i] - x[k,j])**2", backend="numpy", shapes=shapes)
    assert reference.compiled_loop_nest is None
    blas = ef.explain("C[i,j] := A[i,k]*B[k,j]", backend="c",
                      shapes={"A": (8, 4), "B": (4, 2)})
    assert blas.compiled_loop_nest is None and "BLAS" in blas.strategy


def test_explain_lists_gradients_and_their_plans(capsys):
    report = ef.explain("y[i] := x[i+a] * ker[a]", gradients=True,
                        shapes={"x": (100,), "ker": (7,)})
    text = str(report)
    assert "Gradients (each statement its own kernel)" in text
    assert "dx[j] := dy[j - a] * ker[a]   [gather]" in text
    assert "dker[a] := dy[i] * x[i + a]   [gather]" in text
    assert main(["explain", "E[b,d] := W[idx[b], d]", "--gradients",
                 "--shape", "W=50x4", "--shape", "idx=8"]) == 0
    out = capsys.readouterr().out
    assert "dW[idx[b], d] += dE[b, d]   [scatter]" in out and "scatter-add" in out
    no_gradient = str(ef.explain("C[i] := A[i] * B[i]", gradients=True))
    assert "dA[i] := dC[i] * B[i]" in no_gradient


def test_readme_gradient_examples_print_what_they_say():
    readme = open(os.path.join(ROOT, "README.md")).read()
    pairs = re.findall(r">>> (.*?)(?:   #.*)?\n(.*?)\n", readme)
    assert len(pairs) >= 2
    for expression, shown in pairs:
        assert repr(eval(expression, {"ef": ef})) == shown


def test_explain_with_shapes_keeps_the_scalar_parameters_passed():
    """shapes= fills in placeholder arrays; a scalar the caller passed is not replaced
    by a placeholder (its dtype decides the result's)."""
    text = str(ef.explain("y[i] := x[i] * alpha", shapes={"x": (4,)}, alpha=np.float64(3)))
    assert "result dtype float64" in text


def test_version_and_cache_commands(tmp_path, monkeypatch, capsys):
    import einfuse
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == \
        f"einfuse {einfuse.__version__}"
    monkeypatch.setenv("EINFUSE_CACHE_DIR", str(tmp_path))
    (tmp_path / "abc.so").write_bytes(b"x" * 1000)
    (tmp_path / "einfuse_triton_abc.py").write_text("pass")
    assert main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert f"location  {tmp_path}" in info and "C libraries     1" in info and \
        "Triton kernels  1" in info
    assert main(["cache", "clear"]) == 0
    assert "removed 2 files" in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_bench_plot_without_matplotlib_stops_before_running(monkeypatch, capsys):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["bench", "--quick", "--plot"]) == 1
    assert "matplotlib" in capsys.readouterr().err


def test_bench_case_that_matches_nothing_lists_the_cases(capsys):
    assert main(["bench", "--quick", "--case", "nothing"]) == 1
    err = capsys.readouterr().err
    assert "the cases are:" in err and "dist" in err


def test_the_demo_runs():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo.py")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "einfuse: first call" in done.stdout and "[1. 1. 1.]" in done.stdout


def test_generated_source_is_visible_and_is_what_runs():
    """kernel.source() is the C the backend compiles (it builds and has the kernel);
    explain(source=True) shows it; Triton's is Python; the reference says it has none."""
    from einfuse.backends.c import build as c_build
    if c_build.find_compiler() is None:
        pytest.skip("no C compiler")
    kernel = ef.compile("D[i,j] := (w[k,i] - x[k,j])**2", backend="c")
    arrays = {"w": np.ones((3, 5), np.float32), "x": np.ones((3, 4), np.float32)}
    library = c_build.load(kernel.source(**arrays))
    assert hasattr(library, "einfuse_kernel")
    text = str(ef.explain("D[i,j] := (w[k,i] - x[k,j])**2", backend="c", source=True,
                          shapes={"w": (3, 5), "x": (3, 4)}))
    assert "Generated source" in text
    triton = ef.compile("y[i] := x[i] * 2", backend="triton").source(x=np.ones(4))
    compile(triton, "<triton>", "exec")
    assert "no generated source" in ef.compile("y[i] := x[i]", backend="numpy").source(
        x=np.ones(2))
    hoisted = ef.compile("P[i,j] := exp(X[i,j] - max[k](X[i,k]))", backend="c").source(
        X=np.ones((4, 8)))
    assert hoisted.count("=== ") == 2      # the hoisted maximum, then the statement


def test_source_named_tensor_goes_in_arrays():
    with pytest.raises(ef.EinfuseError, match="arrays="):
        ef.explain("y[i] := source[i] * 2", source=np.ones(3))
    text = str(ef.explain("y[i] := source[i] * 2", arrays={"source": np.ones(3)}))
    assert "y[i] := source[i] * 2" in text


def test_explain_says_whether_the_first_call_compiles(tmp_path, monkeypatch):
    from einfuse.backends.c import build as c_build
    if c_build.find_compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("EINFUSE_CACHE_DIR", str(tmp_path))      # nothing built yet
    statement = "y[i] := sum[j](exp(X[i,j] * 1.0625)) + 0.375"
    X = np.ones((3, 7))
    assert any("first call with these shapes compiles" in note
               for note in ef.explain(statement, X=X, backend="c").notes)
    ef.ein(statement, X=X, backend="c")
    assert any("is built (in the cache)" in note
               for note in ef.explain(statement, X=X, backend="c").notes)


def test_missing_window_extents_are_advised_as_one_flag_each(capsys):
    """A pooling window with no extent: the command line's advice names a --range flag
    for every missing window index, not only the first."""
    assert main(["explain", "y[b,c,i,j] := max[p,q](x[b,c,2*i+p,2*j+q])",
                 "--shape", "x=1x1x8x8"]) != 0
    err = capsys.readouterr().err
    assert "--range p=3" in err and "--range q=3" in err, err
    assert "ranges=" not in err
    # the flags it advises work
    assert main(["explain", "y[b,c,i,j] := max[p,q](x[b,c,2*i+p,2*j+q])",
                 "--shape", "x=1x1x8x8", "--range", "p=3", "--range", "q=3"]) == 0
    assert "y[b, c, i, j] := max[p, q]" in capsys.readouterr().out
