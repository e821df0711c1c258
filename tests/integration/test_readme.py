"""README examples are executed: each ```python block runs and prints what its comment says."""

import contextlib
import io
import os
import re

import pytest

pytestmark = pytest.mark.spark

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def _blocks():
    text = open(README).read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_examples():
    assert _blocks()


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_readme_example_runs_and_prints_what_it_says(spark, tmp_path, monkeypatch, index):
    code = _blocks()[index]
    expected = [line[2:] for line in code.splitlines() if line.startswith("# ")]
    monkeypatch.chdir(tmp_path)  # checkpoints go under the working directory
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"README block {index}", "exec"), {})
    assert out.getvalue().splitlines() == expected
