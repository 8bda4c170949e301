"""Shared fixtures: every backend-parametrised test runs once per available backend,
so a failure names the backend that broke."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # lets tests import oracle.py, strategies.py

BACKENDS = ["numpy"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param
