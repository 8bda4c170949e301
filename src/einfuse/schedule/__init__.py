"""Scheduling: which statements share a loop nest (fusion groups, row groups) and
which backend runs a call (route.py).  It decides and returns values; running them is
runtime/run_groups.py's."""
