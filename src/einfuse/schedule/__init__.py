"""Scheduling: each kernel's route as a value (schedule.py, chosen by choose.py, with the
library kernels' registry in library.py), which statements share a loop nest (fusion
groups, row groups) and which backend runs a call (route.py).  It decides and returns
values; running them is the runtime's (runtime/kernel.py, runtime/run_groups.py)."""
