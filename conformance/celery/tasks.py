"""The Celery application of Warren's end-to-end test.

The worker is started as `python3 -m celery -A tasks worker ...` with these environment
variables, which the test sets:

  WARREN_URL              the broker (amqp://...)
  CELERY_RESULT_BACKEND   rpc:// or file:///some/dir
  CELERY_QUEUE            the queue this worker consumes (unique per test run)

The test process builds its own client apps with make_app(), with the same task names.
"""

import os

from celery import Celery


def make_app(broker, backend, queue):
    """A Celery app whose default queue is `queue`, with the test's tasks registered on it."""
    app = Celery("warren_conformance", broker=broker, backend=backend)
    app.conf.update(
        task_default_queue=queue,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=600,
        broker_connection_retry=False,
        broker_connection_max_retries=0,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=4,
    )

    @app.task(name="conformance.add")
    def add(x, y):
        return x + y

    @app.task(name="conformance.tsum")
    def tsum(numbers):
        return sum(numbers)

    @app.task(name="conformance.flaky", bind=True, max_retries=5)
    def flaky(self, failures):
        """Raises (and retries) `failures` times, then returns how many attempts it took."""
        if self.request.retries < failures:
            raise self.retry(exc=RuntimeError("attempt %d fails" % (self.request.retries + 1)), countdown=0.2)
        return {"attempts": self.request.retries + 1}

    return app


# The worker's app, configured from the environment.
app = make_app(
    os.environ.get("WARREN_URL", "amqp://guest:guest@127.0.0.1:5672/"),
    os.environ.get("CELERY_RESULT_BACKEND", "rpc://"),
    os.environ.get("CELERY_QUEUE", "conformance"),
)
