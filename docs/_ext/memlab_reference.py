"""The options and markers reference, generated at build time from the
definitions themselves, so that it cannot drift from the code:

- ``{memlab-options}``: every option that ``pytest_memlab.options.add_options``
  declares, in declaration order, with its ini twin, the ini's default and
  the option's own help (what ``pytest --help`` prints).  It is read by
  calling ``add_options`` with a parser that records what it is given: the
  same call pytest makes.  An option without an ini twin, or an ini without
  its option, is a build warning (an error under ``-W``).
- ``{memlab-markers}``: each marker as ``pytest --markers`` registers it
  (``MARKERS``) and the keywords it accepts (``_KEYWORDS``, what the
  parser checks), each linked to the heading of docs/budgets.md that names
  it in backticks: a keyword added to the code and described by no heading
  there is a build warning (an error under ``-W``).

Each option entry is Sphinx's ``option`` directive, so a page links to one
with ``{option}`--memlab-report```.
"""

from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

_INI_IN_HELP = re.compile(r"\s*\(ini: ([a-z_]+)\)\s*$")


class _Recorder:
    """Stands in for pytest's parser (and its option group): records each
    addoption and addini call, in order."""

    def __init__(self):
        self.options: list[tuple[tuple[str, ...], dict]] = []
        self.inis: dict[str, dict] = {}

    def getgroup(self, name, description="", after=None):
        return self

    def addoption(self, *names, **attrs):
        self.options.append((names, attrs))

    def addini(self, name, help, type=None, default=None, **kwargs):
        self.inis[name] = {"help": help, "type": type, "default": default}


def declared():
    """(options, inis) as pytest_memlab.options.add_options declares them."""
    from pytest_memlab import options

    recorder = _Recorder()
    options.add_options(recorder)
    return recorder.options, recorder.inis


def _escape(text: str) -> str:
    """Plain text made safe as Markdown."""
    return re.sub(r"([\\`*_\[\]<>|#~])", r"\\\1", text)


_OPTION_IN_TEXT = re.compile(r"(--memlab[a-z-]*(?:=[A-Za-z|]+)?)")


def _help_markdown(text: str) -> str:
    """An option's help as Markdown: the options it names as code."""
    parts = _OPTION_IN_TEXT.split(text)
    return "".join(f"`{part}`" if i % 2 else _escape(part) for i, part in enumerate(parts))


def _signature(names, attrs) -> str:
    name = names[0]
    if attrs.get("action") in ("store_true", "store_false", "count"):
        return name
    metavar = attrs.get("metavar") or attrs.get("dest", name.lstrip("-")).upper()
    if attrs.get("nargs") == "?":
        return f"{name}[={metavar}]"
    return f"{name}={metavar}"


def _ini_default(ini: dict) -> str:
    default = ini["default"]
    if default in (None, "", []):
        return "unset"
    if default == "false":
        return "`false` (off)"
    return f"`{_escape(str(default))}`"


def options_markdown(location=None) -> list[str]:
    options, inis = declared()
    lines: list[str] = []
    twins = set()
    for names, attrs in options:
        help_text = attrs.get("help", "").replace("%%", "%")
        match = _INI_IN_HELP.search(help_text)
        ini_name = match.group(1) if match else names[0].lstrip("-").replace("-", "_")
        help_text = _INI_IN_HELP.sub("", help_text)
        ini = inis.get(ini_name)
        if ini is None:
            logger.warning(f"memlab-options: {names[0]} has no ini twin ({ini_name} is not declared)",
                           location=location)
            ini_line = "no ini twin"
        else:
            twins.add(ini_name)
            extra = re.sub(r"^as --[a-z-]+\s*", "", ini["help"]).strip()
            if ini["help"] == help_text or not ini["help"].startswith("as "):
                extra = ""
            ini_line = f"ini: `{ini_name}`" + (f" {_escape(extra)}" if extra else "")
            if ini["type"]:
                ini_line += f" ({_escape(ini['type'])}: one value a line)" if ini["type"] == "linelist" else ""
            ini_line += f" · ini default: {_ini_default(ini)}"
        lines += [f"```{{option}} {_signature(names, attrs)}", "", ini_line, "", _help_markdown(help_text), "```", ""]
    for name in inis:
        if name not in twins:
            logger.warning(f"memlab-options: the ini {name} has no command-line option", location=location)
    return lines


def _keyword_headings(page) -> dict[str, str]:
    """keyword -> the slug of the first heading of page that names it in
    backticks (the slug GitHub and MyST give that heading)."""
    from myst_parser.slugs import github_slugify

    found: dict[str, str] = {}
    for line in page.read_text().splitlines():
        heading = re.match(r"^#{2,4} (.*)$", line)
        if heading is None:
            continue
        slug = github_slugify(heading.group(1).replace("`", ""))
        for keyword in re.findall(r"`([a-z_]+)(?:=[^`]*)?`", heading.group(1)):
            found.setdefault(keyword, slug)
    return found


def markers_markdown(page, location=None) -> list[str]:
    from pytest_memlab import markers

    lines: list[str] = []
    names = list(markers.MARKERS)
    keywords: list[str] = []
    for name in names:
        for keyword in markers._KEYWORDS[name]:
            if keyword not in keywords:
                keywords.append(keyword)
    for name in names:
        lines += [f"`@pytest.mark.{name}`, as `pytest --markers` lists it:", "",
                  "```text", f"@pytest.mark.{markers.MARKERS[name]}", "```", ""]
    headings = _keyword_headings(page)
    lines += ["| keyword (linked to where it is described) | " + " | ".join(f"`{n}`" for n in names) + " |",
              "| --- | " + " | ".join("---" for _ in names) + " |"]
    for keyword in keywords:
        cells = ["yes" if keyword in markers._KEYWORDS[n] else "no" for n in names]
        if keyword in headings:
            link = f"[`{keyword}`]({page.name}#{headings[keyword]})"
        else:
            logger.warning(f"memlab-markers: no heading of {page.name} names the keyword `{keyword}`",
                           location=location)
            link = f"`{keyword}`"
        lines.append(f"| {link} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


class _Generated(SphinxDirective):
    has_content = False

    def markdown(self) -> list[str]:
        raise NotImplementedError

    def run(self):
        container = nodes.container()
        text = StringList(self.markdown(), source=f"<generated by {self.name}>")
        self.state.nested_parse(text, self.content_offset, container)
        return container.children


class OptionsDirective(_Generated):
    def markdown(self):
        return options_markdown(location=self.get_location())


class MarkersDirective(_Generated):
    """``{memlab-markers} budgets.md``: the page whose headings describe the keywords."""

    required_arguments = 1

    def markdown(self):
        page = Path(self.env.srcdir) / self.arguments[0]
        self.env.note_dependency(str(page))
        return markers_markdown(page, location=self.get_location())


def setup(app):
    app.add_directive("memlab-options", OptionsDirective)
    app.add_directive("memlab-markers", MarkersDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
