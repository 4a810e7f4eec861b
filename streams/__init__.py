"""The Faust worker of gpufleet: event-time windows, detectors, alerts, enforcement, the
profiling scheduler and the trace analysis.

The decisions live in plain packages (``streams.windows``, ``streams.alerts``,
``streams.enforcement``, ``streams.profiling``, ``streams.traces``), the Faust side of each
stage in ``streams.stages``; ``topology`` wires the stages into a Faust app made by
``app.create_app`` from ``settings``. ``docs/architecture.md`` draws who may import whom.
"""
