"""Running what was compiled: binding a call, dispatching it to its kernel (Kernel),
running statement groups, gradients and the NumPy/PyTorch/JAX adapters
(docs/architecture.md)."""
