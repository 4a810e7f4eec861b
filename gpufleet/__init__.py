"""gpufleet: measures and improves how well a GPU fleet is used by machine-learning jobs.

This package is the thin command line (``gpufleet``) and the local broker runner; the
pipeline itself lives in ``producers``, ``streams``, ``sinks`` and ``schemas``.
"""
