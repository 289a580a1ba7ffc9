"""Helpers shared by Warren's Python client suites (pika, kombu) and the Celery test.

The suites are black-box tests: they only know the broker URL, taken from the WARREN_URL
environment variable (for example amqp://guest:guest@127.0.0.1:5672/).
"""

import os
import time
import uuid

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"

# How long a test waits for something the broker should do promptly.
WAIT = 5.0


def broker_url():
    """The broker under test, from WARREN_URL."""
    return os.environ.get("WARREN_URL") or DEFAULT_URL


def unique(prefix):
    """A name no other test (or earlier run) uses: prefix plus a random suffix."""
    return "conf-%s-%s" % (prefix, uuid.uuid4().hex[:10])


def wait_until(predicate, timeout=WAIT, interval=0.02, what="condition"):
    """Polls predicate until it returns a truthy value, which is returned.

    Raises AssertionError naming `what` when the deadline passes first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def as_str(value):
    """Header values may arrive as bytes or str depending on the client; compare as str."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return value
