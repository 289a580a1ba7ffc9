<?php
// Black-box conformance tests for php-amqplib against WARREN_URL. Everything here passes
// against RabbitMQ 3.10.
declare(strict_types=1);

use PhpAmqpLib\Exception\AMQPConnectionClosedException;
use PhpAmqpLib\Exception\AMQPProtocolChannelException;
use PhpAmqpLib\Message\AMQPMessage;
use PhpAmqpLib\Wire\AMQPTable;

final class AmqplibTest extends ConformanceTestCase
{
    // connect

    public function testConnect(): void
    {
        $this->assertTrue($this->conn->isConnected());
        $props = $this->conn->getServerProperties();
        $this->assertArrayHasKey('capabilities', $props);
        $other = $this->conn->channel();
        $this->assertNotSame($this->ch->getChannelId(), $other->getChannelId());
        $other->close();
        $this->assertTrue($this->ch->is_open());
    }

    public function testConnectBadCredentials(): void
    {
        $this->expectException(AMQPConnectionClosedException::class);
        $this->expectExceptionCode(403);
        self::connect('not-the-password');
    }

    // declare

    public function testDeclareExchanges(): void
    {
        foreach (['direct', 'fanout', 'topic', 'headers'] as $kind) {
            $name = self::unique($kind);
            $this->assertNull($this->ch->exchange_declare($name, $kind, false, false, false));
            $this->ch->exchange_declare($name, $kind, true); // passive
            $this->ch->exchange_delete($name);
        }
    }

    public function testDeclareQueue(): void
    {
        $name = self::unique('q');
        [$got, $messages, $consumers] = $this->ch->queue_declare($name, false, false, true, false);
        $this->assertSame([$name, 0, 0], [$got, $messages, $consumers]);
        $this->ch->basic_publish(new AMQPMessage('1'), '', $name);
        $this->ch->basic_publish(new AMQPMessage('2'), '', $name);
        $this->waitUntil(fn () => $this->readyCount($name) === 2, 'message_count 2');
    }

    public function testDeclareServerNamedQueue(): void
    {
        [$name] = $this->ch->queue_declare('', false, false, true, true);
        $this->assertStringStartsWith('amq.gen-', $name);
    }

    public function testPassiveDeclareMissingQueue(): void
    {
        try {
            $this->ch->queue_declare(self::unique('missing'), true);
            $this->fail('passive declare of a missing queue succeeded');
        } catch (AMQPProtocolChannelException $e) {
            $this->assertSame(404, $e->getCode());
            $this->assertStringContainsString('NOT_FOUND', $e->getMessage());
        }
        // The connection survives a channel error.
        $this->conn->channel()->queue_declare('', false, false, true, true);
        $this->assertTrue($this->conn->isConnected());
    }

    public function testRedeclareWithOtherArgumentsFails(): void
    {
        $name = $this->queue('q', ['x-max-length' => 10]);
        $this->expectException(AMQPProtocolChannelException::class);
        $this->expectExceptionCode(406);
        $this->ch->queue_declare($name, false, false, true, false, false, new AMQPTable(['x-max-length' => 20]));
    }

    // bind and route

    public function testBindTopic(): void
    {
        $x = self::unique('topic');
        $this->ch->exchange_declare($x, 'topic', false, false, true);
        $q = $this->queue();
        $this->ch->queue_bind($q, $x, 'stock.*.nyse');
        $this->ch->queue_bind($q, $x, 'audit.#');
        foreach (['stock.ibm.nyse', 'stock.ibm.lse', 'audit', 'audit.a.b', 'other'] as $key) {
            $this->ch->basic_publish(new AMQPMessage($key), $x, $key);
        }
        $got = [];
        for ($i = 0; $i < 3; $i++) {
            $got[] = $this->get($q, true)->getRoutingKey();
        }
        $this->assertSame(['stock.ibm.nyse', 'audit', 'audit.a.b'], $got);
        $this->assertNull($this->ch->basic_get($q, true));
    }

    public function testBindFanoutAndUnbind(): void
    {
        $x = self::unique('fanout');
        $this->ch->exchange_declare($x, 'fanout', false, false, true);
        $q1 = $this->queue();
        $q2 = $this->queue();
        $this->ch->queue_bind($q1, $x);
        $this->ch->queue_bind($q2, $x);
        $this->ch->basic_publish(new AMQPMessage('both'), $x);
        $this->assertSame('both', $this->get($q1, true)->getBody());
        $this->assertSame('both', $this->get($q2, true)->getBody());
        $this->ch->queue_unbind($q2, $x);
        $this->ch->basic_publish(new AMQPMessage('only-q1'), $x);
        $this->assertSame('only-q1', $this->get($q1, true)->getBody());
        $this->assertSame(0, $this->readyCount($q2));
    }

