"""Which lines of a serving engine's metrics page a reading needs, picked in one scan of the page
in C: an engine's page is mostly histogram buckets and metrics gpufleet does not read, and the
client library parser's cost is per line (~25 us); on TGI's page (1,894 lines, 94 KB) the scan
picks 11, in 0.20 ms. Tried and left there: ``str.find`` for each name and a check of each
find (0.22 ms: its fast search costs ~30 us a name over the page), and Google's RE2 through its
Python binding (0.55 ms)."""

from __future__ import annotations

import functools
import re

# Within a line: whitespace but its end (what ``str.strip`` takes off a line the parser reads), and
# what separates a comment line's words (the parser's ``string.whitespace``, but the line's end).
_BLANK = r"[^\S\n]"
_SEP = r"[ \t\r\x0b\x0c]"


@functools.cache
def _picking(families: frozenset[str], written: frozenset[str]) -> re.Pattern[str]:
    """The lines of a page (each after a newline) that begin with the TYPE comment of one of
    ``families``, or with a sample named one of ``written``."""
    return re.compile(rf"\n{_BLANK}*(#{_SEP}+TYPE{_SEP}+{_alternatives(families)}{_SEP}[^\n]*"
                      rf"|{_alternatives(written)}(?:{_BLANK}|\{{)[^\n]*)")


def _alternatives(words: frozenset[str]) -> str:
    """A pattern matching any of ``words``, as a tree of their common beginnings: the regular
    expression engine tries a group's alternatives one after the other, at every line."""
    tree: dict = {}
    for word in words:
        node = tree
        for c in word:
            node = node.setdefault(c, {})
        node[""] = {}

    def pattern(node: dict) -> str:
        branches = [re.escape(c) + pattern(child) for c, child in sorted(node.items()) if c]
        body = "" if not branches else branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
        return f"(?:{body})?" if "" in node and body else body

    return f"(?:{pattern(tree)})"


def lines(text: str, families: frozenset[str], written: frozenset[str]) -> list[str]:
    """The lines of ``text`` that a reading of the samples named ``written`` needs, as the parser
    reads them (stripped), in their order: the TYPE lines of ``families``, and every sample line
    of a name in ``written``, wherever it stands (an untyped sample after a family not read
    included). Lines end at ``\n`` alone, as the parser's do (a label value may hold any other
    line separator). HELP lines are left (a reading needs none), and so are samples named only
    inside their braces (``{"name"}``, ``{__name__=...}``: the format's UTF-8 names, which no
    engine read here writes). Where a page breaks the format's rule that a metric's lines are
    one group (its samples after another metric's TYPE or HELP line), its samples may be typed
    by the TYPE line before them here."""
    return [line.strip() for line in _picking(families, written).findall("\n" + text)]
