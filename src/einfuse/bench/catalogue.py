"""The benchmark's catalogue: every case ``einfuse bench`` runs, gathered from the
modules that define them (cases.py, frontend_cases.py, overhead_cases.py, jit_cases.py,
jit_call_cases.py, module_cases.py, epilogue_cases.py, jax_gather_cases.py, spellings.py, spelling_audit.py,
row_cases.py, conv_cases.py; gpu.py and gpu_programs.py for ``--device cuda``)."""

from __future__ import annotations

import dataclasses
from typing import List

from . import gpu
from .cases import (Case, attention_case, attention_training_case, bmm_rev_case, conv2d_case,
                    masked_attention_cases,
                    dist_case, embed_case, gauss_case, gauss_dist_case, installed, logsumexp_case, matmul_case,
                    small_training_cases, training_cases)
from .conv_cases import conv_cases
from .epilogue_cases import epilogue_cases
from .frontend_cases import frontend_cases
from .gpu_programs import program_cases
from .jax_gather_cases import gather_grad_cases
from .jit_call_cases import jit_call_cases
from .jit_cases import rnn_case, seed_case
from .module_cases import module_cases
from .row_cases import row_cases
from .overhead_cases import overhead_cases
from .spelling_audit import audit_cases
from .spellings import spelling_cases


def all_cases(quick: bool = False) -> List[Case]:
    """The issue's cases; ``quick`` shrinks every size (for a smoke run)."""
    jit = jit_cases(quick) if installed("jax") else []
    if quick:
        return [dist_case(64, 128, 128), gauss_case(2000), gauss_dist_case(64, 128, 128),
                matmul_case(256),
                bmm_rev_case(32, 8), conv2d_case(200, 7), embed_case(5000, 64, 2048),
                logsumexp_case(512), attention_case(1, 2, 128, 16)] + \
            (training_cases(quick=True) + [attention_training_case(1, 2, 128, 16)] +
             small_training_cases(quick=True) + module_cases(quick=True) +
             masked_attention_cases(1, 2, 128, 16) +
             epilogue_cases(quick=True) if installed("torch") else []) + \
            frontend_cases(quick=True) + overhead_cases() + spelling_cases(quick=True) + \
            row_cases(quick=True) + jit + (conv_cases(quick=True) if installed("torch") else [])
    return [dist_case(), fast_dist_case(), gauss_case(10**4), gauss_case(10**5),
            gauss_dist_case(), matmul_case(),
            bmm_rev_case(),
            conv2d_case(), embed_case(), logsumexp_case(), attention_case()] + training_cases() + \
        [attention_training_case()] + small_training_cases() + \
        (module_cases() + epilogue_cases() + masked_attention_cases()
         if installed("torch") else []) + frontend_cases() + \
        overhead_cases() + spelling_cases() + audit_cases() + row_cases() + jit + \
        (conv_cases() if installed("torch") else [])


def fast_dist_case() -> Case:
    """The squared distance with precision="fast" (norms and a matrix product)."""
    case = dist_case()
    return dataclasses.replace(case, name=case.name + " precision=fast",
                               options={"precision": "fast"})


def jit_cases(quick: bool = False) -> List[Case]:
    if quick:
        return [seed_case(500), seed_case(100, 8, chains=8), seed_case(200, kind="grad"),
                seed_case(100, 8, chains=8, kind="grad"),
                seed_case(100, 8, chains=8, dtype="float32")] + gather_grad_cases(quick=True)
    # the vmapped case at other chain counts, hidden sizes and float32 (issue 12's
    # hidden variants), and its gradient (jax.grad of the vmapped loss)
    return [seed_case(), seed_case(2000, 32, chains=256), seed_case(kind="grad"),
            seed_case(2000, 32, chains=256, kind="grad"),
            seed_case(2000, 16, chains=128), seed_case(2000, 32, chains=512),
            seed_case(2000, 32, chains=256, dtype="float32"),
            seed_case(500, 64, chains=1000),
            # rows that are not whole vectors, chains that leave a remainder block
            seed_case(3000, 24, chains=200), seed_case(3000, 20, chains=100, dtype="float32"),
            rnn_case(), rnn_case(kind="grad")] + jit_call_cases() + gather_grad_cases()


def gpu_cases(device: str = "cuda", quick: bool = False) -> List[gpu.GpuCase]:
    """Issue 5's GPU cases on ``device``, then programs and ef.jit (bench/gpu_programs.py);
    ``quick`` sizes are small enough for the Triton interpreter (a second or two per case
    on the CPU)."""
    dist_k, dist_n = (16, 64) if quick else (784, 4096)
    gauss_sizes = (64, 32) if quick else (10**5, 10**4)
    n = 64 if quick else 4096
    train_k, train_n = (16, 48) if quick else (784, 1536)
    return ([gpu.dist_case(device, dist_k, dist_n),
             gpu.gauss_case(device, gauss_sizes[0], target=True),
             gpu.gauss_case(device, gauss_sizes[1])]
            + [gpu.matmul_case(device, n, dtype) for dtype in ("float16", "bfloat16",
                                                           "float32")]
            + gpu.forward_cases(device, quick) + gpu.dist_training_cases(device, train_k, train_n)
            + program_cases(device, quick))
