"""Where gpufleet's records end up: ClickHouse (and, later, notifiers for alerts)."""
