package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"math/big"
	"testing"
	"time"
)

// atv builds one attribute for a test subject: oid, the ASN.1 universal string tag, the value.
type atv struct {
	oid   asn1.ObjectIdentifier
	tag   int
	value []byte
}

var (
	oidCN     = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidC      = asn1.ObjectIdentifier{2, 5, 4, 6}
	oidO      = asn1.ObjectIdentifier{2, 5, 4, 10}
	oidOU     = asn1.ObjectIdentifier{2, 5, 4, 11}
	oidL      = asn1.ObjectIdentifier{2, 5, 4, 7}
	oidST     = asn1.ObjectIdentifier{2, 5, 4, 8}
	oidSerial = asn1.ObjectIdentifier{2, 5, 4, 5}
	oidStreet = asn1.ObjectIdentifier{2, 5, 4, 9}
	oidDC     = asn1.ObjectIdentifier{0, 9, 2342, 19200300, 100, 1, 25}
	oidUID    = asn1.ObjectIdentifier{0, 9, 2342, 19200300, 100, 1, 1}
	oidEmail  = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 1}
	oidOther  = asn1.ObjectIdentifier{1, 2, 3, 4}
)

func utf8v(oid asn1.ObjectIdentifier, s string) atv { return atv{oid, tagUTF8String, []byte(s)} }
func printable(oid asn1.ObjectIdentifier, s string) atv {
	return atv{oid, tagPrintableString, []byte(s)}
}
func ia5(oid asn1.ObjectIdentifier, s string) atv { return atv{oid, tagIA5String, []byte(s)} }

