<?php
// Base class of Warren's php-amqplib conformance tests: one connection and channel per test,
// unique names, and polling helpers with a deadline.
declare(strict_types=1);

use PhpAmqpLib\Channel\AMQPChannel;
use PhpAmqpLib\Connection\AMQPStreamConnection;
use PhpAmqpLib\Exception\AMQPTimeoutException;
use PhpAmqpLib\Message\AMQPMessage;
use PhpAmqpLib\Wire\AMQPTable;
use PHPUnit\Framework\TestCase;

abstract class ConformanceTestCase extends TestCase
{
    /** How long a test waits for something the broker should do promptly, in seconds. */
    protected const WAIT = 5.0;

    protected AMQPStreamConnection $conn;
    protected AMQPChannel $ch;

    protected function setUp(): void
    {
        $this->conn = self::connect();
        $this->ch = $this->conn->channel();
    }

    protected function tearDown(): void
    {
        try {
            $this->conn->close();
        } catch (\Throwable $e) {
            // already closed by the test
        }
    }

    /** Connects to WARREN_URL (amqp://user:pass@host:port/vhost), optionally with other credentials. */
    public static function connect(?string $password = null): AMQPStreamConnection
    {
        $url = getenv('WARREN_URL') ?: 'amqp://guest:guest@127.0.0.1:5672/';
        $p = parse_url($url);
        $path = $p['path'] ?? '/';
        $vhost = ($path === '' || $path === '/') ? '/' : rawurldecode(substr($path, 1));
        return new AMQPStreamConnection(
            $p['host'] ?? '127.0.0.1',
            $p['port'] ?? 5672,
            rawurldecode($p['user'] ?? 'guest'),
            $password ?? rawurldecode($p['pass'] ?? 'guest'),
            $vhost
        );
    }

    protected static function unique(string $prefix): string
    {
        return sprintf('conf-%s-%s', $prefix, bin2hex(random_bytes(5)));
    }

    /** Polls $fn until it returns a truthy value, which is returned. */
    protected function waitUntil(callable $fn, string $what, float $timeout = self::WAIT)
    {
        $deadline = microtime(true) + $timeout;
        for (;;) {
            $value = $fn();
            if ($value) {
                return $value;
            }
            if (microtime(true) >= $deadline) {
                $this->fail(sprintf('timed out after %.1fs waiting for %s', $timeout, $what));
            }
            usleep(20000);
        }
    }

    /** basic.get polled until a message arrives. */
    protected function get(string $queue, bool $noAck = false, ?AMQPChannel $ch = null): AMQPMessage
    {
        $ch = $ch ?? $this->ch;
        return $this->waitUntil(fn () => $ch->basic_get($queue, $noAck), "a message on $queue");
    }

    /** An exclusive queue with the given x-arguments. */
    protected function queue(string $prefix = 'q', array $arguments = []): string
    {
        [$name] = $this->ch->queue_declare(self::unique($prefix), false, false, true, false, false,
            new AMQPTable($arguments));
        return $name;
    }

    protected function readyCount(string $queue, ?AMQPChannel $ch = null): int
    {
        [, $count] = ($ch ?? $this->ch)->queue_declare($queue, true);
        return (int) $count;
    }

    /** Runs the channel's event loop until $done() is true. */
    protected function waitFor(callable $done, string $what, ?AMQPChannel $ch = null): void
    {
        $ch = $ch ?? $this->ch;
        $deadline = microtime(true) + self::WAIT;
        while (!$done()) {
            $left = $deadline - microtime(true);
            if ($left <= 0) {
                $this->fail("timed out waiting for $what");
            }
            try {
                $ch->wait(null, false, min($left, 0.2));
            } catch (AMQPTimeoutException $e) {
                // nothing arrived in this slice
            }
        }
    }

    /** Processes whatever arrives on the channel during $seconds. */
    protected function waitQuietly(float $seconds, ?AMQPChannel $ch = null): void
    {
        $ch = $ch ?? $this->ch;
        $deadline = microtime(true) + $seconds;
        while (($left = $deadline - microtime(true)) > 0) {
            try {
                $ch->wait(null, false, $left);
            } catch (AMQPTimeoutException $e) {
                return;
            }
        }
    }

    protected static function headers(AMQPMessage $msg): array
    {
        return $msg->has('application_headers') ? $msg->get('application_headers')->getNativeData() : [];
    }
}
