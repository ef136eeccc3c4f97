"""Run-time traffic of a deployed bundle and re-specialising its buckets from it: routes, logic, the
dashboard's traffic section and the ``flexdsa traffic`` / ``flexdsa respecialise`` commands."""
