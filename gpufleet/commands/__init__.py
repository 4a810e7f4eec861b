"""The commands of ``gpufleet``, a module per group: each has ``add(sub)`` (its parsers) and the
``cmd_*`` functions they run."""
