"""pytest plugin loaded in the sandbox: one JSON line per test phase to $TRACE_SANDBOX_REPORT."""
import json
import os


def _write(record):
    path = os.environ.get("TRACE_SANDBOX_REPORT", "")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


def pytest_runtest_logreport(report):
    _write({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome})


def pytest_collectreport(report):
    if report.failed:
        _write({"nodeid": report.nodeid, "when": "collect", "outcome": "failed"})
