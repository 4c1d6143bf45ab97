#!/usr/bin/env python3
"""Fails if a command the documentation tells users to run could not be run as written.

Two rules, both about a fresh clone:
- every file of the repository that starts with `#!` is executable (git keeps the mode, so a
  script committed without it reaches every clone as "Permission denied");
- in Markdown, every repository path a command starts with (a line of a fenced code block, or
  an inline code span with arguments or `sudo`: `bench/serve.py --rounds 9`, `sudo scripts/test`)
  exists and is executable, and every inline code span that is a path of the repository
  (`tests/security/test_serve.py`) names a file or directory that exists. Paths with a
  placeholder in capitals (`images/NAME.sh`) are left alone.

Usage: check_commands.py [REPOSITORY]  (default: the checkout this file is in)
"""

import os
import re
import subprocess
import sys
from pathlib import Path

# A path into the repository at the start of a code line or span (optionally after sudo or ./),
# then the end or a space: `bench/python:bench` is an image name, not a path.
PATH_FIRST = re.compile(
    r"^(sudo\s+)?(?:\./)?((?:bench|scripts|images|tests|packaging|python|src|docs|\.ci)/[\w./-]*)"
    r"(\s|$)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"[A-Z]{3,}")


def tracked_files(repository: Path) -> list[Path]:
    listing = subprocess.run(["git", "-C", str(repository), "ls-files", "-z"],
                             check=True, capture_output=True).stdout
    return [repository / name for name in listing.decode().split("\0") if name]


def is_executable(path: Path) -> bool:
    return path.is_file() and os.stat(path).st_mode & 0o100 != 0


def scripts_without_mode(files: list[Path], repository: Path) -> list[str]:
    problems = []
    for path in files:
        if path.is_symlink() or not path.is_file():
            continue
        with open(path, "rb") as stream:
            if stream.read(2) == b"#!" and not is_executable(path):
                problems.append(f"{path.relative_to(repository)}: starts with #! but is not "
                                "executable (git update-index --chmod=+x)")
    return problems


def documented_paths(markdown: str) -> list[tuple[str, bool]]:
    """(path, run as a command) for each repository path this Markdown names in code."""
    paths = []
    fenced = False
    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        spans = [stripped] if fenced else INLINE_CODE.findall(line)
        for span in spans:
            match = PATH_FIRST.match(span.strip())
            if not match or PLACEHOLDER.search(match.group(2)):
                continue
            path = match.group(2).rstrip(".,:;")
            runs = fenced or bool(match.group(1)) or span.strip() != match.group(2)
            paths.append((path, runs))
    return paths


def documented_paths_that_fail(files: list[Path], repository: Path) -> list[str]:
    problems = []
    for path in files:
        if path.suffix != ".md" or not path.is_file():
            continue
        where = path.relative_to(repository)
        for named, runs in documented_paths(path.read_text(encoding="utf-8")):
            target = repository / named
            if runs and not target.is_dir() and not is_executable(target):
                why = "is not executable" if target.exists() else "does not exist"
                problems.append(f"{where}: runs {named}, which {why}")
            elif not runs and not target.exists():
                problems.append(f"{where}: names {named}, which does not exist")
    return sorted(set(problems))


def main() -> int:
    repository = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    files = tracked_files(repository)
    problems = scripts_without_mode(files, repository) + documented_paths_that_fail(
        files, repository)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(files)} files checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
