"""Liveness, readiness and Prometheus metrics (``/healthz``, ``/readyz``, ``/metrics``)."""
