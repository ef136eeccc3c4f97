"""The compiler's version: part of every kernel-cache and whole-job-cache key, and of every report."""

__version__ = "0.1.0"
