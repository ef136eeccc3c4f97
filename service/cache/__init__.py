"""Kernel-cache and whole-job cache statistics (``GET /cache/stats``), written by workers, read here."""
