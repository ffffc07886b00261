"""Sphinx configuration of pytest-memlab's manual (MyST Markdown pages).

Built by ci/docs with warnings as errors.  The options and markers
reference is generated at build time from the definitions in this checkout
(docs/_ext/memlab_reference.py), so that it cannot drift from the code."""

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))      # pytest_memlab from this checkout, not an installed one

project = "pytest-memlab"
author = "the pytest-memlab maintainers"
copyright = "the pytest-memlab maintainers"

extensions = ["myst_parser", "memlab_reference"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "examples", "requirements.txt", "README.md"]

myst_heading_anchors = 3          # [text](page.md#a-heading) works here as on GitHub
myst_enable_extensions = ["deflist"]
smartquotes = False               # "--memlab" stays two hyphens, quotes stay as the code prints them

html_theme = "furo"
html_title = "pytest-memlab"
