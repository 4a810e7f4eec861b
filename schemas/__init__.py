"""The wire contract of gpufleet: Avro schemas, the codec, and the topics that carry them.

``producers``, ``streams`` and ``sinks`` import this package and not each other.
"""
