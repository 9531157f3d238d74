"""The examples of README.md and docs/ run as tests (sybil): tests/docs_examples.py is the runner."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))

import docs_examples

pytest_collect_file = docs_examples.sybil().pytest()
