"""A run that lacks a backend or a framework must say so by failing: the backend fixture
(conftest.py) drops what is not installed, which would otherwise leave whole backends
untested in silence.  ``EINFUSE_TEST_ALLOW_MISSING=triton,jax`` names what a developer's
run may lack on purpose."""

import importlib
import os

import pytest

from einfuse.backends.c import build as c_build
from einfuse.backends.triton import backend as triton_backend

ALLOWED_MISSING = {name.strip() for name in
                   os.environ.get("EINFUSE_TEST_ALLOW_MISSING", "").split(",") if name.strip()}


def present(name):
    if name == "c":
        return c_build.find_compiler() is not None
    if name == "triton":
        return triton_backend.available()
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", ["c", "triton", "torch", "jax", "einops", "hypothesis",
                                  "equinox", "flax"])
def test_the_run_has(name):
    if name in ALLOWED_MISSING:
        pytest.skip(f"EINFUSE_TEST_ALLOW_MISSING names {name}")
    assert present(name), (f"{name} is missing: its tests would be skipped in silence; "
                           f"install the project's extras (README) or set "
                           f"EINFUSE_TEST_ALLOW_MISSING={name}")
