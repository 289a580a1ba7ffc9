"""Runs one unittest module and records each test's outcome.

    /usr/bin/python3 runner.py SUITE MODULE [RESULTS_FILE]

The module is imported from the directory it lives in (MODULE may be a path to a .py file).
Each test's outcome goes to RESULTS_FILE (or $RESULTS_FILE) as one line
"PASS|FAIL|SKIP SUITE/test_name", the format conformance/clients/run.sh compares between
brokers. The last line printed is "SUITE: N passed, N failed, N skipped". Exit status 0 when
nothing failed.
"""

import os
import sys
import unittest


class RecordingResult(unittest.TextTestResult):
    """A TextTestResult that also remembers one outcome per test."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = []

    def _name(self, test):
        return getattr(test, "_testMethodName", None) or str(test)

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes.append(("PASS", self._name(test)))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes.append(("FAIL", self._name(test)))

    def addError(self, test, err):
        super().addError(test, err)
        # setUpClass errors arrive as a _ErrorHolder whose str names the class.
        self.outcomes.append(("FAIL", self._name(test)))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes.append(("SKIP", self._name(test)))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.outcomes.append(("PASS", self._name(test)))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.outcomes.append(("FAIL", self._name(test)))


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    suite_name, module = argv[1], argv[2]
    results_file = argv[3] if len(argv) > 3 else os.environ.get("RESULTS_FILE")
    if module.endswith(".py"):
        directory, base = os.path.split(os.path.abspath(module))
        sys.path.insert(0, directory)
        module = base[:-3]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

    tests = unittest.defaultTestLoader.loadTestsFromName(module)
    runner = unittest.TextTestRunner(verbosity=2, resultclass=RecordingResult, stream=sys.stdout)
    result = runner.run(tests)

    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    lines = []
    for outcome, name in result.outcomes:
        counts[outcome] += 1
        lines.append("%s %s/%s\n" % (outcome, suite_name, name))
    if results_file:
        with open(results_file, "a", encoding="utf-8") as f:
            f.writelines(lines)
    print("%s: %d passed, %d failed, %d skipped" % (suite_name, counts["PASS"], counts["FAIL"], counts["SKIP"]))
    return 0 if counts["FAIL"] == 0 and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