    public function testBindHeaders(): void
    {
        $x = self::unique('headers');
        $this->ch->exchange_declare($x, 'headers', false, false, true);
        $q = $this->queue();
        $this->ch->queue_bind($q, $x, '', false, new AMQPTable(['x-match' => 'all', 'format' => 'pdf', 'type' => 'report']));
        $this->ch->basic_publish(new AMQPMessage('no', ['application_headers' => new AMQPTable(['format' => 'pdf'])]), $x);
        $this->ch->basic_publish(new AMQPMessage('yes', ['application_headers' => new AMQPTable(['format' => 'pdf', 'type' => 'report'])]), $x);
        $this->assertSame('yes', $this->get($q, true)->getBody());
        $this->assertNull($this->ch->basic_get($q, true));
    }

    public function testExchangeToExchangeBinding(): void
    {
        $src = self::unique('src');
        $dst = self::unique('dst');
        $this->ch->exchange_declare($src, 'direct', false, false, true);
        $this->ch->exchange_declare($dst, 'fanout', false, false, true);
        $this->ch->exchange_bind($dst, $src, 'k');
        $q = $this->queue();
        $this->ch->queue_bind($q, $dst);
        $this->ch->basic_publish(new AMQPMessage('via-e2e'), $src, 'k');
        $this->assertSame('via-e2e', $this->get($q, true)->getBody());
    }

    // publish and consume

    public function testPublishConsumeProperties(): void
    {
        $q = $this->queue();
        $headers = ['str' => 'v', 'int' => 42, 'bool' => true, 'nested' => ['k' => 'v'], 'list' => [1, 'two']];
        $props = [
            'content_type' => 'application/json', 'content_encoding' => 'utf-8',
            'delivery_mode' => AMQPMessage::DELIVERY_MODE_PERSISTENT, 'priority' => 3,
            'correlation_id' => 'corr-1', 'reply_to' => 'replies', 'message_id' => 'm-1',
            'timestamp' => 1700000000, 'type' => 'greeting', 'app_id' => 'conformance',
        ];
        $this->ch->basic_publish(
            new AMQPMessage('{"hello":"world"}', $props + ['application_headers' => new AMQPTable($headers)]), '', $q);
        $got = null;
        $this->ch->basic_consume($q, '', false, true, false, false, function (AMQPMessage $m) use (&$got) {
            $got = $m;
        });
        $this->waitFor(function () use (&$got) { return $got !== null; }, 'a delivery');
        $this->assertSame('{"hello":"world"}', $got->getBody());
        $this->assertSame($q, $got->getRoutingKey());
        $this->assertSame('', $got->getExchange());
        $this->assertFalse((bool) $got->isRedelivered());
        foreach ($props as $name => $value) {
            $this->assertEquals($value, $got->get($name), $name);
        }
        $this->assertEquals($headers, self::headers($got));
    }

    public function testConsumeInOrder(): void
    {
        $q = $this->queue();
        for ($i = 0; $i < 100; $i++) {
            $this->ch->basic_publish(new AMQPMessage((string) $i), '', $q);
        }
        $bodies = [];
        $this->ch->basic_consume($q, '', false, true, false, false, function (AMQPMessage $m) use (&$bodies) {
            $bodies[] = $m->getBody();
        });
        $this->waitFor(function () use (&$bodies) { return count($bodies) === 100; }, '100 deliveries');
        $this->assertSame(array_map('strval', range(0, 99)), $bodies);
    }

    public function testLargeMessage(): void
    {
        $q = $this->queue();
        $body = str_repeat(implode('', array_map('chr', range(0, 250))), 4200);
        $this->ch->basic_publish(new AMQPMessage($body), '', $q);
        $this->assertSame($body, $this->get($q, true)->getBody());
    }

    public function testCancelConsumer(): void
    {
        $q = $this->queue();
        $got = [];
        $tag = $this->ch->basic_consume($q, '', false, true, false, false, function (AMQPMessage $m) use (&$got) {
            $got[] = $m->getBody();
        });
        $this->ch->basic_publish(new AMQPMessage('first'), '', $q);
        $this->waitFor(function () use (&$got) { return count($got) === 1; }, 'first delivery');
        $this->ch->basic_cancel($tag);
        $this->ch->basic_publish(new AMQPMessage('second'), '', $q);
        $this->waitUntil(fn () => $this->readyCount($q) === 1, 'second message left in queue');
        $this->assertSame(['first'], $got);
    }

