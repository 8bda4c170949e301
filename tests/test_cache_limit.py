"""The bounded kernel cache: past EINFUSE_CACHE_MAX_MB the least recently used C
libraries (with their build records) are removed; recent ones and everything in use
stay."""

import os
import time

import numpy as np

from einfuse.backends import cache_limit


def fake_library(directory, name, size, age):
    path = os.path.join(directory, name + ".so")
    with open(path, "wb") as handle:
        handle.write(b"\0" * size)
    with open(path + ".sha256", "w") as handle:
        handle.write(f"{size} 00")
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_oldest_libraries_go_first_until_below_the_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("EINFUSE_CACHE_MAX_MB", "0.01")          # 10 kB
    paths = [fake_library(str(tmp_path), f"k{n}", 3000, age=1000 - n * 100)
             for n in range(5)]                                 # k0 the oldest
    removed = cache_limit.enforce(str(tmp_path))
    kept = [os.path.exists(p) for p in paths]
    assert kept == [False, False, False, True, True]      # 15 kB down to at most 8 kB
    assert removed > 0
    assert not os.path.exists(paths[0] + ".sha256")


def test_recently_used_libraries_are_spared(tmp_path, monkeypatch):
    monkeypatch.setenv("EINFUSE_CACHE_MAX_MB", "0.001")
    recent = fake_library(str(tmp_path), "new", 5000, age=1)
    old = fake_library(str(tmp_path), "old", 5000, age=3600)
    cache_limit.enforce(str(tmp_path))
    assert os.path.exists(recent) and not os.path.exists(old)


def test_no_limit_and_a_bad_value(tmp_path, monkeypatch):
    path = fake_library(str(tmp_path), "k", 5000, age=3600)
    monkeypatch.setenv("EINFUSE_CACHE_MAX_MB", "0")
    assert cache_limit.enforce(str(tmp_path)) == 0 and os.path.exists(path)
    monkeypatch.setenv("EINFUSE_CACHE_MAX_MB", "lots")
    assert cache_limit.limit_bytes() == cache_limit.DEFAULT_LIMIT_MB * 10**6


def test_a_loaded_kernel_keeps_running_when_the_cache_evicts_it(tmp_path, monkeypatch):
    """Eviction after a build never breaks a kernel already loaded."""
    import einfuse as ef
    from einfuse.backends.c import build as c_build
    monkeypatch.setenv("EINFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache_limit, "RECENT_SECONDS", -1.0)
    monkeypatch.setenv("EINFUSE_CACHE_MAX_MB", "0.000001")
    c_build.clear_memory_cache()
    x = np.arange(5.0)
    kernel = ef.compile("y[i] := x[i] * 3 + 0.25", backend="c")
    np.testing.assert_allclose(kernel(x=x), x * 3 + 0.25)
    np.testing.assert_allclose(ef.ein("z[i] := x[i] - 7.5", x=x, backend="c"), x - 7.5)
    np.testing.assert_allclose(kernel(x=x + 1), (x + 1) * 3 + 0.25)
    c_build.clear_memory_cache()
