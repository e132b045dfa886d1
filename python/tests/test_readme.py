"""Every ``python`` example of python/README.md runs as written, in a process of its own that
finds the platform through DSEC_API_URL and DSEC_API_KEY only."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _examples():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 8
    return blocks


@pytest.mark.parametrize("index", range(len(_examples())))
def test_readme_example_runs(platform, index):
    code = _examples()[index]
    out = subprocess.run([sys.executable, "-c", code], env=platform.env(), capture_output=True, timeout=120)
    assert out.returncode == 0, f"example {index} failed:\n{code}\n--- stderr ---\n{out.stderr.decode()}"
