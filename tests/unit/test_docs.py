"""The documents a new user reads: their sizes, their links, the README's commands, the recordings'
index. Docs that drift from the code fail here rather than in a user's terminal."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import typer

from sara_cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", RESULTS / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
# what the README promises a reader: one screen of what SARA is, and the reference pages' sizes
SIZE_LIMITS = {"README.md": 150, "docs/results.md": 250, "docs/benchmarks.md": 800}
README_LONGEST_LINE = 400
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _outside_code(text: str) -> str:
    """The text with fenced and indented code blocks and inline code spans blanked out."""
    kept, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence and not line.startswith("    "):
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors for a markdown file: lowercased, punctuation dropped, spaces to
    hyphens, a repeated one suffixed -1, -2, ..."""
    repeats: dict[str, int] = {}
    anchors, fence = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        if fence or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{repeats[slug]}" if slug in repeats else slug)
        repeats[slug] = repeats.get(slug, 0) + 1
    return anchors


def _bash_lines(text: str) -> list[list[str]]:
    """Each fenced bash block of a markdown text, as its command lines without comments."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```bash"):
            current = []
        elif line.startswith("```") and current is not None:
            blocks.append(current)
            current = None
        elif current is not None:
            command = re.split(r"\s#", line, maxsplit=1)[0].strip()
            if command:
                current.append(command)
    return blocks


def _expand_braces(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[:match.start()], pattern[match.end():]
    return [out for part in match.group(1).split(",") for out in _expand_braces(head + part + tail)]


@pytest.mark.parametrize("name,limit", sorted(SIZE_LIMITS.items()))
def test_the_documents_meet_their_sizes(name, limit):
    lines = (ROOT / name).read_text().splitlines()
    assert len(lines) <= limit, f"{name}: {len(lines)} lines, at most {limit}"


def test_no_readme_line_is_a_wall():
    for number, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1):
        assert len(line) <= README_LONGEST_LINE, f"README.md:{number}: {len(line)} characters"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    broken = []
    for target in LINK.findall(_outside_code(doc.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_table_is_the_results_at_a_glance():
    """The README's table of what SARA saves is docs/results.md's, cell for cell (links aside)."""
    def table_after(text: str, heading: str) -> list[str]:
        lines = text.split(heading, 1)[1].splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("|"))
        rows = []
        for line in lines[start:]:
            if not line.startswith("|"):
                break
            rows.append(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line))
        return rows
    readme = table_after((ROOT / "README.md").read_text(), "## What it saves")
    results = table_after((ROOT / "docs" / "results.md").read_text(), "## At a glance")
    assert readme == results and len(readme) >= 3


def test_every_sara_command_in_the_readme_exists_with_its_flags():
    group = typer.main.get_command(cli.app)
    checked = 0
    for block in _bash_lines((ROOT / "README.md").read_text()):
        for line in block:
            for command in line.split("&&"):
                words = [w for w in shlex.split(command) if not re.match(r"^[A-Z_]+=", w)]
                if not words or words[0] != "sara":
                    continue
                node, rest = group, words[1:]
                while rest and hasattr(node, "commands") and rest[0] in node.commands:
                    node, rest = node.commands[rest[0]], rest[1:]
                assert node is not group, f"README runs `{command.strip()}`: no such command"
                assert not hasattr(node, "commands") or not rest or rest[0].startswith("-"), \
                    f"README runs `{command.strip()}`: {rest[0]} is not a subcommand"
                options = {o for p in node.params for o in (*p.opts, *p.secondary_opts)}
                for flag in (w.split("=")[0] for w in rest if w.startswith("--")):
                    assert flag in options, f"README runs `{command.strip()}`: no {flag}"
                checked += 1
    assert checked >= 10


def test_every_file_and_module_the_readme_runs_is_there():
    for block in _bash_lines((ROOT / "README.md").read_text()):
        for line in block:
            words = shlex.split(line)
            for word in words:
                if re.match(r"^(bench|deploy|examples|scripts)/", word):
                    assert (ROOT / word).exists(), f"README runs {word}: not in the repository"
            for i, word in enumerate(words[:-1]):
                if word == "-m":
                    assert importlib.util.find_spec(words[i + 1]), f"README runs -m {words[i + 1]}"


def test_demo_fresh_finds_the_readme_first_line():
    """bench/demo_fresh.sh runs the README's first command exactly as written: it must find it."""
    script = (ROOT / "bench" / "demo_fresh.sh").read_text()
    awk = re.search(r"line=\$\(awk '([^']*)' README\.md\)", script)
    assert awk, "demo_fresh.sh no longer extracts its line with awk"
    out = subprocess.run(["awk", awk.group(1), "README.md"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == _bash_lines((ROOT / "README.md").read_text())[0][0]
    assert "pip install -e" in out and out.endswith("sara demo")


def test_the_results_index_names_every_recording_and_only_those():
    index = (RESULTS / "README.md").read_text()
    patterns = [p for row in index.splitlines() if row.startswith("| `")
                for name in re.findall(r"`([^`]+)`", row.split("|")[1])
                for p in _expand_braces(name)]
    files = sorted(p.name for p in RESULTS.iterdir() if p.name != "README.md")
    unindexed = [f for f in files if not any(fnmatch.fnmatchcase(f, p) for p in patterns)]
    assert not unindexed, f"bench/results/README.md does not name {unindexed}"
    missing = [p for p in patterns if not any(fnmatch.fnmatchcase(f, p) for f in files)]
    assert not missing, f"bench/results/README.md names {missing}, which are not there"
