"""The NumPy reference backend: it interprets the syntax tree (backend.py); the
compiled backends fall back to it."""
