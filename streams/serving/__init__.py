"""Serving replicas judged by the traffic they serve: a replica's windows, busy, headroom, idle or
saturated against the capacity it showed (``traffic``); a service's busiest span and the replicas
it needed (``service``)."""
