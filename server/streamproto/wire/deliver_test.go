package wire

import (
	"bytes"
	"encoding/hex"
	"testing"

	"warren/stream/osiris"
)

// TestDeliverStoredChunk sends a stored chunk as RabbitMQ does: the deliver header, then the
// chunk's header and data as stored (no bloom filter, no trailer). Rebuilt from the records of
// the deliver frame RabbitMQ 3.10.8 sent, the frame is byte for byte the one it sent.
func TestDeliverStoredChunk(t *testing.T) {
	var captured []byte
	for _, h := range readCaptured() {
		raw, _ := hex.DecodeString(h)
		if hd, _ := PeekHeader(raw[4:]); hd.Key == CommandDeliver {
			captured = raw
		}
	}
	if captured == nil {
		t.Fatal("no captured deliver frame")
	}
	var d Deliver
	if err := d.Decode(captured[4:]); err != nil {
		t.Fatal(err)
	}
	sent, err := osiris.ParseDelivered(d.Chunk)
	if err != nil {
		t.Fatal(err)
	}
	var b osiris.Builder
	b.Reset(sent.Type, sent.ChunkID, sent.Timestamp, sent.Epoch, 0)
	for rest := sent.Data; len(rest) > 0; {
		e, next, err := osiris.NextEntry(rest)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Add(e.Data, nil); err != nil {
			t.Fatal(err)
		}
		rest = next
	}
	// The publisher deduplicates ("capture-producer"): its last publishing id is in the trailer.
	if err := b.AddTracking(osiris.TrackingSequence, []byte("capture-producer"), 3); err != nil {
		t.Fatal(err)
	}
	stored, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	chunk, _, err := osiris.Parse(stored)
	if err != nil {
		t.Fatal(err)
	}
	hdr, data := chunk.DeliverParts()
	frame := AppendDeliverHeader(nil, Version1, d.SubscriptionID, 0, uint32(len(hdr)+len(data)))
	frame = append(append(frame, hdr...), data...)
	if !bytes.Equal(frame, captured) {
		t.Fatalf("deliver frame\n %x\nwant %x", frame, captured)
	}
}