    // ack, nack, reject

    public function testAck(): void
    {
        $q = $this->queue();
        $this->ch->basic_publish(new AMQPMessage('m'), '', $q);
        $this->get($q)->ack();
        $this->ch->close(); // would requeue an unacked message
        $this->assertSame(0, $this->readyCount($q, $this->conn->channel()));
    }

    public function testUnackedRequeuedOnChannelClose(): void
    {
        $q = $this->queue();
        $this->ch->basic_publish(new AMQPMessage('m'), '', $q);
        $other = $this->conn->channel();
        $this->assertFalse((bool) $this->get($q, false, $other)->isRedelivered());
        $other->close();
        $msg = $this->get($q, true);
        $this->assertTrue((bool) $msg->isRedelivered());
        $this->assertSame('m', $msg->getBody());
    }

    public function testAckMultiple(): void
    {
        $q = $this->queue();
        for ($i = 0; $i < 5; $i++) {
            $this->ch->basic_publish(new AMQPMessage((string) $i), '', $q);
        }
        $msgs = [];
        for ($i = 0; $i < 5; $i++) {
            $msgs[] = $this->get($q);
        }
        $msgs[3]->ack(true);
        $this->ch->close();
        $ch = $this->conn->channel();
        $msg = $this->get($q, true, $ch);
        $this->assertSame('4', $msg->getBody());
        $this->assertTrue((bool) $msg->isRedelivered());
        $this->assertSame(0, $this->readyCount($q, $ch));
    }

    public function testNackRequeue(): void
    {
        $q = $this->queue();
        $this->ch->basic_publish(new AMQPMessage('m'), '', $q);
        $msg = $this->get($q);
        $this->assertFalse((bool) $msg->isRedelivered());
        $msg->nack(true);
        $msg = $this->get($q);
        $this->assertTrue((bool) $msg->isRedelivered());
        $msg->ack();
    }

    public function testNackNoRequeue(): void
    {
        $q = $this->queue();
        $this->ch->basic_publish(new AMQPMessage('m'), '', $q);
        $this->get($q)->nack(false);
        $this->assertSame(0, $this->readyCount($q));
    }

    public function testNackMultipleRequeue(): void
    {
        $q = $this->queue();
        for ($i = 0; $i < 3; $i++) {
            $this->ch->basic_publish(new AMQPMessage((string) $i), '', $q);
        }
        $msgs = [$this->get($q), $this->get($q), $this->get($q)];
        $msgs[2]->nack(true, true);
        $bodies = [];
        for ($i = 0; $i < 3; $i++) {
            $bodies[] = $this->get($q, true)->getBody();
        }
        $this->assertSame(['0', '1', '2'], $bodies);
    }

    public function testRejectRequeue(): void
    {
        $q = $this->queue();
        $this->ch->basic_publish(new AMQPMessage('m'), '', $q);
        $this->get($q)->reject(true);
        $this->assertTrue((bool) $this->get($q, true)->isRedelivered());
    }

    public function testRejectNoRequeue(): void
    {
        $q = $this->queue();
        $this->ch->basic_publish(new AMQPMessage('m'), '', $q);
        $this->get($q)->reject(false);
        $this->assertSame(0, $this->readyCount($q));
    }

    public function testAckUnknownTagClosesChannel(): void
    {
        $q = $this->queue();
        $this->ch->basic_publish(new AMQPMessage('m'), '', $q);
        $msg = $this->get($q);
        $this->ch->basic_ack($msg->getDeliveryTag() + 100);
        $this->expectException(AMQPProtocolChannelException::class);
        $this->expectExceptionCode(406);
        $this->readyCount($q); // the next round trip sees the channel.close
    }

    // prefetch

