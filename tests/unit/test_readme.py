"""The README's tour works in a fresh clone on its own: every file its commands name is in the
repository (nothing from a sibling checkout such as ../shared), and so is every page it links."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tour_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.DOTALL)
    # A command goes on while its quotes are open (a query over two lines) or a line ends in a backslash.
    commands, pending = [], ""
    for line in (line for block in blocks for line in block.splitlines()):
        pending = f"{pending} {line.strip().removesuffix(chr(92))}".strip()
        try:
            words = shlex.split(pending)
        except ValueError:
            continue  # a quote still open
        if not line.rstrip().endswith(chr(92)):
            commands.append(words)
            pending = ""
    return [words for words in commands if words and words[0] in (".venv/bin/gpufleet", "make")]


def test_the_tour_names_only_files_a_clone_has():
    named = [arg for cmd in tour_commands() for arg in cmd[1:]
             if re.fullmatch(r"[\w./-]+\.(?:json|gz|toml|md|py|csv)", arg)]
    assert named, "the tour names the files it reads"
    missing = [arg for arg in named if ".." in Path(arg).parts or not (ROOT / arg).is_file()]
    assert missing == []


def test_every_page_the_readme_links_is_there():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if not re.match(r"\w+://", link)]
    assert local and [link for link in local if not (ROOT / link).exists()] == []
