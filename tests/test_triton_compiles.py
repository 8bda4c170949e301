"""The fused attention kernel compiled for a GPU without one (issue 36): Triton's own
compiler, down to ptxas, for an sm_90 target, in a process without TRITON_INTERPRET
(the interpreter never compiles, so a construct that only the compiler refuses -- a
non-constexpr arange, a branch whose values disagree in type -- would pass every other
test here).  Slow: each compile takes seconds."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")
pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import os, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from einfuse.backends.triton import attention

    kernel = attention._attention_forward
    names = [p.name for p in kernel.params]
    dtype, mask, exact = sys.argv[1], int(sys.argv[2]), sys.argv[1] == "fp32"
    config = attention.choose_config("float32" if exact else "float16", 64, False)
    constants = dict(DOT=64, FEATURES=64, BLOCK_D=64, BLOCK_E=64,
                     BLOCK_M=config.block_m, BLOCK_N=config.block_n, MASK=mask,
                     NORMALISED=True, EXACT=exact, UPCAST=False)
    signature, attributes = {}, {}
    for number, name in enumerate(names):
        if name in ("Q", "K", "V", "O"):
            signature[name] = "*" + dtype
        elif name == "score_scale":
            signature[name] = "fp32"
        elif name.startswith("stride") and name[-1] in "de":
            signature[name] = "constexpr"      # (a unit stride: Triton's specialisation)
            constants[name] = 1
        elif name.startswith("stride") or name in ("rows", "keys"):
            signature[name] = "i32"
        else:
            signature[name] = "constexpr"
        if signature[name] != "constexpr" and name != "score_scale":
            attributes[(number,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attributes),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=config.warps, num_stages=config.stages))
    assert compiled.asm["cubin"] and ".entry _attention_forward" in compiled.asm["ptx"]
    print("compiled")
""")


def _has_cuda_compiler() -> bool:
    try:
        import triton.backends.nvidia as nvidia
    except ImportError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(nvidia.__file__), "bin", "ptxas"))


@pytest.mark.skipif(not _has_cuda_compiler(), reason="Triton's CUDA compiler is absent")
@pytest.mark.parametrize("dtype, mask", [("fp16", 1), ("fp32", 0)])
def test_attention_kernel_compiles_for_sm90(dtype, mask, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)       # a compile, not a cached one
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(os.path.dirname(__file__)), "src")] +
        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    done = subprocess.run([sys.executable, "-c", SCRIPT, dtype, str(mask)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