    public function testPrefetch(): void
    {
        $q = $this->queue();
        for ($i = 0; $i < 5; $i++) {
            $this->ch->basic_publish(new AMQPMessage((string) $i), '', $q);
        }
        $this->ch->basic_qos(0, 2, false);
        $got = [];
        $this->ch->basic_consume($q, '', false, false, false, false, function (AMQPMessage $m) use (&$got) {
            $got[] = $m;
        });
        $this->waitFor(function () use (&$got) { return count($got) === 2; }, 'two deliveries');
        $this->waitQuietly(0.3);
        $this->assertCount(2, $got, 'prefetch 2 must stop at 2 unacked deliveries');
        $this->assertSame(3, $this->readyCount($q, $this->conn->channel()));
        $got[0]->ack();
        $this->waitFor(function () use (&$got) { return count($got) === 3; }, 'a third delivery');
        $this->waitQuietly(0.3);
        $this->assertCount(3, $got);
        $got[2]->ack(true);
        $this->waitFor(function () use (&$got) { return count($got) === 5; }, 'all five');
        $this->assertSame(['0', '1', '2', '3', '4'], array_map(fn ($m) => $m->getBody(), $got));
    }

    // publisher confirms

    public function testConfirms(): void
    {
        $q = $this->queue();
        $acked = 0;
        $nacked = 0;
        $this->ch->set_ack_handler(function () use (&$acked) {
            $acked++;
        });
        $this->ch->set_nack_handler(function () use (&$nacked) {
            $nacked++;
        });
        $this->ch->confirm_select();
        for ($i = 0; $i < 50; $i++) {
            $this->ch->basic_publish(new AMQPMessage((string) $i, ['delivery_mode' => 2]), '', $q);
        }
        $this->ch->wait_for_pending_acks(self::WAIT);
        $this->assertSame(50, $acked);
        $this->assertSame(0, $nacked);
        $this->assertSame(50, $this->readyCount($q));
    }

    public function testConfirmsUnroutableMandatory(): void
    {
        $returned = [];
        $this->ch->set_return_listener(function ($code, $text, $exchange, $key, AMQPMessage $m) use (&$returned) {
            $returned[] = [$code, $key, $m->getBody()];
        });
        $acked = 0;
        $this->ch->set_ack_handler(function () use (&$acked) {
            $acked++;
        });
        $this->ch->confirm_select();
        $nowhere = self::unique('nowhere');
        $this->ch->basic_publish(new AMQPMessage('lost'), '', $nowhere, true);
        $this->ch->wait_for_pending_acks_returns(self::WAIT);
        $this->assertSame(1, $acked);
        $this->assertSame([[312, $nowhere, 'lost']], $returned);
    }

    // mandatory returns

    public function testMandatoryReturn(): void
    {
        $returned = [];
        $this->ch->set_return_listener(function ($code, $text, $exchange, $key, AMQPMessage $m) use (&$returned) {
            $returned[] = [$code, $text, $exchange, $key, $m];
        });
        $x = self::unique('direct');
        $this->ch->exchange_declare($x, 'direct', false, false, true);
        $q = $this->queue();
        $this->ch->queue_bind($q, $x, 'bound');
        $this->ch->basic_publish(new AMQPMessage('back', ['message_id' => 'r-1']), $x, 'unbound', true);
        $this->ch->basic_publish(new AMQPMessage('routed'), $x, 'bound', true);
        $this->waitFor(function () use (&$returned) { return count($returned) === 1; }, 'basic.return');
        [$code, $text, $exchange, $key, $msg] = $returned[0];
        $this->assertSame(312, $code);
        $this->assertSame('NO_ROUTE', $text);
        $this->assertSame($x, $exchange);
        $this->assertSame('unbound', $key);
        $this->assertSame('r-1', $msg->get('message_id'));
        $this->assertSame('back', $msg->getBody());
        $this->assertSame('routed', $this->get($q, true)->getBody());
        $this->waitQuietly(0.2);
        $this->assertCount(1, $returned, 'a routed mandatory message must not come back');
    }

    public function testPublishToMissingExchangeClosesChannel(): void
    {
        $this->ch->basic_publish(new AMQPMessage('m'), self::unique('missing'), 'k');
        $this->expectException(AMQPProtocolChannelException::class);
        $this->expectExceptionCode(404);
        $this->ch->queue_declare('', false, false, true, true); // the next round trip sees the close
    }

    // dead-lettering and TTL

    /** A fanout DLX with a queue bound to it, and a source queue dead-lettering to it. */
    private function deadLetterSetup(array $arguments = []): array
    {
        $dlx = self::unique('dlx');
        $this->ch->exchange_declare($dlx, 'fanout', false, false, true);
        $dlq = $this->queue('dlq');
        $this->ch->queue_bind($dlq, $dlx);
        $src = $this->queue('src', $arguments + ['x-dead-letter-exchange' => $dlx]);
        return [$src, $dlq];
    }

