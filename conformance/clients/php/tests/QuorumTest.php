<?php
// Quorum queues through php-amqplib against WARREN_URL: a durable queue with x-queue-type
// quorum, publisher confirms, basic_qos, nack/reject with requeue (x-delivery-count on
// redeliveries) and x-delivery-limit dead-lettering with reason delivery_limit. RabbitMQ 3.10
// puts a requeued message at the tail of a quorum queue, so the requeue tests use one message
// each. Everything here passes against RabbitMQ 3.10.
declare(strict_types=1);

use PhpAmqpLib\Channel\AMQPChannel;
use PhpAmqpLib\Exception\AMQPProtocolChannelException;
use PhpAmqpLib\Message\AMQPMessage;
use PhpAmqpLib\Wire\AMQPTable;

final class QuorumTest extends ConformanceTestCase
{
    /** @var string[] quorum queues declared by the test, deleted in tearDown */
    private array $quorums = [];

    protected function tearDown(): void
    {
        parent::tearDown();
        if ($this->quorums === []) {
            return;
        }
        // A connection of its own: the test's connection may have been closed by the broker.
        $conn = self::connect();
        $ch = $conn->channel();
        foreach ($this->quorums as $name) {
            $ch->queue_delete($name);
        }
        $conn->close();
    }

    /** Declares a durable quorum queue with the given extra x-arguments; returns its name. */
    private function quorum(array $arguments = []): string
    {
        $name = self::unique('quorum');
        [$got, $count, $consumers] = $this->ch->queue_declare($name, false, true, false, false, false,
            new AMQPTable(['x-queue-type' => 'quorum'] + $arguments));
        $this->assertSame([$name, 0, 0], [$got, (int) $count, (int) $consumers]);
        $this->quorums[] = $name;
        return $name;
    }

    /** Publishes persistent messages with publisher confirms and waits for them all. */
    private function publish(string $queue, array $bodies, array $headers = []): void
    {
        $ch = $this->conn->channel();
        $acked = 0;
        $ch->set_ack_handler(function () use (&$acked) {
            $acked++;
        });
        $ch->set_nack_handler(function () {
            $this->fail('a quorum publish was nacked');
        });
        $ch->confirm_select();
        $properties = ['delivery_mode' => 2];
        if ($headers !== []) {
            $properties['application_headers'] = new AMQPTable($headers);
        }
        foreach ($bodies as $body) {
            $ch->basic_publish(new AMQPMessage($body, $properties), '', $queue);
        }
        $ch->wait_for_pending_acks(self::WAIT);
        $this->assertSame(count($bodies), $acked);
        $ch->close();
    }

    /** Consumes $queue with manual acks and basic_qos $prefetch on a channel of its own; $got fills with the messages. */
    private function consume(string $queue, ?array &$got, int $prefetch): AMQPChannel
    {
        $ch = $this->conn->channel();
        $ch->basic_qos(0, $prefetch, false);
        $got = [];
        $ch->basic_consume($queue, '', false, false, false, false, function (AMQPMessage $m) use (&$got) {
            $got[] = $m;
        });
        return $ch;
    }

    /** Waits on $ch until $got holds $n messages. */
    private function waitForCount(AMQPChannel $ch, ?array &$got, int $n): void
    {
        $this->waitFor(function () use (&$got, $n) { return count($got) === $n; }, "$n deliveries", $ch);
    }

    public function testQuorumConfirmsPrefetchAck(): void
    {
        $q = $this->quorum();
        $this->publish($q, ['0', '1', '2', '3', '4']);
        $this->assertSame(5, $this->readyCount($q));
        $ch = $this->consume($q, $got, 2);
        $this->waitForCount($ch, $got, 2);
        $this->waitQuietly(0.3, $ch);
        $this->assertCount(2, $got, 'prefetch 2 must stop at 2 unacked deliveries');
        $got[1]->ack(true);
        $this->waitForCount($ch, $got, 4);
        $this->waitQuietly(0.3, $ch);
        $this->assertCount(4, $got);
        $got[3]->ack(true);
        $this->waitForCount($ch, $got, 5);
        $got[4]->ack();
        $this->assertSame(['0', '1', '2', '3', '4'], array_map(fn ($m) => $m->getBody(), $got));
        foreach ($got as $m) {
            $this->assertFalse((bool) $m->isRedelivered());
        }
        // Closing the channel would requeue anything unacked: the acks emptied the queue.
        $ch->close();
        $this->assertSame(0, $this->readyCount($q));
    }

