"""The Triton backend: rendering the loop IR as Triton (render.py), launching and
tuning kernels (backend.py, tuning.py), row groups, repeats and the FlashAttention kernel."""
