"""A class a hostile environment variable might name: importing this module leaves a canary file, so a test can
tell whether a pipeline process imported it (``test_hooks.py``)."""

from __future__ import annotations

import os
from pathlib import Path

Path(os.environ["FLEXDSA_CANARY_PATH"]).write_text("imported")


class CanaryOptimizer:  # never instantiated by a production pipeline process
    pass
