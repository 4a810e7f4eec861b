"""The host agent (``host_agent.HostAgent``): each tick it reads the GPUs (``gpus/``), the
scheduler's allocations (``allocations/``) and the host (``sample_host``), attributes and holds
the samples (``allocated_samples``, ``hold_samples``), and spools them (``spool/``) for the
forwarder; ``run`` is its loop, ``checkpoint`` what it keeps across a restart, ``metrics`` what
it reports of itself."""
