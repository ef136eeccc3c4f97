"""Flex-DSA workers: the Celery app and job task, the in-process worker for embedded mode, the reconciler
that re-publishes lost jobs, and the Redis/SQL layers of the kernel cache.

``execute.execute_job`` is the one place a job runs; every entry point (Celery task, embedded thread,
reconciler re-publish) ends there, and it is idempotent: a job id delivered twice runs at most once at a
time and ends with exactly one set of artifacts.
"""
