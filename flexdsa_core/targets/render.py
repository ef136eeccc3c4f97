"""The bundle's generated scripts are template files, rendered at bundle time with Jinja2.

A vendor's scripts lie in its folder (``targets/<vendor>/templates/``), those two vendors share in
``targets/templates/``. Each is a real Python file: ruff lints it (the ``{{ name }}`` placeholders, where the
bundle's data go, are the only names it may not know: F821 is off for templates), and a test renders every one
and compiles the result. The values are text the adapter formats (``pprint`` of a list, ``repr``), put in as they
are: no escaping, and a name the template uses but the adapter does not give is an error.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from importlib.abc import Traversable

import jinja2

FOLDER = "templates"


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False, auto_reload=False
    )


def template_file(package: str, name: str) -> Traversable:
    """``templates/<name>`` of ``package`` (a vendor's ``__package__``, or ``flexdsa_core.targets``)."""
    return resources.files(package).joinpath(FOLDER, name)


@cache
def _template(package: str, name: str) -> jinja2.Template:
    return _environment().from_string(template_file(package, name).read_text(encoding="utf-8"))


def render(package: str, name: str, **values: object) -> str:
    """The script ``name`` of ``package``'s templates with ``values`` filled in."""
    return _template(package, name).render(**values)
