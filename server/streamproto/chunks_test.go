package streamproto_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"

	"warren/server/streamproto/wire"
	"warren/stream/osiris"
)

// A batch published to an idle stream becomes more than one chunk (its first message is
// written at once), as in RabbitMQ: stream stats then report a last chunk id above 0.
func TestBatchAtIdleStreamMakesChunks(t *testing.T) {
	b := startBroker(t)
	e := env(t, b)
	name := declare(t, e, nil)
	p, err := e.NewProducer(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	msgs := make([]message.StreamMessage, 1000)
	for i := range msgs {
		msgs[i] = amqp.NewMessage([]byte("x"))
	}
	if err := p.BatchSend(msgs); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitFor)
	for {
		st, err := e.StreamStats(name)
		if err != nil {
			t.Fatal(err)
		}
		committed, _ := st.CommittedChunkId()
		last, _ := st.LastOffset()
		first, _ := st.FirstOffset()
		if committed > 0 && last > 0 && first == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("first %d, last chunk %d, committed chunk %d", first, last, committed)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A consumer replaying more than the log's chunk cache (8 MiB) gets the older chunks from
// storage: every message arrives, in order, with its body, and each chunk's CRC matches. A second
// consumer reading at the same time gets the same.
func TestReplayBeyondCache(t *testing.T) {
	b := startBroker(t)
	e := env(t, b)
	name := declare(t, e, nil)
	p, err := e.NewProducer(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 12000 // 1 KB each: 12 MB, over the 8 MiB cache
	pad := strings.Repeat("x", 1000)
	// Confirms are counted as they come: the client stops reading the socket while its
	// notification channel is full, so nothing here may wait on the test's publishing loop.
	var confirmed atomic.Int64
	notes := p.NotifyPublishConfirmation()
	go func() {
		for cs := range notes {
			confirmed.Add(int64(len(cs)))
		}
	}()
	for i := 0; i < n; i += 500 {
		msgs := make([]message.StreamMessage, 500)
		for j := range msgs {
			msgs[j] = amqp.NewMessage([]byte(fmt.Sprintf("%06d%s", i+j, pad)))
		}
		if err := p.BatchSend(msgs); err != nil {
			t.Fatal(err)
		}
	}
	pollUntil(t, fmt.Sprintf("%d publishes confirmed", n), waitFor, func() bool { return confirmed.Load() >= n })
	p.Close()
	// Two consumers at once, over raw connections (the Go client's consumer stalls on long
	// replays of large chunks, against RabbitMQ too): every chunk's CRC, every message in order.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for k := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = replayRaw(t, b, name, n, func(i int, msg []byte) error {
				if want := fmt.Sprintf("%06d%s", i, pad); !bytes.HasSuffix(msg, []byte(want)) {
					return fmt.Errorf("message %d: ...%.10q, want %.10q", i, msg[max(0, len(msg)-len(want)):], want)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("consumer %d: %v", k, err)
		}
	}
}

// replayRaw subscribes from the first offset over a raw connection, gives a credit back per
// chunk, checks each chunk's CRC and calls check with each simple entry until n arrived.
func replayRaw(t *testing.T, b broker, name string, n int, check func(i int, msg []byte) error) error {
	c := dialRaw(t, b)
	c.open(0)
	c.send(&wire.Subscribe{CorrelationID: 10, SubscriptionID: 1, Stream: name, Offset: wire.OffsetSpec{Type: wire.OffsetTypeFirst}, Credit: 2})
	if r, ok := c.read().(*wire.Response); !ok || r.Code != wire.ResponseCodeOK {
		return fmt.Errorf("subscribe: %+v", r)
	}
	got := 0
	for got < n {
		d, ok := c.read().(*wire.Deliver)
		if !ok {
			continue
		}
		c.send(&wire.Credit{SubscriptionID: 1, Credit: 1})
		h, err := osiris.ParseHeader(d.Chunk)
		if err != nil {
			return err
		}
		data := d.Chunk[osiris.HeaderSize:]
		if len(data) != int(h.DataLength) || crc32.ChecksumIEEE(data) != h.CRC {
			return fmt.Errorf("chunk %d: %d data bytes (header: %d), CRC mismatch or short", h.ChunkID, len(data), h.DataLength)
		}
		for len(data) > 0 {
			size := binary.BigEndian.Uint32(data)
			if err := check(got, data[4:4+size]); err != nil {
				return err
			}
			data = data[4+size:]
			got++
		}
	}
	return nil
}

// Two publish frames sent back to back, each with a sub-entry batch and a simple entry, are stored
// as they were published, in order, and a sub-entry batch's flags byte keeps only the entry-type
// bit and the compression (the frame's reserved low bits are set here), as osiris writes it.
// (TestReplayBeyondCache fails when records point into the reader's buffer instead of a copy.)
func TestPublishedEntriesStoredAsSent(t *testing.T) {
	b := startBroker(t)
	c := dialRaw(t, b)
	c.open(0)
	name := streamName(t)
	c.send(&wire.CreateStream{CorrelationID: 1, Stream: name})
	if r, ok := c.read().(*wire.Response); !ok || r.Code != wire.ResponseCodeOK {
		t.Fatalf("create: %+v", r)
	}
	c.send(&wire.DeclarePublisher{CorrelationID: 2, PublisherID: 7, Stream: name})
	if r, ok := c.read().(*wire.Response); !ok || r.Code != wire.ResponseCodeOK {
		t.Fatalf("declare publisher: %+v", r)
	}
	batch := func(body string) []byte { // an uncompressed sub-entry batch of one record
		rec := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
		return append(rec, body...)
	}
	var frames [][]byte
	for k, s := range []string{"first", "second"} {
		p := &wire.Publish{PublisherID: 7, Messages: []wire.PublishedMessage{
			{PublishingID: uint64(2*k + 1), SubBatch: true, Records: 1, Data: batch(s + " batched"), UncompressedSize: uint32(len(batch(s + " batched")))},
			{PublishingID: uint64(2*k + 2), Data: []byte(s + " simple")},
		}}
		f, err := p.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		// The sub-entry's flags byte follows the size (4), key and version (4), publisher id (1),
		// count (4) and publishing id (8).
		if f[21] != 0x80 {
			t.Fatalf("flags byte at 21 is %#x", f[21])
		}
		f[21] = 0x8F
		frames = append(frames, f)
	}
	c.sendBytes(append(frames[0], frames[1]...)) // one write: the server reads both in one go
	confirmed := 0
	for confirmed < 4 {
		if pc, ok := c.read().(*wire.PublishConfirm); ok {
			confirmed += len(pc.PublishingIDs)
		}
	}
	c.send(&wire.Subscribe{CorrelationID: 3, SubscriptionID: 1, Stream: name, Offset: wire.OffsetSpec{Type: wire.OffsetTypeFirst}, Credit: 10})
	var got []string
	for len(got) < 4 {
		d, ok := c.read().(*wire.Deliver)
		if !ok {
			continue
		}
		data := d.Chunk[osiris.HeaderSize:]
		for len(data) > 0 {
			if data[0]&0x80 != 0 && data[0] != 0x80 {
				t.Errorf("sub-entry flags byte stored as %#x, want 0x80", data[0])
			}
			e, rest, err := osiris.NextEntry(data)
			if err != nil {
				t.Fatal(err)
			}
			body := e.Data
			if e.SubBatch {
				body = body[4:] // the one record's size
			}
			got = append(got, string(body))
			data = rest
		}
	}
	want := []string{"first batched", "first simple", "second batched", "second simple"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored %q, want %q", got, want)
	}
}
