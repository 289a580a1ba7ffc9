package auth

import (
	"errors"
	"net"
	"strings"
	"testing"

	"warren/amqp"
)

func TestCompilePattern(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		match   []string
		nomatch []string
	}{
		{"", []string{""}, []string{"a", " ", "amq.default"}},
		{".*", []string{"", "a", "a\nb", "amq.gen-x"}, nil},
		{"^.*", []string{"", "x", "a\nb"}, nil},
		{"^.*$", []string{"", "x"}, []string{"a\nb"}},
		{".*$", []string{"", "x", "a\nb"}, nil}, // unanchored: "b" at the end matches
		{"foo", []string{"foo", "xfooy", "foo."}, []string{"fo", "FOO"}},
		{`^app\.`, []string{"app.q", "app."}, []string{"xapp.q", "app"}},
		{"^(a|b)$", []string{"a", "b"}, []string{"ab", ""}},
		{"^$", []string{""}, []string{"x"}},
		{"{client_id}", []string{"{client_id}", "x{client_id}"}, []string{"client_id"}},
	} {
		p, err := CompilePattern(tc.pattern)
		if err != nil {
			t.Fatalf("CompilePattern(%q): %v", tc.pattern, err)
		}
		if p.String() != tc.pattern {
			t.Errorf("String() = %q, want %q", p.String(), tc.pattern)
		}
		for _, s := range tc.match {
			if !p.Match(s) {
				t.Errorf("%q does not match %q", tc.pattern, s)
			}
		}
		for _, s := range tc.nomatch {
			if p.Match(s) {
				t.Errorf("%q matches %q", tc.pattern, s)
			}
		}
	}
	for _, bad := range []string{"(", "[a-", "a{2,1}", "(?=x)", `\1`} {
		if _, err := CompilePattern(bad); err == nil {
			t.Errorf("CompilePattern(%q) accepted", bad)
		}
	}
}

func TestNewGrant(t *testing.T) {
	g, err := NewGrant(Permission{Configure: "^c", Write: "^w", Read: ""})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		perm Perm
		name string
		want bool
	}{
		{Configure, "cq", true}, {Configure, "wq", false},
		{Write, "wq", true}, {Write, "cq", false},
		{Read, "", true}, {Read, "rq", false},
		{Perm(9), "cq", false},
	} {
		if got := g.Allows(tc.perm, tc.name); got != tc.want {
			t.Errorf("Allows(%v, %q) = %v", tc.perm, tc.name, got)
		}
	}
	if g.Permission() != (Permission{Configure: "^c", Write: "^w", Read: ""}) {
		t.Errorf("Permission() = %+v", g.Permission())
	}
	for field, p := range map[string]Permission{
		"configure": {Configure: "(", Write: ".*", Read: ".*"},
		"write":     {Configure: ".*", Write: "(", Read: ".*"},
		"read":      {Configure: ".*", Write: ".*", Read: "("},
	} {
		if _, err := NewGrant(p); err == nil || !strings.HasPrefix(err.Error(), field+": invalid regular expression '('") {
			t.Errorf("NewGrant with a bad %s: %v", field, err)
		}
	}
}

