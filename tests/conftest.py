"""Shared fixtures: every backend-parametrised test runs once per available backend,
so a failure names the backend that broke."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # lets tests import oracle.py, strategies.py

from einfuse.backends import c_build  # noqa: E402

BACKENDS = ["numpy"] + (["c"] if c_build.find_compiler() is not None else [])


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param
