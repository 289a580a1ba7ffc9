<?php
// Stream queues through php-amqplib against WARREN_URL: a durable queue with x-queue-type
// stream, consumers with basic_qos, manual acks and the x-stream-offset consumer argument;
// every delivery carries its offset in the x-stream-offset header. Everything here passes
// against RabbitMQ 3.10.
declare(strict_types=1);

use PhpAmqpLib\Channel\AMQPChannel;
use PhpAmqpLib\Exception\AMQPConnectionClosedException;
use PhpAmqpLib\Exception\AMQPProtocolChannelException;
use PhpAmqpLib\Exception\AMQPTimeoutException;
use PhpAmqpLib\Message\AMQPMessage;
use PhpAmqpLib\Wire\AMQPTable;

final class StreamTest extends ConformanceTestCase
{
    private const N = 10;

    /** @var string[] streams declared by the test, deleted in tearDown */
    private array $streams = [];

    protected function tearDown(): void
    {
        parent::tearDown();
        if ($this->streams === []) {
            return;
        }
        // A connection of its own: the test's connection may have been closed by the broker.
        $conn = self::connect();
        $ch = $conn->channel();
        foreach ($this->streams as $name) {
            $ch->queue_delete($name);
        }
        $conn->close();
    }

    /** Declares a durable stream and publishes $count messages "0", "1", ... with confirms. */
    private function stream(int $count = self::N): string
    {
        $name = self::unique('stream');
        [$got] = $this->ch->queue_declare($name, false, true, false, false, false,
            new AMQPTable(['x-queue-type' => 'stream']));
        $this->assertSame($name, $got);
        $this->streams[] = $name;
        $this->publish($name, range(0, $count - 1));
        return $name;
    }

    /**
     * Publishes each number once the previous one is confirmed. RabbitMQ writes a stream in
     * chunks and credits its consumers a whole chunk at a time, so a prefetch is exact only when
     * each message is a chunk of its own.
     */
    private function publish(string $queue, array $numbers): void
    {
        $ch = $this->conn->channel();
        $acked = 0;
        $ch->set_ack_handler(function () use (&$acked) {
            $acked++;
        });
        $ch->set_nack_handler(function () {
            $this->fail('a stream publish was nacked');
        });
        $ch->confirm_select();
        foreach ($numbers as $i) {
            $ch->basic_publish(new AMQPMessage((string) $i, ['delivery_mode' => 2]), '', $queue);
            $ch->wait_for_pending_acks(self::WAIT);
        }
        $this->assertSame(count($numbers), $acked);
        $ch->close();
    }

    /**
     * Consumes $queue on a channel of its own with basic_qos $prefetch; a null $offset sends no
     * x-stream-offset (RabbitMQ's default is "next"). $got fills with [body, x-stream-offset
     * header, message]; each delivery is acked when $ack is set.
     */
    private function consume(string $queue, ?array &$got, $offset = null, int $prefetch = 3, bool $ack = true): AMQPChannel
    {
        $ch = $this->conn->channel();
        $ch->basic_qos(0, $prefetch, false);
        $got = [];
        $arguments = $offset === null ? [] : ['x-stream-offset' => $offset];
        $ch->basic_consume($queue, '', false, false, false, false,
            function (AMQPMessage $m) use (&$got, $ack) {
                $got[] = [$m->getBody(), self::headers($m)['x-stream-offset'] ?? null, $m];
                if ($ack) {
                    $m->ack();
                }
            }, null, new AMQPTable($arguments));
        return $ch;
    }

    /**
     * Runs the event loops of $channels (one connection, so frames for one channel wait in its
     * queue while another is read) until $done() is true, or for $seconds when $done is null.
     */
    private function pump(array $channels, ?callable $done, string $what, float $seconds = self::WAIT): void
    {
        $deadline = microtime(true) + $seconds;
        while ($done === null || !$done()) {
            if (microtime(true) >= $deadline) {
                if ($done === null) {
                    return;
                }
                $this->fail("timed out waiting for $what");
            }
            foreach ($channels as $ch) {
                try {
                    $ch->wait(null, false, 0.02);
                } catch (AMQPTimeoutException $e) {
                    // nothing for this channel in this slice
                }
            }
        }
    }

