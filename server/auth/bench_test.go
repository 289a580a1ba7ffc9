package auth

import (
	"testing"
)

// What a login costs: one hash of a short password, per connection attempt.
func BenchmarkVerify(b *testing.B) {
	for _, alg := range []Algorithm{SHA256, SHA512, MD5} {
		h, _ := HashPassword(alg, "a-typical-password")
		b.Run(string(alg), func(b *testing.B) {
			for b.Loop() {
				if !h.Verify("a-typical-password") {
					b.Fatal("no match")
				}
			}
		})
	}
}

// A repeated check of the same credentials on one connection (HTTP keep-alive).
func BenchmarkCacheVerify(b *testing.B) {
	h, _ := HashPassword(SHA256, "a-typical-password")
	var c Cache
	c.Verify(h, "a-typical-password")
	for b.Loop() {
		if !c.Verify(h, "a-typical-password") {
			b.Fatal("no match")
		}
	}
}

// The whole password login of one AMQP connection: blank check, hash, compare.
func BenchmarkAuthenticate(b *testing.B) {
	h, _ := HashPassword(SHA256, "a-typical-password")
	for b.Loop() {
		if err := Authenticate("PLAIN", "user", &h, "a-typical-password", nil); err != nil {
			b.Fatal(err)
		}
	}
}

// What channel.open adds: the checker over the user's shared grants.
func BenchmarkNewChannel(b *testing.B) {
	g, _ := NewGrant(FullAccess)
	for b.Loop() {
		_ = NewChannel("user", "/", []string{TagAdministrator}, g, nil)
	}
}

// The per-publish check, for the full-access grant every default setup has and for a
// prefix pattern.
func BenchmarkPublishCheck(b *testing.B) {
	for name, p := range map[string]Permission{
		"full access": FullAccess,
		"prefix":      {Configure: `^app\.`, Write: `^app\.`, Read: `^app\.`},
		"alternation": {Configure: `^(orders|billing|audit)\..*$`, Write: `^(orders|billing|audit)\..*$`, Read: ".*"},
	} {
		g, err := NewGrant(p)
		if err != nil {
			b.Fatal(err)
		}
		c := NewChannel("user", "/", nil, g, nil)
		exchange := "app.orders"
		if name == "alternation" {
			exchange = "billing.eu"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if err := c.Publish(exchange); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// The per-publish topic check on a topic exchange with a topic permission.
func BenchmarkPublishTopicCheck(b *testing.B) {
	tg, _ := NewTopicGrant("user", "/", TopicPermission{Exchange: "amq.topic", Write: `^{username}\.`, Read: ".*"})
	g, _ := NewGrant(FullAccess)
	c := NewChannel("user", "/", nil, g, map[string]*TopicGrant{"amq.topic": tg})
	for b.Loop() {
		if err := c.PublishTopic("amq.topic", "user.orders.eu"); err != nil {
			b.Fatal(err)
		}
	}
}

// A pattern match without the channel's memory: what the first check of a name costs.
func BenchmarkGrantAllows(b *testing.B) {
	for name, tc := range map[string]struct{ pattern, resource string }{
		"prefix":      {`^app\.`, "app.orders"},
		"alternation": {`^(orders|billing|audit)\..*$`, "billing.eu"},
	} {
		g, err := NewGrant(Permission{Configure: tc.pattern, Write: tc.pattern, Read: tc.pattern})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if !g.Allows(Write, tc.resource) {
					b.Fatal("refused")
				}
			}
		})
	}
}
