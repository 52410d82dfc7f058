"""pytest setup: prints the plain "N passed, N failed" line scripts/test counts."""
import os
import sys

# Test helpers (reference.py) import by name from this folder.
sys.path.insert(0, os.path.dirname(__file__))


def pytest_terminal_summary(terminalreporter):
    stats = terminalreporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    skipped = len(stats.get("skipped", []))
    terminalreporter.write_line(f"python: {skipped} skipped")
    terminalreporter.write_line(f"{passed} passed, {failed} failed")
