"""The OpenMP wait policy einfuse's kernels run with: passive unless the user chose one
(backends/c_build.py, docs/backends.md "Threads").  Checked in fresh processes, since
libgomp reads the policy once, when the first kernel loads it."""

import os
import subprocess
import sys

import pytest

from einfuse.backends import c_build

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")

# Runs a threaded kernel, then asks libgomp for the settings it runs with.
SCRIPT = r"""
import ctypes, ctypes.util, os, sys
import numpy as np
import einfuse as ef
A = np.random.rand(512, 512)
y = ef.ein("y[i] := sum[j](exp(A[i,j]))", A=A, backend="c")
assert np.allclose(y, np.exp(A).sum(1))
print("ENV", os.environ.get("OMP_WAIT_POLICY"), flush=True)
ctypes.CDLL("libgomp.so.1").omp_display_env(1)   # verbose: spin count too
"""


def run(environment):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(environment)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_kernels_wait_passively_and_leave_the_environment_as_it_was():
    out, err = run({})
    assert "ENV None" in out
    # libgomp's default spins 300000 times before sleeping; passive never spins
    assert "GOMP_SPINCOUNT = '0'" in err


def test_the_user_s_policy_wins():
    out, err = run({"OMP_WAIT_POLICY": "active"})
    assert "ENV active" in out
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in err and "GOMP_SPINCOUNT = '0'" not in err
