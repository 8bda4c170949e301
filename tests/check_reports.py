"""What the checks run in subprocesses (eight_devices.py, the multi-process jobs) report:
each check by name, None when it passed, else the error and its traceback; and a
surviving peer's outcome of a call made after another process died."""

import time
import traceback


def check_registry():
    """A registry of named checks for one subprocess script: (checks by name, the names
    of the quick ones the default test run starts, the decorator ``@check`` or
    ``@check(quick=True)`` that registers a function under its name)."""
    checks, quick_names = {}, []

    def check(function=None, *, quick=False):
        def register(f):
            checks[f.__name__] = f
            if quick:
                quick_names.append(f.__name__)
            return f
        return register(function) if function is not None else register
    return checks, quick_names, check


def run_checks(checks: dict, names=None) -> dict:
    """``checks`` (name -> function), those in ``names`` when given, run one by one."""
    results = {}
    for name, function in checks.items():
        if names and name not in names:
            continue
        try:
            function()
            results[name] = None
        except Exception as problem:   # reported per check by the pytest side
            results[name] = f"{type(problem).__name__}: {problem}\n{traceback.format_exc()}"
    return results


def failure_after(call, einfuse_error) -> dict:
    """``call()``'s outcome: the error's type and message (an ``einfuse_error`` whole,
    anything else cut to 3000 characters) and the seconds it took, or no error."""
    start = time.monotonic()
    try:
        call()
    except einfuse_error as error:
        return {"error": type(error).__name__, "message": str(error),
                "seconds": time.monotonic() - start}
    except Exception as error:      # reported: the test fails on it
        return {"error": type(error).__name__, "message": str(error)[:3000],
                "seconds": time.monotonic() - start}
    return {"error": None}
