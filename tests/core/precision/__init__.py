"""Tests of ``flexdsa_core/precision/``, one file per module (the end-to-end precision tests are
``tests/core/test_precision.py``)."""
