package amqp

// WithHeader returns raw basic properties with one header set to v, or removed when v is nil. The
// original bytes are never modified (other queues may share them); properties that cannot be
// decoded come back unchanged. Queues use it to add x-delivery-count, x-stream-offset and the
// like to a delivered copy.
func WithHeader(raw []byte, name string, v any) []byte {
	props, err := DecodeProperties(raw)
	if err != nil {
		return raw
	}
	if _, ok := props.Headers[name]; !ok && v == nil {
		return raw
	}
	h := make(Table, len(props.Headers)+1)
	for k, x := range props.Headers {
		h[k] = x
	}
	if v == nil {
		delete(h, name)
	} else {
		h[name] = v
	}
	props.Headers = h
	props.Flags = 0
	return props.Append(nil)
}
