"""The C/OpenMP backend: rendering the loop IR as C (render.py), building and caching
shared libraries (build.py), running statements (backend.py), fused groups, row kernels,
BLAS routes, ef.jit loops and the hand-written C library kernels."""
