"""Fixtures the unit tests of several packages share (defined in ``tests.support``)."""

from tests.support.agent import world  # noqa: F401 -- a fixture: the agent with a fake NVML and a /proc
