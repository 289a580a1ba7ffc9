package auth

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// LoginFrom is which part of a client certificate the EXTERNAL mechanism takes as the user
// name: RabbitMQ's `ssl_cert_login_from`, and Warren's `--tls-login-from`.
type LoginFrom string

// The supported sources. RabbitMQ also has subject_alternative_name, which Warren does not.
const (
	LoginFromDistinguishedName LoginFrom = "distinguished_name" // RabbitMQ's default
	LoginFromCommonName        LoginFrom = "common_name"
)

// ParseLoginFrom accepts a --tls-login-from value.
func ParseLoginFrom(s string) (LoginFrom, error) {
	switch f := LoginFrom(s); f {
	case LoginFromDistinguishedName, LoginFromCommonName:
		return f, nil
	}
	return "", fmt.Errorf("unknown certificate login source %q (want %s or %s)", s, LoginFromDistinguishedName, LoginFromCommonName)
}

// ErrNoName is returned when a certificate has no common name to log in with.
var ErrNoName = errors.New("no name found")

// CertificateLogin returns the user name a verified client certificate logs in as.
func CertificateLogin(cert *x509.Certificate, from LoginFrom) (string, error) {
	switch from {
	case LoginFromDistinguishedName:
		return DistinguishedName(cert.RawSubject)
	case LoginFromCommonName:
		return CommonName(cert.RawSubject)
	}
	return "", fmt.Errorf("unknown certificate login source %q", from)
}

// External is the EXTERNAL mechanism (rabbit_auth_mechanism_ssl): the login name from the
// peer certificate of a TLS connection (cs nil: not TLS) whose listener verifies peers
// (verifyPeer, --tls-verify-peer; without it RabbitMQ calls the configuration unsafe and refuses).
// The refusals carry RabbitMQ's reasons. The caller then checks that the user exists
// (UnknownUser if not); EXTERNAL checks no password.
func External(cs *tls.ConnectionState, verifyPeer bool, from LoginFrom) (string, error) {
	refuse := func(reason string) error { return &LoginError{Mechanism: "EXTERNAL", Reason: reason} }
	switch {
	case cs == nil:
		return "", refuse("not a TLS-enabled connection")
	case len(cs.PeerCertificates) == 0:
		return "", refuse("connection peer presented no TLS (x.509) certificate")
	case !verifyPeer || len(cs.VerifiedChains) == 0:
		return "", refuse("TLS configuration is unsafe")
	}
	name, err := CertificateLogin(cs.PeerCertificates[0], from)
	if err != nil {
		return "", refuse(err.Error())
	}
	return name, nil
}

// UnknownUser is the refusal for a login name (from EXTERNAL, say) that names no user.
func UnknownUser(mechanism, name string) error {
	return &LoginError{Mechanism: mechanism, User: name, Reason: fmt.Sprintf("user '%s' - invalid credentials", name)}
}

// attributeTypeAndValue keeps the value's DER so that it can be rendered as RabbitMQ does.
type attributeTypeAndValue struct {
	Type  asn1.ObjectIdentifier
	Value asn1.RawValue
}

// relativeDistinguishedNameSET is one RDN; the SET suffix makes encoding/asn1 parse a SET OF.
type relativeDistinguishedNameSET []attributeTypeAndValue

// attributeNames are the short names RabbitMQ writes (rabbit_cert_info:format_rdn/1); any
// other type is written as its dotted OID. Its table also lists STREET, under a key that never
// matches: RabbitMQ 3.10.8 writes streetAddress as 2.5.4.9, and so does Warren.
var attributeNames = map[string]string{
	"2.5.4.4":                    "SN",
	"2.5.4.42":                   "GIVENNAME",
	"2.5.4.43":                   "INITIALS",
	"2.5.4.44":                   "GENERATIONQUALIFIER",
	"2.5.4.3":                    "CN",
	"2.5.4.7":                    "L",
	"2.5.4.8":                    "ST",
	"2.5.4.10":                   "O",
	"2.5.4.11":                   "OU",
	"2.5.4.12":                   "TITLE",
	"2.5.4.6":                    "C",
	"2.5.4.5":                    "SERIALNUMBER",
	"2.5.4.65":                   "PSEUDONYM",
	"0.9.2342.19200300.100.1.25": "DC",
	"1.2.840.113549.1.9.1":       "EMAILADDRESS",
	"0.9.2342.19200300.100.1.1":  "UID",
}

// ia5Attributes are the types whose IA5String values Erlang's certificate decoder turns into
// text; an IA5String of any other type RabbitMQ prints as raw bytes.
var ia5Attributes = map[string]bool{
	"0.9.2342.19200300.100.1.25": true, // domainComponent
	"1.2.840.113549.1.9.1":       true, // emailAddress
}

