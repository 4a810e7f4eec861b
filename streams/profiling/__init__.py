"""Profiling: which running workflows to profile (periodically and when their GPUs go
underused), what an automatic profile says about the alert that caused it, and how a
profile compares with the workflow's previous one."""
