"""Rewrites of statements and programs that compute the same result with less work."""

from .hoist import Hoisted, hoist

__all__ = ["Hoisted", "hoist"]