// parseName parses a certificate's raw subject (or issuer).
func parseName(raw []byte) ([]relativeDistinguishedNameSET, error) {
	var rdns []relativeDistinguishedNameSET
	rest, err := asn1.Unmarshal(raw, &rdns)
	if err != nil {
		return nil, fmt.Errorf("parse certificate name: %w", err)
	}
	if len(rest) != 0 {
		return nil, errors.New("parse certificate name: trailing data")
	}
	return rdns, nil
}

// DistinguishedName renders a certificate's raw subject (x509.Certificate.RawSubject) as
// RabbitMQ's rabbit_cert_info:subject/1 does, which is the user name `ssl_cert_login_from =
// distinguished_name` logs in: the RDNs in reverse order (RFC 4514's, the last first), joined
// by ","; the attributes of a multi-valued RDN joined by "+"; each "TYPE=value" with RabbitMQ's
// short names (or the dotted OID); a leading space or '#' escaped, a trailing space escaped,
// each of `"+,;<>\` escaped with a backslash, and every byte below 32 or from 126 up (so also
// '~' and every byte of a non-ASCII character in UTF-8) written as \XX in upper-case hex.
// For example "CN=client,O=Warren\, Inc.,C=DE".
func DistinguishedName(rawSubject []byte) (string, error) {
	rdns, err := parseName(rawSubject)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for i := len(rdns) - 1; i >= 0; i-- {
		if i != len(rdns)-1 {
			b.WriteByte(',')
		}
		for j, atv := range rdns[i] {
			if j > 0 {
				b.WriteByte('+')
			}
			oid := atv.Type.String()
			if name, ok := attributeNames[oid]; ok {
				b.WriteString(name)
			} else {
				b.WriteString(oid)
			}
			b.WriteByte('=')
			escapeRDNValue(&b, attributeValue(oid, atv.Value))
		}
	}
	return b.String(), nil
}

// CommonName returns the subject's common names joined by ",", unescaped, as RabbitMQ's
// `ssl_cert_login_from = common_name` does (in certificate order); ErrNoName if there is none.
func CommonName(rawSubject []byte) (string, error) {
	rdns, err := parseName(rawSubject)
	if err != nil {
		return "", err
	}
	var cns []string
	for _, rdn := range rdns {
		for _, atv := range rdn {
			if oid := atv.Type.String(); oid == "2.5.4.3" {
				cns = append(cns, attributeValue(oid, atv.Value))
			}
		}
	}
	if len(cns) == 0 {
		return "", ErrNoName
	}
	return strings.Join(cns, ","), nil
}

// ASN.1 universal tags of the string types a name may hold.
const (
	tagUTF8String      = 12
	tagPrintableString = 19
	tagTeletexString   = 20
	tagIA5String       = 22
	tagUniversalString = 28
	tagBMPString       = 30
)

// attributeValue renders one attribute value as rabbit_cert_info:format_asn1_value/1 does: the
// directory string types as UTF-8 text (teletex taken as Latin-1, BMP and universal strings
// decoded), IA5 strings as text for the types Erlang decodes, anything else as Erlang prints a
// binary ("<<2,1,5>>").
func attributeValue(oid string, v asn1.RawValue) string {
	if v.Class == asn1.ClassUniversal && !v.IsCompound {
		switch v.Tag {
		case tagUTF8String, tagPrintableString:
			return string(v.Bytes)
		case tagIA5String:
			if ia5Attributes[oid] {
				return string(v.Bytes)
			}
		case tagTeletexString:
			var b []byte
			for _, c := range v.Bytes {
				b = utf8.AppendRune(b, rune(c))
			}
			return string(b)
		case tagBMPString:
			if len(v.Bytes)%2 == 0 {
				u := make([]uint16, len(v.Bytes)/2)
				for i := range u {
					u[i] = uint16(v.Bytes[2*i])<<8 | uint16(v.Bytes[2*i+1])
				}
				return string(utf16.Decode(u))
			}
		case tagUniversalString:
			if len(v.Bytes)%4 == 0 {
				var b []byte
				for i := 0; i < len(v.Bytes); i += 4 {
					r := rune(v.Bytes[i])<<24 | rune(v.Bytes[i+1])<<16 | rune(v.Bytes[i+2])<<8 | rune(v.Bytes[i+3])
					b = utf8.AppendRune(b, r)
				}
				return string(b)
			}
		}
	}
	var b strings.Builder
	b.WriteString("<<")
	for i, c := range v.FullBytes {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(c)))
	}
	b.WriteString(">>")
	return b.String()
}

// escapeRDNValue writes s escaped as rabbit_cert_info:escape_rdn_value/1 does.
func escapeRDNValue(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 0 && (c == ' ' || c == '#'):
			b.WriteByte('\\')
			b.WriteByte(c)
		case i == len(s)-1 && c == ' ':
			b.WriteString(`\ `)
		case strings.IndexByte(`"+,;<>\`, c) >= 0:
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 32 || c >= 126:
			fmt.Fprintf(b, `\%02X`, c)
		default:
			b.WriteByte(c)
		}
	}
}