    public function testQuorumRedeliveryCount(): void
    {
        $q = $this->quorum();
        $this->publish($q, ['m']);
        $ch = $this->consume($q, $got, 1);
        $this->waitForCount($ch, $got, 1);
        $this->assertFalse((bool) $got[0]->isRedelivered());
        $got[0]->nack(true);
        $this->waitForCount($ch, $got, 2);
        $this->assertTrue((bool) $got[1]->isRedelivered());
        $this->assertSame('m', $got[1]->getBody());
        $this->assertSame(1, self::headers($got[1])['x-delivery-count']);
        $got[1]->reject(true);
        $this->waitForCount($ch, $got, 3);
        $this->assertTrue((bool) $got[2]->isRedelivered());
        $this->assertSame(2, self::headers($got[2])['x-delivery-count']);
        $got[2]->ack();
        $ch->close();
        $this->assertSame(0, $this->readyCount($q));
    }

    public function testQuorumDeliveryLimitDeadLetters(): void
    {
        $dlx = self::unique('dlx');
        $this->ch->exchange_declare($dlx, 'fanout', false, false, true);
        $dlq = $this->queue('dlq');
        $this->ch->queue_bind($dlq, $dlx);
        $q = $this->quorum(['x-delivery-limit' => 1, 'x-dead-letter-exchange' => $dlx]);
        $this->publish($q, ['poison'], ['keep' => 'me']);
        $ch = $this->consume($q, $got, 1);
        $this->waitForCount($ch, $got, 1);
        $got[0]->nack(true);
        $this->waitForCount($ch, $got, 2);
        $this->assertSame(1, self::headers($got[1])['x-delivery-count']);
        // Limit 1: the second return goes over it, and the message is dead-lettered.
        $got[1]->nack(true);
        $msg = $this->get($dlq, true);
        $this->assertSame('poison', $msg->getBody());
        $this->assertSame($q, $msg->getRoutingKey());
        $h = self::headers($msg);
        $this->assertSame('me', $h['keep']);
        $this->assertCount(1, $h['x-death'], json_encode($h['x-death']));
        $death = $h['x-death'][0];
        $this->assertSame($q, $death['queue']);
        $this->assertSame('delivery_limit', $death['reason']);
        $this->assertSame(1, $death['count']);
        $this->assertSame('', $death['exchange']);
        $this->assertSame([$q], $death['routing-keys']);
        $this->assertSame($q, $h['x-first-death-queue']);
        $this->assertSame('delivery_limit', $h['x-first-death-reason']);
        $this->assertArrayNotHasKey('x-delivery-count', $h);
        $this->waitQuietly(0.2, $ch);
        $this->assertCount(2, $got, 'a dead-lettered message is not delivered again');
        $ch->close();
        $this->assertSame(0, $this->readyCount($q));
    }

    public function testQuorumNonDurableFails(): void
    {
        $name = self::unique('quorum');
        try {
            $this->ch->queue_declare($name, false, false, false, false, false,
                new AMQPTable(['x-queue-type' => 'quorum']));
            $this->fail('a non-durable quorum queue was declared');
        } catch (AMQPProtocolChannelException $e) {
            $this->assertSame(406, $e->getCode());
            $this->assertStringStartsWith(
                "PRECONDITION_FAILED - invalid property 'non-durable' for queue '$name'", $e->getMessage());
        }
        try {
            $this->conn->channel()->queue_declare($name, true);
            $this->fail('the refused quorum queue exists');
        } catch (AMQPProtocolChannelException $e) {
            $this->assertSame(404, $e->getCode());
        }
    }

    public function testQuorumExclusiveAutoDeleteServerNamedFail(): void
    {
        $name = self::unique('quorum');
        $cases = [
            // [queue, exclusive, auto_delete, message prefix]
            [$name, true, false, "PRECONDITION_FAILED - invalid property 'exclusive-owner'"],
            [$name, false, true, "PRECONDITION_FAILED - invalid property 'auto-delete'"],
            ['', false, false, 'PRECONDITION_FAILED'],
        ];
        foreach ($cases as [$queue, $exclusive, $autoDelete, $prefix]) {
            try {
                $this->conn->channel()->queue_declare($queue, false, true, $exclusive, $autoDelete, false,
                    new AMQPTable(['x-queue-type' => 'quorum']));
                $this->fail("quorum declare of '$queue' succeeded");
            } catch (AMQPProtocolChannelException $e) {
                $this->assertSame(406, $e->getCode());
                $this->assertStringStartsWith($prefix, $e->getMessage());
            }
        }
    }
}
