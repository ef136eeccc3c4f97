"""``flexdsa``: the command line. ``flexdsa optimize MODEL --target T -o OUT/`` runs the pipeline locally.

Commands from outside the core (``serve``, ``worker``, ``db``, ``keys``, ``submit``) register through the
``flexdsa.cli`` entry-point group, so this module never imports the service.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Flex-DSA: verified ONNX optimisation for edge accelerators.")


def _register_plugins() -> None:
    for entry in entry_points(group="flexdsa.cli"):
        try:
            register = entry.load()
        except ImportError:  # a part not installed (or not yet written) simply adds no commands
            continue
        register(app)


def main() -> None:
    _register_plugins()
    app()


if __name__ == "__main__":
    main()