func TestTopicGrant(t *testing.T) {
	for _, tc := range []struct {
		name        string
		user, vhost string
		perm        TopicPermission
		extra       map[string]string
		writeOK     []string
		writeNo     []string
		readOK      []string
		readNo      []string
	}{
		{name: "username and vhost", user: "alice", vhost: "prod",
			perm:    TopicPermission{Exchange: "amq.topic", Write: `^{username}\.`, Read: `^{vhost}\.{username}$`},
			writeOK: []string{"alice.x"}, writeNo: []string{"bob.x", "alice"},
			readOK: []string{"prod.alice"}, readNo: []string{"prod.bob", "alice"}},
		{name: "values are not escaped", user: "a.b", vhost: "/",
			perm:    TopicPermission{Write: `^{username}$`, Read: `^{vhost}$`},
			writeOK: []string{"a.b", "axb"}, writeNo: []string{"ab"}, readOK: []string{"/"}},
		{name: "client_id stays literal without a value", user: "u", vhost: "v",
			perm:    TopicPermission{Write: `^{client_id}$`, Read: ".*"},
			writeOK: []string{"{client_id}"}, writeNo: []string{"c1"}, readOK: []string{"anything"}},
		{name: "client_id from the connection", user: "u", vhost: "v",
			perm: TopicPermission{Write: `^{client_id}\.{username}$`, Read: ".*"}, extra: map[string]string{"client_id": "c1", "username": "ignored"},
			writeOK: []string{"c1.u"}, writeNo: []string{"{client_id}.u", "c1.ignored"}},
		{name: "empty pattern allows only the empty key", user: "u", vhost: "v",
			perm:    TopicPermission{Write: "", Read: ""},
			writeOK: []string{""}, writeNo: []string{"a"}, readOK: []string{""}, readNo: []string{"a"}},
		{name: "expansion that does not compile allows nothing", user: "a(b", vhost: "v",
			perm:    TopicPermission{Write: `^{username}$`, Read: ".*"},
			writeNo: []string{"a(b", "", "ab"}, readOK: []string{"a(b"}},
		{name: "expanded in key order, as RabbitMQ", user: "{vhost}", vhost: "v1",
			perm:    TopicPermission{Write: `^{username}$`, Read: ".*"},
			writeOK: []string{"v1"}, writeNo: []string{"{vhost}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := NewTopicGrant(tc.user, tc.vhost, tc.perm)
			if err != nil {
				t.Fatal(err)
			}
			if tc.extra != nil {
				g = g.WithVariables(tc.extra)
			}
			for _, k := range tc.writeOK {
				if !g.Allows(Write, k) {
					t.Errorf("write %q refused", k)
				}
			}
			for _, k := range tc.writeNo {
				if g.Allows(Write, k) {
					t.Errorf("write %q allowed", k)
				}
			}
			for _, k := range tc.readOK {
				if !g.Allows(Read, k) {
					t.Errorf("read %q refused", k)
				}
			}
			for _, k := range tc.readNo {
				if g.Allows(Read, k) {
					t.Errorf("read %q allowed", k)
				}
			}
			if g.Allows(Configure, "") {
				t.Error("configure allowed")
			}
			if g.Permission() != tc.perm {
				t.Errorf("Permission() = %+v", g.Permission())
			}
		})
	}
	if _, err := NewTopicGrant("u", "v", TopicPermission{Write: "(", Read: ".*"}); err == nil || !strings.HasPrefix(err.Error(), "write: ") {
		t.Errorf("bad write pattern: %v", err)
	}
	if _, err := NewTopicGrant("u", "v", TopicPermission{Write: ".*", Read: "["}); err == nil || !strings.HasPrefix(err.Error(), "read: ") {
		t.Errorf("bad read pattern: %v", err)
	}
}

