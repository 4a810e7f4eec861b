"""A PyTorch profiler trace read (``read``, over ``json_text``) into kernel events (``events``),
published to Kafka (``publish``) from an outbox kept until the broker has it (``outbox``)."""
