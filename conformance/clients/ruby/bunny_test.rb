# frozen_string_literal: true

# Black-box conformance tests for the Bunny client, run against WARREN_URL with Minitest:
#   WARREN_URL=amqp://guest:guest@127.0.0.1:5672/ ruby conformance/clients/ruby/bunny_test.rb -v
# Everything here passes against RabbitMQ 3.10.
require 'logger'
require 'securerandom'
require 'bunny'
require 'minitest/autorun'
require_relative 'results_reporter'

# Bunny follows the AMQP URI spec, where a path of "/" names the vhost "" (other clients take it as
# the default vhost "/"). An URL ending in "/" is therefore given to Bunny without its path.
URL = ENV.fetch('WARREN_URL', 'amqp://guest:guest@127.0.0.1:5672/').sub(%r{\A(amqps?://[^/]*)/\z}, '\\1')
# How long a test waits for something the broker should do promptly, in seconds.
WAIT = 5.0

class BunnyTest < Minitest::Test
  def setup
    @conn = connect
    @ch = @conn.create_channel
  end

  def teardown
    @conn.close if @conn&.open?
  rescue StandardError
    nil
  ensure
    delete_queues(@durable_queues) if @durable_queues
  end

  # Deletes the durable queues a test declared, over a connection of its own.
  def delete_queues(names)
    conn = connect
    ch = conn.create_channel
    names.each { |name| ch.queue_delete(name) }
    conn.close
  rescue StandardError
    nil
  end

  # helpers

  def connect(url = URL)
    conn = Bunny.new(url, automatically_recover: false, logger: Logger.new(nil))
    conn.start
    conn
  end

  def unique(prefix)
    "conf-#{prefix}-#{SecureRandom.hex(5)}"
  end

  # Polls the block until it returns a truthy value, which is returned.
  def wait_until(what = 'condition', timeout = WAIT)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      value = yield
      return value if value
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) >= deadline
        flunk "timed out after #{timeout}s waiting for #{what}"
      end
      sleep 0.02
    end
  end

  # basic.get polled until a message arrives: [delivery_info, properties, payload].
  def pop(queue, manual_ack: true)
    wait_until("a message on #{queue.name}") do
      triple = queue.pop(manual_ack: manual_ack)
      triple[0] ? triple : nil
    end
  end

  def exclusive_queue(prefix = 'q', arguments = {})
    @ch.queue(unique(prefix), exclusive: true, arguments: arguments)
  end

  def ready_count(name, channel = @ch)
    channel.queue_declare(name, passive: true).message_count
  end

  # connect

  def test_connect
    assert @conn.open?
    assert @ch.open?
    other = @conn.create_channel
    refute_equal @ch.id, other.id
    other.close
    assert other.closed?
    assert @ch.open?
    refute_nil @conn.server_properties
  end

  def test_connect_bad_credentials
    assert_raises(Bunny::PossibleAuthenticationFailureError) do
      connect(URL.sub(%r{(//[^:/@]+:)[^@]*@}, '\\1wrong@'))
    end
  end

  # declare

  def test_declare_exchanges
    %i[direct fanout topic headers].each do |kind|
      name = unique(kind.to_s)
      x = @ch.exchange(name, type: kind, auto_delete: false)
      assert_equal name, x.name
      @ch.exchange_declare(name, kind.to_s, passive: true)
      x.delete
    end
  end

  def test_declare_queue
    name = unique('q')
    q = @ch.queue(name, exclusive: true)
    assert_equal name, q.name
    assert_equal 0, q.message_count
    assert_equal 0, q.consumer_count
    @ch.default_exchange.publish('1', routing_key: name)
    @ch.default_exchange.publish('2', routing_key: name)
    wait_until('message_count 2') { q.message_count == 2 }
  end

  def test_declare_server_named_queue
    q = @ch.queue('', exclusive: true)
    assert_match(/\Aamq\.gen-/, q.name)
  end

  def test_passive_declare_missing_queue
    err = assert_raises(Bunny::NotFound) { @ch.queue(unique('missing'), passive: true) }
    assert_equal 404, err.channel_close.reply_code
    assert @ch.closed?
    assert @conn.open?, 'a channel error leaves the connection open'
    @conn.create_channel.queue('', exclusive: true)
  end

  def test_redeclare_with_other_arguments_fails
    name = unique('q')
    @ch.queue(name, exclusive: true, arguments: { 'x-max-length' => 10 })
    assert_raises(Bunny::PreconditionFailed) do
      @ch.queue_declare(name, exclusive: true, arguments: { 'x-max-length' => 20 })
    end
  end

  # bind and route

  def test_bind_topic
    x = @ch.topic(unique('topic'), auto_delete: true)
    q = exclusive_queue
    q.bind(x, routing_key: 'stock.*.nyse')
    q.bind(x, routing_key: 'audit.#')
    %w[stock.ibm.nyse stock.ibm.lse audit audit.a.b other].each { |k| x.publish(k, routing_key: k) }
    got = Array.new(3) { pop(q, manual_ack: false)[0].routing_key }
    assert_equal %w[stock.ibm.nyse audit audit.a.b], got
    assert_nil q.pop[0]
  end

  def test_bind_fanout_and_unbind
    x = @ch.fanout(unique('fanout'), auto_delete: true)
    q1 = exclusive_queue.bind(x)
    q2 = exclusive_queue.bind(x)
    x.publish('both')
    assert_equal 'both', pop(q1, manual_ack: false)[2]
    assert_equal 'both', pop(q2, manual_ack: false)[2]
    q2.unbind(x)
    x.publish('only-q1')
    assert_equal 'only-q1', pop(q1, manual_ack: false)[2]
    assert_equal 0, q2.message_count
  end

  def test_bind_headers
    x = @ch.headers(unique('headers'), auto_delete: true)
    q = exclusive_queue.bind(x, arguments: { 'x-match' => 'all', 'format' => 'pdf', 'type' => 'report' })
    x.publish('no', headers: { 'format' => 'pdf' })
    x.publish('yes', headers: { 'format' => 'pdf', 'type' => 'report' })
    assert_equal 'yes', pop(q, manual_ack: false)[2]
    assert_nil q.pop[0]
  end

  def test_exchange_to_exchange_binding
    src = @ch.direct(unique('src'), auto_delete: true)
    dst = @ch.fanout(unique('dst'), auto_delete: true)
    dst.bind(src, routing_key: 'k')
    q = exclusive_queue.bind(dst)
    src.publish('via-e2e', routing_key: 'k')
    assert_equal 'via-e2e', pop(q, manual_ack: false)[2]
  end

  # publish and consume

  def test_publish_consume_properties
    q = exclusive_queue
    headers = { 'str' => 'v', 'int' => 42, 'bool' => true, 'nested' => { 'k' => 'v' }, 'list' => [1, 'two'] }
    @ch.default_exchange.publish('{"hello":"world"}', routing_key: q.name,
                                 content_type: 'application/json', content_encoding: 'utf-8',
                                 persistent: true, priority: 3, correlation_id: 'corr-1',
                                 reply_to: 'replies', message_id: 'm-1', timestamp: 1_700_000_000,
                                 type: 'greeting', app_id: 'conformance', headers: headers)
    got = Queue.new
    consumer = q.subscribe(manual_ack: false) { |info, props, body| got << [info, props, body] }
    info, props, body = Timeout.timeout(WAIT) { got.pop }
    consumer.cancel
    assert_equal '{"hello":"world"}', body
    assert_equal q.name, info.routing_key
    assert_equal '', info.exchange
    refute info.redelivered?
    assert_equal 'application/json', props.content_type
    assert_equal 'utf-8', props.content_encoding
    assert_equal 2, props.delivery_mode
    assert_equal 3, props.priority
    assert_equal 'corr-1', props.correlation_id
    assert_equal 'replies', props.reply_to
    assert_equal 'm-1', props.message_id
    assert_equal 1_700_000_000, props.timestamp.to_i
    assert_equal 'greeting', props.type
    assert_equal 'conformance', props.app_id
    assert_equal headers, props.headers
  end

  def test_consume_in_order
    q = exclusive_queue
    100.times { |i| @ch.default_exchange.publish(i.to_s, routing_key: q.name) }
    bodies = Queue.new
    q.subscribe { |_, _, body| bodies << body }
    got = Timeout.timeout(WAIT) { Array.new(100) { bodies.pop } }
    assert_equal (0...100).map(&:to_s), got
  end

  def test_large_message
    q = exclusive_queue
    body = (0...(1 << 20)).map { |i| (i % 251).chr }.join.b
    @ch.default_exchange.publish(body, routing_key: q.name)
    assert_equal body, pop(q, manual_ack: false)[2].b
  end

  def test_cancel_consumer
    q = exclusive_queue
    got = Queue.new
    consumer = q.subscribe { |_, _, body| got << body }
    @ch.default_exchange.publish('first', routing_key: q.name)
    assert_equal 'first', Timeout.timeout(WAIT) { got.pop }
    consumer.cancel
    @ch.default_exchange.publish('second', routing_key: q.name)
    wait_until('second message left in queue') { q.message_count == 1 }
    assert got.empty?
  end

  # ack, nack, reject

  def test_ack
    q = exclusive_queue
    @ch.default_exchange.publish('m', routing_key: q.name)
    info, = pop(q)
    @ch.ack(info.delivery_tag)
    @ch.close # would requeue an unacked message
    assert_equal 0, ready_count(q.name, @conn.create_channel)
  end

  def test_unacked_requeued_on_channel_close
    q = exclusive_queue
    @ch.default_exchange.publish('m', routing_key: q.name)
    other = @conn.create_channel
    info, = other.basic_get(q.name, manual_ack: true)
    refute_nil info
    other.close
    info, _, body = pop(q, manual_ack: false)
    assert info.redelivered?
    assert_equal 'm', body
  end

  def test_ack_multiple
    q = exclusive_queue
    5.times { |i| @ch.default_exchange.publish(i.to_s, routing_key: q.name) }
    tags = Array.new(5) { pop(q)[0].delivery_tag }
    @ch.ack(tags[3], true)
    @ch.close
    ch = @conn.create_channel
    info, _, body = pop(ch.queue(q.name, passive: true), manual_ack: false)
    assert_equal '4', body
    assert info.redelivered?
    assert_equal 0, ready_count(q.name, ch)
  end

  def test_nack_requeue
    q = exclusive_queue
    @ch.default_exchange.publish('m', routing_key: q.name)
    info, = pop(q)
    refute info.redelivered?
    @ch.nack(info.delivery_tag, false, true)
    info, _, body = pop(q)
    assert info.redelivered?
    assert_equal 'm', body
    @ch.ack(info.delivery_tag)
  end

  def test_nack_no_requeue
    q = exclusive_queue
    @ch.default_exchange.publish('m', routing_key: q.name)
    @ch.nack(pop(q)[0].delivery_tag, false, false)
    assert_equal 0, q.message_count
  end

  def test_nack_multiple_requeue
    q = exclusive_queue
    3.times { |i| @ch.default_exchange.publish(i.to_s, routing_key: q.name) }
    tags = Array.new(3) { pop(q)[0].delivery_tag }
    @ch.nack(tags.last, true, true)
    assert_equal %w[0 1 2], Array.new(3) { pop(q, manual_ack: false)[2] }
  end

  def test_reject_requeue
    q = exclusive_queue
    @ch.default_exchange.publish('m', routing_key: q.name)
    @ch.reject(pop(q)[0].delivery_tag, true)
    info, = pop(q, manual_ack: false)
    assert info.redelivered?
  end

  def test_reject_no_requeue
    q = exclusive_queue
    @ch.default_exchange.publish('m', routing_key: q.name)
    @ch.reject(pop(q)[0].delivery_tag, false)
    assert_equal 0, q.message_count
  end

  def test_ack_unknown_tag_closes_channel
    errors = Queue.new
    @ch.on_error { |_ch, close| errors << close }
    q = exclusive_queue
    @ch.default_exchange.publish('m', routing_key: q.name)
    info, = pop(q)
    @ch.ack(info.delivery_tag.to_i + 100)
    close = Timeout.timeout(WAIT) { errors.pop }
    assert_equal 406, close.reply_code
    wait_until('channel closed') { @ch.closed? }
  end

  # prefetch

  def test_prefetch
    q = exclusive_queue
    5.times { |i| @ch.default_exchange.publish(i.to_s, routing_key: q.name) }
    @ch.prefetch(2)
    got = []
    lock = Mutex.new
    q.subscribe(manual_ack: true) { |info, _, body| lock.synchronize { got << [info, body] } }
    count = -> { lock.synchronize { got.size } }
    wait_until('two deliveries') { count.call == 2 }
    sleep 0.3
    assert_equal 2, count.call, 'prefetch 2 must stop at 2 unacked deliveries'
    assert_equal 3, ready_count(q.name, @conn.create_channel)
    @ch.ack(got[0][0].delivery_tag)
    wait_until('a third delivery') { count.call == 3 }
    sleep 0.3
    assert_equal 3, count.call
    @ch.ack(got[2][0].delivery_tag, true)
    wait_until('all five') { count.call == 5 }
    assert_equal %w[0 1 2 3 4], got.map { |_, body| body }
  end

  # publisher confirms

  def test_confirms
    q = exclusive_queue
    @ch.confirm_select
    50.times { |i| @ch.default_exchange.publish(i.to_s, routing_key: q.name, persistent: true) }
    assert @ch.wait_for_confirms, 'every message confirmed positively'
    assert_empty @ch.unconfirmed_set
    assert_empty @ch.nacked_set
    assert_equal 50, q.message_count
  end

  def test_confirms_unroutable_mandatory
    returned = Queue.new
    @ch.confirm_select
    x = @ch.default_exchange
    x.on_return { |info, _props, body| returned << [info, body] }
    nowhere = unique('nowhere')
    x.publish('lost', routing_key: nowhere, mandatory: true)
    assert @ch.wait_for_confirms
    info, body = Timeout.timeout(WAIT) { returned.pop }
    assert_equal 312, info.reply_code
    assert_equal nowhere, info.routing_key
    assert_equal 'lost', body
  end

  # mandatory returns

  def test_mandatory_return
    returned = Queue.new
    x = @ch.direct(unique('direct'), auto_delete: true)
    x.on_return { |info, props, body| returned << [info, props, body] }
    q = exclusive_queue.bind(x, routing_key: 'bound')
    x.publish('back', routing_key: 'unbound', mandatory: true, message_id: 'r-1')
    x.publish('routed', routing_key: 'bound', mandatory: true)
    info, props, body = Timeout.timeout(WAIT) { returned.pop }
    assert_equal 312, info.reply_code
    assert_equal 'NO_ROUTE', info.reply_text
    assert_equal x.name, info.exchange
    assert_equal 'unbound', info.routing_key
    assert_equal 'r-1', props.message_id
    assert_equal 'back', body
    assert_equal 'routed', pop(q, manual_ack: false)[2]
    sleep 0.2
    assert returned.empty?, 'a routed mandatory message must not come back'
  end

  def test_publish_to_missing_exchange_closes_channel
    @ch.confirm_select
    x = @ch.exchange(unique('missing'), type: :direct, no_declare: true)
    x.publish('m', routing_key: 'k')
    # The channel.close arrives instead of a confirm.
    wait_until('channel closed') { @ch.closed? }
    assert @conn.open?
  end

  # dead-lettering and TTL

  def dead_letter_setup(arguments = {})
    dlx = @ch.fanout(unique('dlx'), auto_delete: true)
    dlq = exclusive_queue('dlq').bind(dlx)
    src = exclusive_queue('src', arguments.merge('x-dead-letter-exchange' => dlx.name))
    [src, dlq]
  end

  def assert_death(props, queue_name, reason, count = 1)
    deaths = props.headers['x-death']
    assert_equal 1, deaths.size, deaths.inspect
    death = deaths[0]
    assert_equal queue_name, death['queue']
    assert_equal reason, death['reason']
    assert_equal count, death['count']
    assert_equal '', death['exchange']
    assert_equal [queue_name], death['routing-keys']
    assert_equal queue_name, props.headers['x-first-death-queue']
    assert_equal reason, props.headers['x-first-death-reason']
  end

  def test_dead_letter_on_reject
    src, dlq = dead_letter_setup
    @ch.default_exchange.publish('bad', routing_key: src.name, headers: { 'keep' => 'me' })
    @ch.reject(pop(src)[0].delivery_tag, false)
    info, props, body = pop(dlq, manual_ack: false)
    assert_equal 'bad', body
    assert_equal src.name, info.routing_key
    assert_equal 'me', props.headers['keep']
    assert_death(props, src.name, 'rejected')
  end

  def test_dead_letter_on_nack
    src, dlq = dead_letter_setup
    @ch.default_exchange.publish('bad', routing_key: src.name)
    @ch.nack(pop(src)[0].delivery_tag, false, false)
    assert_death(pop(dlq, manual_ack: false)[1], src.name, 'rejected')
  end

  def test_dead_letter_routing_key
    dlx = @ch.direct(unique('dlx'), auto_delete: true)
    dlq = exclusive_queue('dlq').bind(dlx, routing_key: 'dead')
    src = exclusive_queue('src', 'x-dead-letter-exchange' => dlx.name, 'x-dead-letter-routing-key' => 'dead')
    @ch.default_exchange.publish('m', routing_key: src.name)
    @ch.reject(pop(src)[0].delivery_tag, false)
    info, props, = pop(dlq, manual_ack: false)
    assert_equal 'dead', info.routing_key
    assert_death(props, src.name, 'rejected')
  end

  def test_dead_letter_count_increments
    name = unique('loop')
    q = @ch.queue(name, exclusive: true,
                        arguments: { 'x-dead-letter-exchange' => '', 'x-dead-letter-routing-key' => name })
    @ch.default_exchange.publish('m', routing_key: name)
    (1..3).each do |n|
      info, props, = pop(q)
      assert_death(props, name, 'rejected', n - 1) if n > 1
      @ch.reject(info.delivery_tag, false)
    end
    assert_death(pop(q, manual_ack: false)[1], name, 'rejected', 3)
  end

  def test_queue_ttl_expiry_dead_letters
    src, dlq = dead_letter_setup('x-message-ttl' => 100)
    @ch.default_exchange.publish('old', routing_key: src.name)
    _, props, body = pop(dlq, manual_ack: false)
    assert_equal 'old', body
    assert_death(props, src.name, 'expired')
  end

  def test_per_message_ttl_dead_letters
    src, dlq = dead_letter_setup
    @ch.default_exchange.publish('short', routing_key: src.name, expiration: '100')
    _, props, = pop(dlq, manual_ack: false)
    assert_death(props, src.name, 'expired')
    assert_equal '100', props.headers['x-death'][0]['original-expiration']
    assert_nil props.expiration, 'expiration is removed when dead-lettered'
  end

  def test_queue_ttl_without_dlx_drops
    q = exclusive_queue('ttl', 'x-message-ttl' => 50)
    @ch.confirm_select
    @ch.default_exchange.publish('gone', routing_key: q.name)
    assert @ch.wait_for_confirms # the broker has enqueued it
    wait_until('the expired message to leave') { q.message_count.zero? }
    assert_nil q.pop[0]
  end

  # streams: x-queue-type stream, durable, read with a prefetch count, manual acks and the
  # x-stream-offset consumer argument; every delivery carries its offset in x-stream-offset.

  STREAM_N = 10
  STREAM_ARGS = { 'x-queue-type' => 'stream' }.freeze

  # Deliveries collected by a consumer's callback (on the channel's work pool thread).
  class Deliveries
    def initialize
      @lock = Mutex.new
      @items = []
    end

    def <<(item)
      @lock.synchronize { @items << item }
    end

    def size
      @lock.synchronize { @items.size }
    end

    def to_a
      @lock.synchronize { @items.dup }
    end
  end

  # Declares a durable stream (deleted in teardown) and publishes count messages "0", "1", ...
  # with publisher confirms; returns its name.
  def stream(count = STREAM_N)
    name = unique('stream')
    q = @ch.queue(name, durable: true, arguments: STREAM_ARGS)
    assert_equal name, q.name
    (@durable_queues ||= []) << name
    stream_publish(name, 0...count)
    name
  end

  # Publishes each number once the previous one is confirmed. RabbitMQ writes a stream in chunks
  # and credits its consumers a whole chunk at a time, so a prefetch is exact only when each
  # message is a chunk of its own.
  def stream_publish(name, numbers)
    ch = @conn.create_channel
    ch.confirm_select
    numbers.each do |i|
      ch.default_exchange.publish(i.to_s, routing_key: name, persistent: true)
      assert ch.wait_for_confirms, "message #{i} confirmed"
    end
    ch.close
  end

  # Subscribes to stream `name` on a channel of its own with a prefetch; offset nil sends no
  # x-stream-offset (RabbitMQ's default is "next"). Returns the channel and Deliveries of
  # [body, x-stream-offset header, delivery_info]; acks each delivery when ack is set.
  def stream_consume(name, offset: nil, prefetch: 3, ack: true)
    ch = @conn.create_channel
    ch.prefetch(prefetch)
    got = Deliveries.new
    arguments = offset.nil? ? {} : { 'x-stream-offset' => offset }
    q = ch.queue(name, durable: true, arguments: STREAM_ARGS)
    q.subscribe(manual_ack: true, arguments: arguments) do |info, props, body|
      got << [body, props.headers['x-stream-offset'], info]
      ch.ack(info.delivery_tag) if ack
    end
    [ch, got]
  end

  # The deliveries are exactly the messages numbered `numbers`, in order, each with its offset
  # (message i was published at offset i).
  def assert_stream(got, numbers)
    items = got.to_a
    assert_equal numbers.map(&:to_s), items.map { |body, _, _| body }
    assert_equal numbers.to_a, items.map { |_, offset, _| offset }
  end

  def test_stream_consume_from_first
    name = stream
    # prefetch 3 < 10: only acks (credit) let the rest through.
    _, got = stream_consume(name, offset: 'first', prefetch: 3)
    wait_until("#{STREAM_N} deliveries") { got.size == STREAM_N }
    sleep 0.2
    assert_stream(got, 0...STREAM_N)
  end

  def test_stream_consume_from_offset
    name = stream
    _, got = stream_consume(name, offset: 3)
    wait_until("#{STREAM_N - 3} deliveries") { got.size == STREAM_N - 3 }
    sleep 0.2
    assert_stream(got, 3...STREAM_N)
  end

  def test_stream_consume_next_and_default
    name = stream
    _, explicit = stream_consume(name, offset: 'next')
    _, default = stream_consume(name)
    sleep 0.3
    assert_equal 0, explicit.size, 'next must not replay what is already in the stream'
    assert_equal 0, default.size, 'the default offset is next'
    fresh = STREAM_N...(STREAM_N + 3)
    stream_publish(name, fresh)
    wait_until('the 3 new messages on both') { explicit.size == 3 && default.size == 3 }
    sleep 0.2
    assert_stream(explicit, fresh)
    assert_stream(default, fresh)
  end

  def test_stream_consumers_replay_independently
    name = stream
    slow_ch, slow = stream_consume(name, offset: 'first', prefetch: 2, ack: false)
    _, fast = stream_consume(name, offset: 'first', prefetch: 3)
    wait_until("#{STREAM_N} deliveries to the fast consumer") { fast.size == STREAM_N }
    sleep 0.2
    assert_equal 2, slow.size, 'a consumer that does not ack stops at its prefetch'
    assert_stream(fast, 0...STREAM_N)
    while slow.size < STREAM_N
      have = slow.size
      slow_ch.ack(slow.to_a.last[2].delivery_tag, true)
      wait_until('more deliveries after an ack') { slow.size == [have + 2, STREAM_N].min }
    end
    assert_stream(slow, 0...STREAM_N)
    # Reading deletes nothing: a new consumer replays it all again.
    _, again = stream_consume(name, offset: 'first')
    wait_until("#{STREAM_N} deliveries on replay") { again.size == STREAM_N }
    assert_stream(again, 0...STREAM_N)
  end

  # basic.get on a stream is refused with 540, a connection error, which Bunny 2.19 cannot map to
  # an exception class ("Unknown reply code"), so the refusal this suite observes is the 406.
  def test_stream_consume_without_prefetch_refused
    name = stream(1)
    ch = @conn.create_channel
    q = ch.queue(name, durable: true, arguments: STREAM_ARGS)
    err = assert_raises(Bunny::PreconditionFailed) do
      q.subscribe(manual_ack: true, arguments: { 'x-stream-offset' => 'first' }) { |*| nil }
    end
    assert_equal 406, err.channel_close.reply_code
    wait_until('channel closed') { ch.closed? }
    assert @conn.open?, 'a channel error leaves the connection open'
  end

  # quorum queues: x-queue-type quorum, durable only. RabbitMQ 3.10 puts a requeued message at the
  # tail of a quorum queue, so the requeue tests use one message each. Redeliveries carry
  # x-delivery-count; past x-delivery-limit a message is dead-lettered with reason delivery_limit
  # (limit 1: delivered twice, dead-lettered on the second return).

  QUORUM_ARGS = { 'x-queue-type' => 'quorum' }.freeze

  # Declares a durable quorum queue (deleted in teardown) with the given extra x-arguments;
  # returns its name.
  def quorum(arguments = {})
    name = unique('quorum')
    q = @ch.queue(name, durable: true, arguments: QUORUM_ARGS.merge(arguments))
    assert_equal name, q.name
    (@durable_queues ||= []) << name
    name
  end

  # Publishes persistent messages with publisher confirms and waits for them all.
  def quorum_publish(name, bodies, **properties)
    ch = @conn.create_channel
    ch.confirm_select
    bodies.each { |body| ch.default_exchange.publish(body, routing_key: name, persistent: true, **properties) }
    assert ch.wait_for_confirms, 'every message confirmed positively'
    ch.close
  end

  # Subscribes with manual acks and a prefetch on a channel of its own. Returns the channel and
  # Deliveries of [delivery_info, properties, body].
  def quorum_consume(name, prefetch)
    ch = @conn.create_channel
    ch.prefetch(prefetch)
    got = Deliveries.new
    ch.queue(name, durable: true, arguments: QUORUM_ARGS, no_declare: true)
      .subscribe(manual_ack: true) { |info, props, body| got << [info, props, body] }
    [ch, got]
  end

  def test_quorum_confirms_prefetch_ack
    name = quorum
    quorum_publish(name, %w[0 1 2 3 4])
    assert_equal 5, ready_count(name)
    ch, got = quorum_consume(name, 2)
    wait_until('two deliveries') { got.size == 2 }
    sleep 0.3
    assert_equal 2, got.size, 'prefetch 2 must stop at 2 unacked deliveries'
    ch.ack(got.to_a[1][0].delivery_tag, true)
    wait_until('four deliveries') { got.size == 4 }
    sleep 0.3
    assert_equal 4, got.size
    ch.ack(got.to_a[3][0].delivery_tag, true)
    wait_until('all five') { got.size == 5 }
    ch.ack(got.to_a[4][0].delivery_tag)
    assert_equal %w[0 1 2 3 4], got.to_a.map { |_, _, body| body }
    assert(got.to_a.none? { |info, _, _| info.redelivered? })
    # Closing the channel would requeue anything unacked: the acks emptied the queue.
    ch.close
    assert_equal 0, ready_count(name)
  end

  def test_quorum_redelivery_count
    name = quorum
    quorum_publish(name, ['m'])
    ch, got = quorum_consume(name, 1)
    wait_until('the delivery') { got.size == 1 }
    refute got.to_a[0][0].redelivered?
    ch.nack(got.to_a[0][0].delivery_tag, false, true)
    wait_until('the redelivery after nack') { got.size == 2 }
    info, props, body = got.to_a[1]
    assert info.redelivered?
    assert_equal 'm', body
    assert_equal 1, props.headers['x-delivery-count']
    ch.reject(info.delivery_tag, true)
    wait_until('the redelivery after reject') { got.size == 3 }
    info, props, = got.to_a[2]
    assert info.redelivered?
    assert_equal 2, props.headers['x-delivery-count']
    ch.ack(info.delivery_tag)
    ch.close
    assert_equal 0, ready_count(name)
  end

  def test_quorum_delivery_limit_dead_letters
    # The default exchange as DLX, with x-dead-letter-routing-key naming the DLQ.
    dlq = exclusive_queue('dlq')
    name = quorum('x-delivery-limit' => 1, 'x-dead-letter-exchange' => '',
                  'x-dead-letter-routing-key' => dlq.name)
    quorum_publish(name, ['poison'], headers: { 'keep' => 'me' })
    ch, got = quorum_consume(name, 1)
    wait_until('the delivery') { got.size == 1 }
    ch.nack(got.to_a[0][0].delivery_tag, false, true)
    wait_until('the redelivery') { got.size == 2 }
    assert_equal 1, got.to_a[1][1].headers['x-delivery-count']
    ch.nack(got.to_a[1][0].delivery_tag, false, true)
    info, props, body = pop(dlq, manual_ack: false)
    assert_equal 'poison', body
    assert_equal dlq.name, info.routing_key
    assert_equal 'me', props.headers['keep']
    assert_death(props, name, 'delivery_limit')
    refute props.headers.key?('x-delivery-count'), props.headers.inspect
    sleep 0.2
    assert_equal 2, got.size, 'a dead-lettered message is not delivered again'
    ch.close
    assert_equal 0, ready_count(name)
  end

  def test_quorum_non_durable_refused
    name = unique('quorum')
    err = assert_raises(Bunny::PreconditionFailed) do
      @ch.queue(name, durable: false, arguments: QUORUM_ARGS)
    end
    assert_equal 406, err.channel_close.reply_code
    assert err.channel_close.reply_text.start_with?(
      "PRECONDITION_FAILED - invalid property 'non-durable' for queue '#{name}'"
    ), err.channel_close.reply_text
    assert_raises(Bunny::NotFound) { @conn.create_channel.queue(name, passive: true) }
  end

  def test_quorum_exclusive_auto_delete_server_named_refused
    name = unique('quorum')
    [[{ exclusive: true }, "PRECONDITION_FAILED - invalid property 'exclusive-owner'"],
     [{ auto_delete: true }, "PRECONDITION_FAILED - invalid property 'auto-delete'"],
     [{ server_named: true }, 'PRECONDITION_FAILED']].each do |options, prefix|
      queue_name = options.delete(:server_named) ? '' : name
      err = assert_raises(Bunny::PreconditionFailed) do
        @conn.create_channel.queue(queue_name, durable: true, arguments: QUORUM_ARGS, **options)
      end
      assert_equal 406, err.channel_close.reply_code
      assert err.channel_close.reply_text.start_with?(prefix), err.channel_close.reply_text
    end
  end
end
