"""``python -m flexdsa_runtime verify BUNDLE``: check a bundle where it is deployed (``verify``), with nothing of
the compiler installed. ``flexdsa verify-bundle`` runs the same."""

from __future__ import annotations

import sys

COMMANDS = ("verify",)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(
            "usage: python -m flexdsa_runtime verify BUNDLE [--original MODEL.onnx] [--samples N] [--json]\n"
            "  verify  run each artifact of the bundle through its runtime where it is here and hold its outputs "
            "against report.json's claims (`verify --help` for more)",
            file=sys.stderr,
        )
        return 2
    from flexdsa_runtime.verify import main as verify

    return verify(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
