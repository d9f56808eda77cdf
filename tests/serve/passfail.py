"""passfail.py: a pytest plugin that prints the project's test lines (`PASS name` /
`FAIL name (why)`, see tests/run.sh), one per test, so pytest suites count in `make test` like
the C and shell tests.  Loaded with `-p passfail` (this folder on PYTHONPATH).  A test that
pytest skips prints `SKIP name (why)`, which run.sh counts apart ("N skipped"); a failure in a fixture's
setup or teardown is the test's FAIL.  We rejected parsing pytest's own summary: its format
is not a contract."""

_config = None


def pytest_configure(config):
    global _config
    _config = config


def _line(text):
    tr = _config.pluginmanager.get_plugin("terminalreporter")
    tr.write("\n")  # after pytest's progress dot: the line must start with PASS / FAIL
    tr.write_line(text)


def pytest_runtest_logreport(report):
    name = report.nodeid.split("::")[-1]
    if report.failed:
        lines = str(report.longrepr).strip().splitlines()
        _line("FAIL %s (%s: %s)" % (name, report.when, lines[-1][:300] if lines else "failed"))
    elif report.skipped:
        _line("SKIP %s (%s)" % (name, report.longrepr[-1] if isinstance(report.longrepr, tuple) else "skipped"))
    elif report.when == "call":
        _line("PASS %s" % name)