// rawSubject encodes RDNs (outer: RDN order as in the certificate; inner: a multi-valued RDN).
func rawSubject(t testing.TB, rdns ...[]atv) []byte {
	t.Helper()
	seq := make([]relativeDistinguishedNameSET, 0, len(rdns))
	for _, rdn := range rdns {
		set := relativeDistinguishedNameSET{}
		for _, a := range rdn {
			set = append(set, attributeTypeAndValue{Type: a.oid, Value: asn1.RawValue{Class: asn1.ClassUniversal, Tag: a.tag, Bytes: a.value}})
		}
		seq = append(seq, set)
	}
	b, err := asn1.Marshal(seq)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func one(a ...atv) []atv { return a }

// noCN marks a dnCases subject without a common name.
const noCN = "<no CN>"

// dnCases are the distinguished-name renderings, written from rabbit_cert_info.erl's rules and
// checked against RabbitMQ 3.10.8's own code by TestDistinguishedNameMatchesRabbitMQ.
var dnCases = []struct {
	name string
	rdns [][]atv
	dn   string
	cn   string // noCN: CommonName finds none
}{
	{"reversed order", [][]atv{one(printable(oidC, "DE")), one(utf8v(oidO, "Warren")), one(utf8v(oidCN, "client"))},
		"CN=client,O=Warren,C=DE", "client"},
	{"empty subject", nil, "", noCN},
	{"all short names", [][]atv{one(ia5(oidDC, "com")), one(ia5(oidDC, "example")), one(printable(oidC, "US")),
		one(utf8v(oidST, "CA")), one(utf8v(oidL, "SF")), one(utf8v(oidStreet, "Main St 1")), one(utf8v(oidOU, "ops")),
		one(printable(oidSerial, "1234")), one(utf8v(oidUID, "u1")), one(ia5(oidEmail, "a@example.com")), one(utf8v(oidCN, "x"))},
		"CN=x,EMAILADDRESS=a@example.com,UID=u1,SERIALNUMBER=1234,OU=ops,2.5.4.9=Main St 1,L=SF,ST=CA,C=US,DC=example,DC=com", "x"},
	{"special characters", [][]atv{one(utf8v(oidCN, `a,b+c"d;e<f>g\h=i`))}, `CN=a\,b\+c\"d\;e\<f\>g\\h=i`, `a,b+c"d;e<f>g\h=i`},
	{"leading hash", [][]atv{one(utf8v(oidCN, "#x"))}, `CN=\#x`, "#x"},
	{"hash inside", [][]atv{one(utf8v(oidCN, "x#"))}, `CN=x#`, "x#"},
	{"leading and trailing space", [][]atv{one(utf8v(oidCN, " a b "))}, `CN=\ a b\ `, " a b "},
	{"one space", [][]atv{one(utf8v(oidCN, " "))}, `CN=\ `, " "},
	{"tilde and non-ASCII as hex", [][]atv{one(utf8v(oidCN, "é~x"))}, `CN=\C3\A9\7Ex`, "é~x"},
	{"control characters", [][]atv{one(utf8v(oidCN, "a\nb\x7f"))}, `CN=a\0Ab\7F`, "a\nb\x7f"},
	{"multi-valued RDN", [][]atv{one(utf8v(oidO, "W")), one(utf8v(oidCN, "a"), utf8v(oidOU, "b"))}, "CN=a+OU=b,O=W", "a"},
	{"unknown type as OID", [][]atv{one(utf8v(oidOther, "v")), one(utf8v(oidCN, "c"))}, "CN=c,1.2.3.4=v", "c"},
	{"unknown type, IA5 value as bytes", [][]atv{one(ia5(oidOther, "x"))}, `1.2.3.4=\<\<22\,1\,120\>\>`, noCN},
	{"UID as IA5 string as bytes", [][]atv{one(ia5(oidUID, "u"))}, `UID=\<\<22\,1\,117\>\>`, noCN},
	{"BMP string", [][]atv{one(atv{oidCN, tagBMPString, []byte{0, 'a', 0, 0xe9}})}, `CN=a\C3\A9`, "aé"},
	{"teletex string as Latin-1", [][]atv{one(atv{oidCN, tagTeletexString, []byte{'a', 0xe9}})}, `CN=a\C3\A9`, "aé"},
	// Go's x509 parser refuses universal strings, so such a client certificate fails the
	// handshake before EXTERNAL sees it; the rendering is still RabbitMQ's.
	{"universal string", [][]atv{one(atv{oidCN, tagUniversalString, []byte{0, 0, 0, 'a', 0, 1, 0xf6, 0x00}})}, `CN=a\F0\9F\98\80`, "a😀"},
	{"empty value", [][]atv{one(utf8v(oidCN, ""))}, "CN=", ""},
	{"country as UTF8String", [][]atv{one(utf8v(oidC, "DE"))}, "C=DE", noCN},
	{"email as UTF8String", [][]atv{one(utf8v(oidEmail, "a@b"))}, "EMAILADDRESS=a@b", noCN},
	{"organisation as PrintableString", [][]atv{one(printable(oidO, "o"))}, "O=o", noCN},
	{"unknown type, integer value as bytes", [][]atv{one(atv{oidOther, 2, []byte{5}})}, `1.2.3.4=\<\<2\,1\,5\>\>`, noCN},
	// Erlang's decoder refuses these two, so RabbitMQ fails such a client; Warren renders them.
	{"common name as IA5String", [][]atv{one(ia5(oidCN, "i"))}, `CN=\<\<22\,1\,105\>\>`, "<<22,1,105>>"},
	{"domain component as UTF8String", [][]atv{one(utf8v(oidDC, "d"))}, "DC=d", noCN},
	{"two common names", [][]atv{one(utf8v(oidCN, "a")), one(utf8v(oidCN, "b"))}, "CN=b,CN=a", "a,b"},
}

func TestDistinguishedName(t *testing.T) {
	for _, tc := range dnCases {
		t.Run(tc.name, func(t *testing.T) {
			raw := rawSubject(t, tc.rdns...)
			dn, err := DistinguishedName(raw)
			if err != nil || dn != tc.dn {
				t.Errorf("DistinguishedName = %q, %v; want %q", dn, err, tc.dn)
			}
			cn, err := CommonName(raw)
			if tc.cn == noCN {
				if !errors.Is(err, ErrNoName) {
					t.Errorf("CommonName = %q, %v; want ErrNoName", cn, err)
				}
			} else if err != nil || cn != tc.cn {
				t.Errorf("CommonName = %q, %v; want %q", cn, err, tc.cn)
			}
		})
	}
}

func TestDistinguishedNameRejectsGarbage(t *testing.T) {
	for _, raw := range [][]byte{nil, {0x30}, {0x30, 0x03, 0x31, 0x01}, append(rawSubject(t, one(utf8v(oidCN, "a"))), 0)} {
		if dn, err := DistinguishedName(raw); err == nil {
			t.Errorf("DistinguishedName(%x) = %q, want an error", raw, dn)
		}
	}
}

// selfSigned makes a certificate with the given raw subject.
func selfSigned(t testing.TB, raw []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(selfSignedDER(t, raw))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// selfSignedDER is selfSigned's DER, for subjects Go's parser refuses (universal strings).
func selfSignedDER(t testing.TB, raw []byte) []byte {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), RawSubject: raw,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func TestExternal(t *testing.T) {
	cert := selfSigned(t, rawSubject(t, one(utf8v(oidO, "W")), one(utf8v(oidCN, "app"))))
	verified := &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}, VerifiedChains: [][]*x509.Certificate{{cert}}}
	unverified := &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
	for _, tc := range []struct {
		name       string
		cs         *tls.ConnectionState
		verifyPeer bool
		from       LoginFrom
		want       string
		reason     string
	}{
		{"dn", verified, true, LoginFromDistinguishedName, "CN=app,O=W", ""},
		{"cn", verified, true, LoginFromCommonName, "app", ""},
		{"plain TCP", nil, true, LoginFromCommonName, "", "not a TLS-enabled connection"},
		{"no certificate", &tls.ConnectionState{}, true, LoginFromCommonName, "", "connection peer presented no TLS (x.509) certificate"},
		{"peer not verified", verified, false, LoginFromCommonName, "", "TLS configuration is unsafe"},
		{"chain not verified", unverified, true, LoginFromCommonName, "", "TLS configuration is unsafe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := External(tc.cs, tc.verifyPeer, tc.from)
			if tc.reason == "" {
				if err != nil || got != tc.want {
					t.Fatalf("External = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			var le *LoginError
			if !errors.As(err, &le) || le.Reason != tc.reason || le.Mechanism != "EXTERNAL" {
				t.Fatalf("External = %q, %v; want refusal %q", got, err, tc.reason)
			}
			if le.Close().Text != "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL. For details see the broker logfile." {
				t.Errorf("close text %q", le.Close().Text)
			}
		})
	}
	noCN := selfSigned(t, rawSubject(t, one(utf8v(oidO, "W"))))
	cs := &tls.ConnectionState{PeerCertificates: []*x509.Certificate{noCN}, VerifiedChains: [][]*x509.Certificate{{noCN}}}
	var le *LoginError
	if _, err := External(cs, true, LoginFromCommonName); !errors.As(err, &le) || le.Reason != "no name found" {
		t.Errorf("External without CN: %v, want refusal 'no name found'", err)
	}
}

func TestParseLoginFrom(t *testing.T) {
	for in, ok := range map[string]bool{"distinguished_name": true, "common_name": true, "": false, "subject_alternative_name": false, "CN": false} {
		f, err := ParseLoginFrom(in)
		if ok != (err == nil) || ok && string(f) != in {
			t.Errorf("ParseLoginFrom(%q) = %q, %v", in, f, err)
		}
	}
}
