"""Incidents, for operators: the traceback behind an internal error (``GET /incidents``)."""