// wantAMQPError checks an error against a reply code and text (code 0: no error).
func wantAMQPError(t *testing.T, what string, err error, code uint16, text string) {
	t.Helper()
	if code == 0 {
		if err != nil {
			t.Errorf("%s: %v, want no error", what, err)
		}
		return
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != code || ae.Text != text {
		t.Errorf("%s: %v\nwant %d %q", what, err, code, text)
	}
}

func TestChannelChecks(t *testing.T) {
	g, err := NewGrant(Permission{Configure: `^[a-z]*c[a-z]*\.`, Write: `^[a-z]*w[a-z]*\.`, Read: `^[a-z]*r[a-z]*\.`})
	if err != nil {
		t.Fatal(err)
	}
	tg, err := NewTopicGrant("u", "v", TopicPermission{Exchange: "t", Write: `^{username}\.`, Read: `^r\.`})
	if err != nil {
		t.Fatal(err)
	}
	c := NewChannel("u", "v", []string{"management"}, g, map[string]*TopicGrant{"t": tg})
	if c.User() != "u" {
		t.Errorf("User() = %q", c.User())
	}
	q := func(name string) string {
		return "ACCESS_REFUSED - access to queue '" + name + "' in vhost 'v' refused for user 'u'"
	}
	x := func(name string) string {
		return "ACCESS_REFUSED - access to exchange '" + name + "' in vhost 'v' refused for user 'u'"
	}
	topic := func(key, exchange string) string {
		return "ACCESS_REFUSED - access to topic '" + key + "' in exchange '" + exchange + "' in vhost 'v' refused for user 'u'"
	}
	const denied = amqp.AccessRefused
	for _, tc := range []struct {
		what string
		err  error
		code uint16
		text string
	}{
		{"exchange.declare allowed", c.ExchangeDeclare("c.x"), 0, ""},
		{"exchange.declare refused", c.ExchangeDeclare("w.x"), denied, x("w.x")},
		{"alternate: read on the exchange", c.AlternateExchange("c.x", "w.ae"), denied, x("c.x")},
		{"alternate: write on the alternate", c.AlternateExchange("cr.x", "r.ae"), denied, x("r.ae")},
		{"alternate allowed", c.AlternateExchange("cr.x", "w.ae"), 0, ""},
		{"exchange.delete", c.ExchangeDelete("r.x"), denied, x("r.x")},
		{"queue.declare allowed", c.QueueDeclare("c.q"), 0, ""},
		{"queue.declare server-named", c.QueueDeclare("amq.gen-abc"), denied, q("amq.gen-abc")},
		{"dead-letter: read on the queue", c.DeadLetterExchange("c.q", "w.dlx"), denied, q("c.q")},
		{"dead-letter: write on the exchange", c.DeadLetterExchange("cr.q", "r.dlx"), denied, x("r.dlx")},
		{"dead-letter to the default exchange", c.DeadLetterExchange("cr.q", ""), denied, x("amq.default")},
		{"queue.delete", c.QueueDelete("w.q"), denied, q("w.q")},
		{"queue.purge", c.QueuePurge("c.q"), denied, q("c.q")},
		{"basic.consume", c.Consume("w.q"), denied, q("w.q")},
		{"basic.consume allowed", c.Consume("r.q"), 0, ""},
		{"basic.get", c.Get("c.q"), denied, q("c.q")},
		{"publish to the default exchange", c.Publish(""), denied, x("amq.default")},
		{"publish allowed", c.Publish("w.x"), 0, ""},
		{"publish refused", c.Publish("r.x"), denied, x("r.x")},
		{"topic publish allowed", c.PublishTopic("t", "u.a"), 0, ""},
		{"topic publish refused", c.PublishTopic("t", "z.a"), denied, topic("z.a", "t")},
		{"topic publish without a topic permission", c.PublishTopic("other", "z.a"), 0, ""},
		{"queue.bind: write on the queue first", c.QueueBind("r.q", "w.x"), denied, q("r.q")},
		{"queue.bind: read on the exchange", c.QueueBind("w.q", "w.x"), denied, x("w.x")},
		{"queue.bind allowed", c.QueueBind("w.q", "r.x"), 0, ""},
		{"exchange.bind: write on the destination", c.ExchangeBind("r.x", "r.y"), denied, x("r.x")},
		{"exchange.bind: read on the source", c.ExchangeBind("w.x", "w.y"), denied, x("w.y")},
		{"exchange.bind allowed", c.ExchangeBind("w.x", "r.y"), 0, ""},
		{"topic bind refused", c.BindTopic("t", "x"), denied, topic("x", "t")},
		{"topic bind allowed", c.BindTopic("t", "r.x"), 0, ""},
		{"user-id unset", c.UserID("", false), 0, ""},
		{"user-id of the user", c.UserID("u", true), 0, ""},
		{"user-id of another", c.UserID("root", true), amqp.PreconditionFailed,
			"PRECONDITION_FAILED - user_id property set to 'root' but authenticated user was 'u'"},
		{"empty user-id set", c.UserID("", true), amqp.PreconditionFailed,
			"PRECONDITION_FAILED - user_id property set to '' but authenticated user was 'u'"},
		{"generic check", c.Check(Read, Exchange, ""), denied, x("amq.default")},
		{"generic topic check", c.CheckTopic(Read, "t", "r.1"), 0, ""},
	} {
		wantAMQPError(t, tc.what, tc.err, tc.code, tc.text)
	}

	imp := NewChannel("u", "v", []string{"impersonator"}, g, nil)
	wantAMQPError(t, "impersonator", imp.UserID("root", true), 0, "")
	none := NewChannel("u", "v", nil, nil, nil)
	wantAMQPError(t, "no grant", none.Consume("r.q"), denied, q("r.q"))
	wantAMQPError(t, "no topic grants", none.PublishTopic("t", "anything"), 0, "")

	long := strings.Repeat("n", 300)
	var ae *amqp.Error
	if err := c.Publish(long); !errors.As(err, &ae) || len(ae.Text) > 255 {
		t.Errorf("a 300-byte name gives a reply text of %d bytes", len(ae.Text))
	}
}

func TestVhostAccess(t *testing.T) {
	g, _ := NewGrant(Permission{}) // a record whose patterns match nothing still opens the vhost
	wantAMQPError(t, "grant", VhostAccess("u", "v", g), 0, "")
	wantAMQPError(t, "no grant", VhostAccess("u", "v", nil), amqp.NotAllowed, "NOT_ALLOWED - access to vhost 'v' refused for user 'u'")
	wantAMQPError(t, "not found", VhostNotFound("nope"), amqp.NotAllowed, "NOT_ALLOWED - vhost nope not found")
	var ae *amqp.Error
	if errors.As(VhostAccess("u", "v", nil), &ae) && !ae.Hard() {
		t.Error("530 is not a connection error")
	}
}

func TestAuthenticate(t *testing.T) {
	h, _ := HashPassword(SHA256, "right")
	for _, tc := range []struct {
		name     string
		stored   *PasswordHash
		password string
		reason   string // "" means accepted
	}{
		{"right password", &h, "right", ""},
		{"wrong password", &h, "wrong", "user 'u' - invalid credentials"},
		{"unknown user", nil, "right", "user 'u' - invalid credentials"},
		{"no stored hash", &PasswordHash{}, "right", "user 'u' - invalid credentials"},
		{"blank password", &h, "", "user 'u' attempted to log in with a blank password, which is prohibited by the internal authN backend. " +
			"To use TLS/x509 certificate-based authentication, see the rabbitmq_auth_mechanism_ssl plugin and configure the client to use the EXTERNAL authentication mechanism. " +
			"Alternatively change the password for the user to be non-blank."},
	} {
		for _, cache := range []*Cache{nil, new(Cache)} {
			err := Authenticate("PLAIN", "u", tc.stored, tc.password, cache)
			if tc.reason == "" {
				if err != nil {
					t.Errorf("%s: %v", tc.name, err)
				}
				continue
			}
			var le *LoginError
			if !errors.As(err, &le) || le.Reason != tc.reason || le.User != "u" || le.Mechanism != "PLAIN" {
				t.Errorf("%s: %#v", tc.name, err)
				continue
			}
			if strings.Contains(le.Error(), tc.password) && tc.password != "" {
				t.Errorf("%s: the error shows the password: %s", tc.name, le.Error())
			}
			if le.Error() != "PLAIN login refused: "+tc.reason {
				t.Errorf("%s: Error() = %q", tc.name, le.Error())
			}
			wantAMQPError(t, tc.name, le.Close(), amqp.AccessRefused,
				"ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile.")
		}
	}
}

func TestCheckLoopback(t *testing.T) {
	tcp := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 1} }
	users := []string{"guest"}
	for _, tc := range []struct {
		user string
		addr net.Addr
		ok   bool
	}{
		{"guest", tcp("127.0.0.1"), true},
		{"guest", tcp("127.8.9.1"), true},
		{"guest", tcp("::1"), true},
		{"guest", tcp("::ffff:127.0.0.1"), true},
		{"guest", tcp("10.0.0.1"), false},
		{"guest", tcp("::ffff:10.0.0.1"), false},
		{"guest", &net.UnixAddr{Name: "/tmp/s", Net: "unix"}, true},
		{"guest", nil, false},
		{"other", tcp("10.0.0.1"), true},
	} {
		err := CheckLoopback("PLAIN", tc.user, users, tc.addr)
		if tc.ok != (err == nil) {
			t.Errorf("%s from %v: %v", tc.user, tc.addr, err)
		}
		var le *LoginError
		if err != nil && (!errors.As(err, &le) || le.Reason != "user 'guest' can only connect via localhost") {
			t.Errorf("%s from %v: reason %v", tc.user, tc.addr, err)
		}
	}
	if err := CheckLoopback("PLAIN", "guest", nil, tcp("10.0.0.1")); err != nil {
		t.Errorf("no loopback users: %v", err)
	}
}

