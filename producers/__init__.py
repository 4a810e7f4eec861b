"""Host side of gpufleet: the simulated fleet, (later) the NVML sampler and trace ingester, and the Kafka publisher."""
