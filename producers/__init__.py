"""Host side of gpufleet: the host agent (NVML and host sampling, process attribution, the
spool and its forwarder to Kafka), the profiling hook and its agent, the trace reader and
ingester, and the simulated fleet."""
