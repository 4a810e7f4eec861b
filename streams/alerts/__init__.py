"""Closed windows judged by the detectors, and each alert's life: pending, firing, resolved."""
