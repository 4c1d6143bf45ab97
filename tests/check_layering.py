#!/usr/bin/env python3
"""Fails if a source file includes a header from a layer above its own.

The layers of src/, lowest first; a file may include headers of its own layer and of the layers
below it, never of one above:

    util <- security <- config <- image <- import <- runtime <- session <- cli

  util      errors, files, descriptors, processes: no knowledge of sandboxes
  security  seccomp, Landlock, capabilities, confined work on untrusted input
  config    the one validator of what front ends put into a SandboxConfig
  image     image files and the image server (squashfs, FUSE), enroot's container store
  import    image import: registry and archive sources, layers applied into a squashfs image
  runtime   the launch pipeline: launcher, supervisor, init, payload
  session   sqbox serve
  cli       the command line

The public headers (include/sqbox/: plain configuration and result types) sit below them all and
include nothing of src/. Unit tests (tests/unit) may include anything.

Usage: check_layering.py [REPOSITORY]  (default: the checkout this file is in)
"""

import pathlib
import re
import sys

LAYERS = ["util", "security", "config", "image", "import", "runtime", "session", "cli"]
RANK = {name: rank for rank, name in enumerate(LAYERS)}
PUBLIC = "sqbox"  # include/sqbox/
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def problems_in(repository: pathlib.Path):
    source = repository / "src"
    for path in sorted(source.rglob("*")):
        if path.suffix not in (".h", ".cpp", ".hpp", ".cc"):
            continue
        relative = path.relative_to(source)
        layer = relative.parts[0]
        if layer not in RANK:
            yield f"src/{relative}: in no layer (add {layer} to LAYERS in {__file__})"
            continue
        for included in INCLUDE.findall(path.read_text(errors="replace")):
            target = included.split("/")[0]
            if "/" not in included or target == PUBLIC:
                continue
            if target not in RANK:
                yield f"src/{relative}: includes {included}, of no layer"
            elif RANK[target] > RANK[layer]:
                yield (f"src/{relative}: includes {included}, from the {target} layer above "
                       f"its own ({layer})")
    for path in sorted((repository / "include" / PUBLIC).glob("*.h")):
        for included in INCLUDE.findall(path.read_text(errors="replace")):
            if included.split("/")[0] != PUBLIC:
                yield f"include/{PUBLIC}/{path.name}: includes {included}, not a public header"


def main() -> int:
    default = pathlib.Path(__file__).resolve().parent.parent
    repository = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else default
    if not (repository / "src").is_dir():
        print(f"no src/ in {repository}", file=sys.stderr)
        return 2
    problems = list(problems_in(repository))
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} include(s) against the layering (see {__file__})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
