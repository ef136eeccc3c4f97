"""The web dashboard: its pages, the views they show, the templates and static files, and the vendored
Swagger UI at ``/docs``."""
