"""The fused attention kernel and the row groups' kernels compiled for a GPU without
one (issue 36): Triton's own compiler, down to ptxas, for an sm_90 target, in a process
without TRITON_INTERPRET (the interpreter never compiles, so a construct that only the
compiler refuses -- a non-constexpr arange, a branch whose values disagree in type --
would pass every other test here).  Slow: each compile takes seconds."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend, rows as triton_rows

from program_texts import LAYERNORM, SOFTMAX

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not triton_backend.available(),
                                 reason="Triton is not installed")]

SCRIPT = textwrap.dedent("""
    import os, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from einfuse.backends.triton import attention, attention_kernel

    kernel = attention_kernel.attention_forward
    names = [p.name for p in kernel.params]
    dtype, mask, exact = sys.argv[1], int(sys.argv[2]), sys.argv[1] == "fp32"
    config = attention.choose_config("float32" if exact else "float16", 64, False)
    # (mask 1: a band with every kind of term the kernel takes; 0: plain scores)
    terms = dict(BANDED=mask != 0, TENSOR_TERMS=2 * mask, INDEX_TERMS=2 * mask,
                 X0_LOADS=mask != 0, X1_LOADS=False)
    constants = dict(DOT=64, FEATURES=64, BLOCK_D=64, BLOCK_E=64,
                     BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                     NORMALISED=True, STORE_LSE=mask != 0, EXACT=exact, UPCAST=False,
                     EXPONENT=attention_kernel.EXPONENT_BITS["float32" if exact else "float16"],
                     **terms)
    signature, attributes = {}, {}
    for number, name in enumerate(names):
        if name in ("Q", "K", "V", "O", "T0", "T1", "X0", "X1"):
            signature[name] = "*" + dtype
        elif name == "LSE":
            signature[name] = "*fp32"
        elif name == "FLAGS":
            signature[name] = "*i32"
        elif name == "score_scale" or name.endswith("_f"):
            signature[name] = "fp32"
        elif name.startswith("stride") and name[-1] in "de":
            signature[name] = "constexpr"      # (a unit stride: Triton's specialisation)
            constants[name] = 1
        elif name not in constants:
            signature[name] = "i32"
        else:
            signature[name] = "constexpr"
        if signature[name] not in ("constexpr", "fp32") and name not in ("lower", "upper"):
            attributes[(number,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attributes),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=config.warps, num_stages=config.stages))
    assert compiled.asm["cubin"] and ".entry attention_forward" in compiled.asm["ptx"]
    print("compiled")
""")


def _has_cuda_compiler() -> bool:
    try:
        import triton.backends.nvidia as nvidia
    except ImportError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(nvidia.__file__), "bin", "ptxas"))


def _compiled_elsewhere(script: str, args, tmp_path):
    """Run ``script`` in a process without TRITON_INTERPRET; its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")     # a compile, not a cached one
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(os.path.dirname(__file__)), "src")] +
        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    done = subprocess.run([sys.executable, "-c", script, *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.skipif(not _has_cuda_compiler(), reason="Triton's CUDA compiler is absent")
@pytest.mark.parametrize("dtype, mask", [("fp16", 1), ("fp32", 0)])
def test_attention_kernel_compiles_for_sm90(dtype, mask, tmp_path):
    assert "compiled" in _compiled_elsewhere(SCRIPT, (dtype, str(mask)), tmp_path)


ROWS_SCRIPT = textwrap.dedent("""
    import importlib.util, json, os, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    groups = json.load(open(sys.argv[1]))
    for number, group in enumerate(groups):
        path = os.path.join(os.path.dirname(sys.argv[1]), f"rows{number}.py")
        with open(path, "w") as handle:
            handle.write(group["source"])
        spec = importlib.util.spec_from_file_location(f"rows{number}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kernel = module.einfuse_rows
        signature, attributes = {}, {}
        for position, param in enumerate(kernel.params):
            name = param.name
            if name.startswith("t"):
                signature[name] = "*" + group["inputs"][int(name[1:])]
            elif name == "qv" or name.startswith("o"):
                signature[name] = "*" + group["working"]
            elif name == "part":
                signature[name] = "*fp64"
            elif name == "count":
                signature[name] = "*i32"
            elif name in ("M", "N") or name.startswith("s"):
                signature[name] = "i32"
            else:
                signature[name] = "constexpr"
            if signature[name].startswith("*"):
                attributes[(position,)] = [["tt.divisibility", 16]]
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=group["constants"],
                      attrs=attributes),
            target=GPUTarget("cuda", 90, 32), options=dict(num_warps=group["warps"]))
        assert ".entry einfuse_rows" in compiled.asm["ptx"]
        print("compiled", number)
""")
RMSNORM = ("ms[i] := sum[j](X[i,j] * X[i,j]) / 20\n"
           "y[i,j] := X[i,j] / sqrt(ms[i] + 1e-5) * g[j]")
CROSS_ENTROPY = ("m[i] := max[j](X[i,j])\n"
                 "z[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i]\n"
                 "loss[i] := z[i] - sum[j](T[i,j] * X[i,j])")


@pytest.mark.skipif(not _has_cuda_compiler(), reason="Triton's CUDA compiler is absent")
def test_row_group_kernels_compile_for_sm90(monkeypatch, tmp_path):
    """Every row group that the softmax, layernorm, RMSNorm and cross-entropy programs
    (and one with a scalar parameter) launch forward and backward, float32 and float64,
    column sums included: their kernels as a GPU would compile them."""
    groups, real = [], triton_rows.runner

    def kept(group, env):
        made = real(group, env)
        groups.append((group, made.dtypes))
        return made
    monkeypatch.setattr(triton_rows, "runner", kept)
    device = torch.device("cpu" if triton_backend.interpreted() else "cuda")
    rng = np.random.default_rng(0)
    for dtype in (torch.float32, torch.float64):
        def tensor(shape, grad=True):
            return torch.tensor(rng.standard_normal(shape), dtype=dtype,
                                device=device).requires_grad_(grad)
        X, g, b = tensor((9, 20)), tensor(20), tensor(20)
        T = torch.tensor(np.eye(20)[rng.integers(0, 20, 9)], dtype=dtype, device=device)
        for source, inputs in ((SOFTMAX, dict(X=X)),
                               (LAYERNORM.format(n=20), dict(X=X, g=g, b=b)),
                               (RMSNORM, dict(X=X, g=g)), (CROSS_ENTROPY, dict(X=X, T=T)),
                               (RMSNORM.replace("1e-5", "eps"), dict(X=X, g=g, eps=0.5))):
            ef.compile(source, backend="triton")(**inputs).sum().backward()
    names = {torch.float32: "fp32", torch.float64: "fp64"}
    found = {}
    for group, dtypes in groups:
        source = triton_rows.RowRenderer(group, True).render()
        found[source] = dict(
            source=source, inputs=[names[d] for d in dtypes],
            working={"float32": "fp32", "float64": "fp64"}[group.working],
            constants=dict(ROWS=group.launch.rows, BLOCK=group.launch.block,
                           PARTS=group.launch.parts), warps=group.launch.warps,
            columns=bool(group.columns))
    assert len(found) >= 10 and any(g["columns"] for g in found.values())
    listed = tmp_path / "groups.json"
    listed.write_text(json.dumps(list(found.values())))
    out = _compiled_elsewhere(ROWS_SCRIPT, (str(listed),), tmp_path)
    assert out.count("compiled") == len(found)