// The channel's memory of passed checks must not let one permission stand for another.
func TestChannelRemembersOnlyWhatPassed(t *testing.T) {
	g, err := NewGrant(Permission{Configure: "^c", Write: "^w", Read: "^r"})
	if err != nil {
		t.Fatal(err)
	}
	c := NewChannel("u", "v", nil, g, nil)
	for i := 0; i < 3; i++ { // again and again, from memory after the first time
		for _, tc := range []struct {
			perm Perm
			kind Kind
			name string
			ok   bool
		}{
			{Write, Exchange, "w.x", true}, {Read, Exchange, "w.x", false}, {Configure, Exchange, "w.x", false},
			{Write, Queue, "w.x", true}, {Read, Queue, "r.q", true}, {Write, Queue, "r.q", false},
			{Configure, Queue, "c1", true}, {Configure, Queue, "c2", true}, {Configure, Queue, "c3", true},
			{Configure, Queue, "c4", true}, {Configure, Queue, "c5", true}, {Read, Queue, "c5", false},
			{Configure, Queue, "", false}, {Configure, Exchange, "", false},
		} {
			if err := c.Check(tc.perm, tc.kind, tc.name); (err == nil) != tc.ok {
				t.Errorf("round %d: Check(%v, %v, %q) = %v", i, tc.perm, tc.kind, tc.name, err)
			}
		}
	}
}