    /** The deliveries are exactly the messages numbered $numbers, in order, each at its offset. */
    private function assertStream(array $got, array $numbers): void
    {
        $this->assertSame(array_map('strval', $numbers), array_map(fn ($d) => $d[0], $got));
        $this->assertSame($numbers, array_map(fn ($d) => $d[1], $got));
    }

    public function testStreamConsumeFromFirst(): void
    {
        $q = $this->stream();
        // prefetch 3 < 10: only acks (credit) let the rest through.
        $ch = $this->consume($q, $got, 'first', 3);
        $this->pump([$ch], function () use (&$got) { return count($got) === self::N; }, 'all deliveries');
        $this->pump([$ch], null, 'nothing more', 0.2);
        $this->assertStream($got, range(0, self::N - 1));
    }

    public function testStreamConsumeFromOffset(): void
    {
        $q = $this->stream();
        $ch = $this->consume($q, $got, 3);
        $this->pump([$ch], function () use (&$got) { return count($got) === self::N - 3; }, 'deliveries from 3');
        $this->pump([$ch], null, 'nothing more', 0.2);
        $this->assertStream($got, range(3, self::N - 1));
    }

    public function testStreamConsumeNextAndDefault(): void
    {
        $q = $this->stream();
        $explicitCh = $this->consume($q, $explicit, 'next');
        $defaultCh = $this->consume($q, $default);
        $channels = [$explicitCh, $defaultCh];
        $this->pump($channels, null, 'nothing', 0.3);
        $this->assertSame([], $explicit, 'next must not replay what is already in the stream');
        $this->assertSame([], $default, 'the default offset is next');
        $fresh = range(self::N, self::N + 2);
        $this->publish($q, $fresh);
        $this->pump($channels, function () use (&$explicit, &$default) {
            return count($explicit) === 3 && count($default) === 3;
        }, 'the 3 new messages on both');
        $this->pump($channels, null, 'nothing more', 0.2);
        $this->assertStream($explicit, $fresh);
        $this->assertStream($default, $fresh);
    }

    public function testStreamConsumersReplayIndependently(): void
    {
        $q = $this->stream();
        $slowCh = $this->consume($q, $slow, 'first', 2, false);
        $fastCh = $this->consume($q, $fast, 'first', 3);
        $channels = [$slowCh, $fastCh];
        $this->pump($channels, function () use (&$fast) { return count($fast) === self::N; }, 'the fast consumer');
        $this->pump($channels, null, 'nothing more', 0.2);
        $this->assertCount(2, $slow, 'a consumer that does not ack stops at its prefetch');
        $this->assertStream($fast, range(0, self::N - 1));
        while (count($slow) < self::N) {
            $want = min(count($slow) + 2, self::N);
            end($slow)[2]->ack(true);
            $this->pump([$slowCh], function () use (&$slow, $want) { return count($slow) === $want; }, 'more after an ack');
        }
        $this->assertStream($slow, range(0, self::N - 1));
        // Reading deletes nothing: a new consumer replays it all again.
        $againCh = $this->consume($q, $again, 'first');
        $this->pump([$againCh], function () use (&$again) { return count($again) === self::N; }, 'the replay');
        $this->assertStream($again, range(0, self::N - 1));
    }

    public function testStreamBasicGetClosesConnection(): void
    {
        $q = $this->stream(1);
        // 540 NOT_IMPLEMENTED is a connection error: the whole connection is closed.
        try {
            $this->ch->basic_get($q);
            $this->fail('basic.get on a stream succeeded');
        } catch (AMQPConnectionClosedException $e) {
            $this->assertSame(540, $e->getCode());
            $this->assertStringContainsString('NOT_IMPLEMENTED', $e->getMessage());
        }
        $this->assertFalse($this->conn->isConnected());
    }

    public function testStreamConsumeWithoutPrefetchFails(): void
    {
        $q = $this->stream(1);
        $ch = $this->conn->channel();
        try {
            $ch->basic_consume($q, '', false, false, false, false, function () {
            }, null, new AMQPTable(['x-stream-offset' => 'first']));
            $this->fail('a stream consumer without a prefetch count was accepted');
        } catch (AMQPProtocolChannelException $e) {
            $this->assertSame(406, $e->getCode());
            $this->assertStringContainsString('PRECONDITION_FAILED', $e->getMessage());
        }
        $this->assertTrue($this->conn->isConnected(), 'a channel error leaves the connection open');
    }
}