    private function assertDeath(AMQPMessage $msg, string $queue, string $reason, int $count = 1): void
    {
        $h = self::headers($msg);
        $deaths = $h['x-death'];
        $this->assertCount(1, $deaths, json_encode($deaths));
        $this->assertSame($queue, $deaths[0]['queue']);
        $this->assertSame($reason, $deaths[0]['reason']);
        $this->assertSame($count, $deaths[0]['count']);
        $this->assertSame('', $deaths[0]['exchange']);
        $this->assertSame([$queue], $deaths[0]['routing-keys']);
        $this->assertSame($queue, $h['x-first-death-queue']);
        $this->assertSame($reason, $h['x-first-death-reason']);
    }

    public function testDeadLetterOnReject(): void
    {
        [$src, $dlq] = $this->deadLetterSetup();
        $this->ch->basic_publish(new AMQPMessage('bad', ['application_headers' => new AMQPTable(['keep' => 'me'])]), '', $src);
        $this->get($src)->reject(false);
        $msg = $this->get($dlq, true);
        $this->assertSame('bad', $msg->getBody());
        $this->assertSame($src, $msg->getRoutingKey());
        $this->assertSame('me', self::headers($msg)['keep']);
        $this->assertDeath($msg, $src, 'rejected');
    }

    public function testDeadLetterOnNack(): void
    {
        [$src, $dlq] = $this->deadLetterSetup();
        $this->ch->basic_publish(new AMQPMessage('bad'), '', $src);
        $this->get($src)->nack(false);
        $this->assertDeath($this->get($dlq, true), $src, 'rejected');
    }

    public function testDeadLetterRoutingKey(): void
    {
        $dlx = self::unique('dlx');
        $this->ch->exchange_declare($dlx, 'direct', false, false, true);
        $dlq = $this->queue('dlq');
        $this->ch->queue_bind($dlq, $dlx, 'dead');
        $src = $this->queue('src', ['x-dead-letter-exchange' => $dlx, 'x-dead-letter-routing-key' => 'dead']);
        $this->ch->basic_publish(new AMQPMessage('m'), '', $src);
        $this->get($src)->reject(false);
        $msg = $this->get($dlq, true);
        $this->assertSame('dead', $msg->getRoutingKey());
        $this->assertDeath($msg, $src, 'rejected');
    }

    public function testDeadLetterCountIncrements(): void
    {
        $name = self::unique('loop');
        $this->ch->queue_declare($name, false, false, true, false, false,
            new AMQPTable(['x-dead-letter-exchange' => '', 'x-dead-letter-routing-key' => $name]));
        $this->ch->basic_publish(new AMQPMessage('m'), '', $name);
        for ($n = 1; $n <= 3; $n++) {
            $msg = $this->get($name);
            if ($n > 1) {
                $this->assertDeath($msg, $name, 'rejected', $n - 1);
            }
            $msg->reject(false);
        }
        $this->assertDeath($this->get($name, true), $name, 'rejected', 3);
    }

    public function testQueueTtlExpiryDeadLetters(): void
    {
        [$src, $dlq] = $this->deadLetterSetup(['x-message-ttl' => 100]);
        $this->ch->basic_publish(new AMQPMessage('old'), '', $src);
        $msg = $this->get($dlq, true);
        $this->assertSame('old', $msg->getBody());
        $this->assertDeath($msg, $src, 'expired');
    }

    public function testPerMessageTtlDeadLetters(): void
    {
        [$src, $dlq] = $this->deadLetterSetup();
        $this->ch->basic_publish(new AMQPMessage('short', ['expiration' => '100']), '', $src);
        $msg = $this->get($dlq, true);
        $this->assertDeath($msg, $src, 'expired');
        $this->assertSame('100', self::headers($msg)['x-death'][0]['original-expiration']);
        $this->assertFalse($msg->has('expiration'), 'expiration is removed when dead-lettered');
    }

    public function testQueueTtlWithoutDlxDrops(): void
    {
        $q = $this->queue('ttl', ['x-message-ttl' => 50]);
        $this->ch->confirm_select();
        $this->ch->basic_publish(new AMQPMessage('gone'), '', $q);
        $this->ch->wait_for_pending_acks(self::WAIT); // the broker has enqueued it
        $this->waitUntil(fn () => $this->readyCount($q) === 0, 'the expired message to leave');
        $this->assertNull($this->ch->basic_get($q, true));
    }
}
