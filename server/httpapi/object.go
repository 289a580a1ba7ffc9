package httpapi

// object is a JSON object kept as a slice of fields in key order: what the long lists (a queue
// per row, 10,000 rows and more) are built from. A map[string]any of thirty fields and its
// nested rate maps cost a dozen allocations and their hashing per row; an object costs one
// slice. The encoder writes the fields in the order they are in, so a builder calls sorted
// once it has them all, and the output is what encoding/json writes for the same map.
// lookupPath and pickColumns read objects as they read maps.
type object []field

type field struct {
	key string
	val any
}

// set replaces key's value or adds the field.
func (o *object) set(key string, v any) {
	for i := range *o {
		if (*o)[i].key == key {
			(*o)[i].val = v
			return
		}
	}
	*o = append(*o, field{key, v})
}

// get is key's value and whether the object has the key.
func (o object) get(key string) (any, bool) {
	for _, f := range o {
		if f.key == key {
			return f.val, true
		}
	}
	return nil, false
}

// sorted orders the fields by key, as encoding/json orders a map's. It is an insertion sort:
// builders add their fields in order, so it usually only checks.
func (o object) sorted() object {
	for i := 1; i < len(o); i++ {
		for j := i; j > 0 && o[j].key < o[j-1].key; j-- {
			o[j], o[j-1] = o[j-1], o[j]
		}
	}
	return o
}

// MarshalJSON lets encoding/json write an object too.
func (o object) MarshalJSON() ([]byte, error) { return marshalJSON(o) }

// rateDetail is RabbitMQ's {"rate": r} detail object without a map.
type rateDetail float64

// MarshalJSON lets encoding/json write a rateDetail too.
func (r rateDetail) MarshalJSON() ([]byte, error) { return marshalJSON(r) }

// member is the value of key in v (a map, an object or a rate detail) and whether v has it.
func member(v any, key string) (any, bool) {
	switch m := v.(type) {
	case map[string]any:
		x, ok := m[key]
		return x, ok
	case object:
		return m.get(key)
	case rateDetail:
		if key == "rate" {
			return float64(m), true
		}
	}
	return nil, false
}
