"""A real application end to end: Celery workers with the broker at WARREN_URL.

setUpClass starts two worker processes (threads pool) and tearDownClass stops them:

- the "rpc" worker stores results with the rpc:// backend (results travel back over AMQP to a
  reply queue of the client's). It runs plain tasks, a group, and a task that retries.
- the "file" worker stores results in a temporary directory (file:// backend), because
  Celery's rpc backend does not support chords. It runs a chord: a group of 5 adds whose
  results a sum callback adds up (Celery's chord_unlock task polls the group, retrying each
  second, until all five are done).

Run with Debian's interpreter: /usr/bin/python3 conformance/clients/python/runner.py celery
conformance/celery/test_celery.py. Every wait is bounded.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

from celery import chord, group

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from tasks import make_app  # noqa: E402

BROKER = os.environ.get("WARREN_URL", "amqp://guest:guest@127.0.0.1:5672/")
STARTUP = 60  # seconds for a worker to report "ready"
RESULT = 60  # seconds for any one result


class Worker:
    """One `celery worker` process with its own queue, backend and log file."""

    def __init__(self, name, backend, workdir):
        self.name = name
        self.queue = "conf-celery-%s-%s" % (name, uuid.uuid4().hex[:8])
        self.backend = backend
        self.log_path = os.path.join(workdir, "worker-%s.log" % name)
        self.proc = None
        self.app = make_app(BROKER, backend, self.queue)

    def start(self):
        env = dict(os.environ, WARREN_URL=BROKER, CELERY_RESULT_BACKEND=self.backend,
                   CELERY_QUEUE=self.queue, PYTHONPATH=HERE)
        cmd = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool", "threads",
               "--concurrency", "4", "--hostname", "%s-%s@%%h" % (self.name, self.queue[-8:]),
               "--queues", self.queue, "--loglevel", "INFO"]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=HERE, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def wait_ready(self):
        deadline = time.monotonic() + STARTUP
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("celery worker %s exited with %s:\n%s"
                                     % (self.name, self.proc.returncode, self.tail()))
            with open(self.log_path) as f:
                if " ready." in f.read():
                    return
            time.sleep(0.1)
        raise AssertionError("celery worker %s not ready after %ds:\n%s" % (self.name, STARTUP, self.tail()))

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        try:
            with self.app.connection_for_write() as conn:
                conn.default_channel.queue_delete(self.queue)
        except Exception as exc:  # the broker may be gone; the queue then goes with it
            sys.stderr.write("could not delete %s: %s\n" % (self.queue, exc))

    def tail(self, lines=40):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def task(self, name):
        return self.app.tasks["conformance." + name]


class CeleryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="warren-celery-")
        results_dir = os.path.join(cls.workdir, "results")
        os.mkdir(results_dir)
        cls.rpc = Worker("rpc", "rpc://", cls.workdir)
        cls.file = Worker("file", "file://" + results_dir, cls.workdir)
        try:
            for w in (cls.rpc, cls.file):
                w.start()
            for w in (cls.rpc, cls.file):
                w.wait_ready()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for w in (cls.rpc, cls.file):
            w.stop()
        if os.environ.get("CELERY_KEEP_LOGS"):
            sys.stderr.write("celery logs kept in %s\n" % cls.workdir)
        else:
            shutil.rmtree(cls.workdir, ignore_errors=True)

    def run(self, result=None):
        # When this test fails, show what the workers said.
        before = len(result.failures) + len(result.errors) if result is not None else 0
        outcome = super().run(result)
        if result is not None and len(result.failures) + len(result.errors) > before:
            for w in (self.rpc, self.file):
                sys.stderr.write("--- worker %s log (last lines)\n%s" % (w.name, w.tail()))
        return outcome

    # rpc:// backend

    def test_task_rpc_backend(self):
        result = self.rpc.task("add").delay(2, 3)
        self.assertEqual(result.get(timeout=RESULT), 5)
        self.assertEqual(result.state, "SUCCESS")

    def test_group_rpc_backend(self):
        add = self.rpc.task("add")
        result = group([add.s(i, i) for i in range(10)]).apply_async()
        self.assertEqual(result.get(timeout=RESULT), [2 * i for i in range(10)])

    def test_retry_twice_then_succeed(self):
        result = self.rpc.task("flaky").delay(2)
        self.assertEqual(result.get(timeout=RESULT), {"attempts": 3})

    def test_retries_exhausted_fail(self):
        result = self.rpc.task("flaky").delay(10)  # more failures than max_retries=5
        with self.assertRaises(RuntimeError) as cm:
            result.get(timeout=RESULT)
        self.assertIn("attempt 6 fails", str(cm.exception))
        self.assertEqual(result.state, "FAILURE")

    # file:// backend

    def test_task_file_backend(self):
        self.assertEqual(self.file.task("add").delay(20, 22).get(timeout=RESULT), 42)

    def test_chord(self):
        add, tsum = self.file.task("add"), self.file.task("tsum")
        result = chord([add.s(i, i) for i in range(5)])(tsum.s())
        self.assertEqual(result.get(timeout=RESULT), sum(2 * i for i in range(5)))


if __name__ == "__main__":
    unittest.main()
