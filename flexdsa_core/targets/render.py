"""The bundle's generated scripts are template files, rendered at bundle time with Jinja2.

A vendor's scripts lie in its folder (``targets/<vendor>/templates/``), those two vendors share in
``targets/templates/``. A name the template uses but the adapter does not give is an error.

Python scripts (``*.py``): each is a real Python file: ruff lints it (the ``{{ name }}`` placeholders, where the
bundle's data go, are the only names it may not know: F821 is off for templates), and a test renders every one
and compiles the result. The values are Python literals the adapter formats (``pprint`` of a list, ``repr``),
put in as they are.

Shell scripts (``*.sh``): every value is data, one shell word wherever it is printed: ``{{ name }}`` is quoted
by the shell's own rules (``shlex.quote``, or bash's ``$'...'`` with escapes for a value holding a newline or
another unprintable character, so that the word stays on its line). A name from a model or a request never
becomes script text; what is script text (``"${MODEL}"``) is written in the template. Two filters print a value
otherwise: ``|comment`` the text as it reads, on one line, in a comment (refused on a line that is not one),
and ``|var`` a shell variable name (refused unless it is one). A value that is not a string or a number (None,
a list) is refused: the template says how a list is joined.
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from importlib import resources
from importlib.abc import Traversable

import jinja2

FOLDER = "templates"
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMMENT_FILTER = re.compile(r"\|\s*comment\b")


class _ShellText(str):
    """Text a filter made safe for its place in a shell script: printed as it is."""


def shell_word(text: str) -> str:
    """``text`` as one shell word: quoted as ``shlex.quote`` does, or, where it holds a newline or another
    unprintable character, as bash's ``$'...'`` with those characters escaped (the word stays on one line)."""
    if "\0" in text:
        raise ValueError(f"{text!r} holds a NUL character, which no shell argument can carry")
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(_ansi_c_escape(char) for char in text) + "'"


def _ansi_c_escape(char: str) -> str:
    if char in "\\'":
        return "\\" + char
    if char.isprintable():
        return char
    return "".join(f"\\x{byte:02x}" for byte in char.encode())  # its UTF-8 bytes: the same in every locale


def _finalize(value: object) -> str:
    if isinstance(value, _ShellText):
        return value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TypeError(
            f"a shell template prints strings and numbers, not {value!r}: give the adapter's value as text, or "
            "join the list in the template"
        )
    return shell_word(str(value))


def _comment(value: object) -> _ShellText:
    """``value`` as the text of a comment: its unprintable characters escaped (``\\n``), so that it cannot end
    the comment and start a command."""
    escaped = (c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(value))
    return _ShellText("".join(escaped))


def _variable(value: object) -> _ShellText:
    if not isinstance(value, str) or not _VARIABLE.fullmatch(value):
        raise ValueError(f"{value!r} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return _ShellText(value)


@cache
def _environment(shell: bool) -> jinja2.Environment:
    if not shell:
        return jinja2.Environment(
            undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False, auto_reload=False
        )
    environment = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False, auto_reload=False,
        trim_blocks=True, lstrip_blocks=True, finalize=_finalize,
    )  # fmt: skip
    environment.filters.update(comment=_comment, var=_variable)
    return environment


def template_file(package: str, name: str) -> Traversable:
    """``templates/<name>`` of ``package`` (a vendor's ``__package__``, or ``flexdsa_core.targets``)."""
    return resources.files(package).joinpath(FOLDER, name)


def _check_comment_filters(name: str, text: str) -> None:
    """``|comment`` prints text unquoted: only where the line is a comment."""
    for number, line in enumerate(text.splitlines(), 1):
        if _COMMENT_FILTER.search(line) and not line.lstrip().startswith("#"):
            raise ValueError(f"{name}:{number}: |comment prints unquoted, in comment lines (# ...) only")


@cache
def _template(package: str, name: str) -> jinja2.Template:
    text = template_file(package, name).read_text(encoding="utf-8")
    shell = name.endswith(".sh")
    if shell:
        _check_comment_filters(name, text)
    return _environment(shell).from_string(text)


def render(package: str, name: str, **values: object) -> str:
    """The script ``name`` of ``package``'s templates with ``values`` filled in (quoted, for a ``.sh``)."""
    return _template(package, name).render(**values)
