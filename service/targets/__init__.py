"""The built-in targets (``GET /targets``, ``GET /targets/{name}``)."""
