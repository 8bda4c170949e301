"""Scheduling: which statements share a loop nest (fusion groups) and how a sequence of
statements runs by them."""

from .fusion import run_statements

__all__ = ["run_statements"]
