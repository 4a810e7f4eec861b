"""gpufleet: measures and improves how well a GPU fleet is used by machine-learning jobs.

This package is the command line (``gpufleet``, a module per group in ``commands``), the local
tools it runs (``local``: the Kafka runner and its certificates), what the report commands
print (``reports``), the owners' web service (``web``) and the demo; the pipeline itself lives
in ``producers``, ``streams``, ``sinks`` and ``schemas``.
"""
