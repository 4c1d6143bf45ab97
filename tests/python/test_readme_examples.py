"""Every Python example of python/README.md runs as written, as a script of its own, with the
image name "python.sqsh" replaced by the test image's path (the README promises that each
example works; a change to the client that breaks one fails here)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "python" / "README.md"


def examples():
    """(section heading, index within it, code) of every ```python block."""
    found, heading = [], ""
    counts = {}
    for part in re.split(r"(```python\n.*?```)", README.read_text(), flags=re.S):
        if part.startswith("```python\n"):
            counts[heading] = counts.get(heading, 0) + 1
            found.append((heading, counts[heading], part[len("```python\n"):-3]))
            continue
        headings = re.findall(r"^## (.*)$", part, re.M)
        if headings:
            heading = headings[-1]
    return found


EXAMPLES = examples()


def test_the_readme_has_examples_of_each_feature():
    sections = {heading for heading, _, _ in EXAMPLES}
    assert {"Files, shells and rich results", "Streaming output",
            "Background processes"} <= sections, sections


@pytest.mark.parametrize("heading,index,code", EXAMPLES,
                         ids=[f"{heading}-{index}" for heading, index, _ in EXAMPLES])
def test_readme_example_runs(sqbox_bin, python_image, tmp_path, heading, index, code):
    assert '"python.sqsh"' in code, "an example without the image runs nothing"
    # What the examples refer to: ./data/data.csv (sqbox.run's mount).
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "data.csv").write_text("a,b\n1,2\n")
    script = tmp_path / "example.py"
    script.write_text(code.replace('"python.sqsh"', repr(python_image)))
    env = dict(os.environ, SQBOX_BIN=sqbox_bin, PYTHONPATH=str(ROOT / "python"))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 0, (code, done.stdout, done.stderr)
