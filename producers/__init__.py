"""Host side of gpufleet, by role: ``agent/`` (the host agent: its GPUs, the scheduler's
allocations, the disk spool and its forwarder), ``serving/`` (the serving engines' endpoints the
agent reads), ``profiling/`` (the hook in a training process and the agent that runs profiles),
``traces/`` (reading a profiler trace and publishing it) and ``simulate/`` (the simulated fleet
of the demo and the tests); ``publish_kafka.py``, the Kafka producer they share."""
