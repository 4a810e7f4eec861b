"""The agent's disk spool (``disk``: records kept until the broker has them, within a size
bound) and the forwarder that sends them on (``forward``)."""
