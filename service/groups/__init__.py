"""Job groups: one upload compared across several targets (``GET /groups/{id}``, ``/ui/groups/{id}``)."""
