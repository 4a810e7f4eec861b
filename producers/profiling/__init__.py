"""Profiling on the host: the hook a training process enables (``hook``), its context and the
hand-off of what it captures (``context``, ``handoff``), and the profile agent that answers the
worker's profile requests (``agent``)."""
