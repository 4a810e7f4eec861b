"""Serving replicas judged by the traffic they serve (``traffic.py``)."""
