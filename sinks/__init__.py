"""Where gpufleet's records end up: ClickHouse (the sink, its tables and migrations, the
users of a server) and the people alerts are for (the notifier: webhooks and e-mail)."""
