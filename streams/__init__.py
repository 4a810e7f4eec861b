"""The Faust worker of gpufleet: event-time windows, detectors, alerts, the profiling scheduler
and the trace analysis.

Stage logic lives in plain modules (``window_utilization``, ``detect_waste``, ``alert_lifecycle``, ...);
``topology`` wires them to Kafka inside a Faust app made by ``app.create_app``.
"""
