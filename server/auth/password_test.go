package auth

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// Vectors computed by RabbitMQ 3.10.8's rabbit_password:salted_hash/3 (see
// TestPasswordHashMatchesRabbitMQ for the live comparison).
var rabbitVectors = []struct {
	alg      Algorithm
	salt     [SaltSize]byte
	password string
	hash     string
}{
	{SHA256, [4]byte{1, 2, 3, 4}, "guest", "AQIDBEMMOXwY6PKx/JKP9PAqfsb4ozuD0Ta3pxxa9gEYBMmD"},
	{SHA512, [4]byte{9, 8, 7, 6}, "s3cret", "CQgHBrcQLxQKNQjlmqKOY9pkFb/nHuaxDylXEFLrXjRHzlCQMHD5BzE5XmzEhWMrVapY73B3HgKbg9RLxyHX/Df91Lg="},
	{MD5, [4]byte{0xde, 0xad, 0xbe, 0xef}, "legacy", "3q2+72JSJiL7kQygxVSMz/39nzI="},
}

func TestHashPasswordWithSaltMatchesRabbitMQVectors(t *testing.T) {
	for _, v := range rabbitVectors {
		h, err := HashPasswordWithSalt(v.alg, v.salt, v.password)
		if err != nil {
			t.Fatal(err)
		}
		if h.Encode() != v.hash {
			t.Errorf("%s(%q) = %s, RabbitMQ %s", v.alg, v.password, h.Encode(), v.hash)
		}
		p, err := ParseDefinitionHash(v.hash, string(v.alg), "3.10.8")
		if err != nil {
			t.Fatal(err)
		}
		if !p.Verify(v.password) {
			t.Errorf("%s: RabbitMQ's hash does not verify %q", v.alg, v.password)
		}
		for _, wrong := range []string{"", v.password + " ", strings.ToUpper(v.password), v.password[1:]} {
			if p.Verify(wrong) {
				t.Errorf("%s: %q verifies against the hash of %q", v.alg, wrong, v.password)
			}
		}
	}
}

func TestHashPassword(t *testing.T) {
	for _, alg := range []Algorithm{SHA256, SHA512, MD5} {
		a, err := HashPassword(alg, "pw")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := HashPassword(alg, "pw")
		if string(a.Salted[:SaltSize]) == string(b.Salted[:SaltSize]) {
			t.Errorf("%s: two hashes share the salt %x", alg, a.Salted[:SaltSize])
		}
		if len(a.Salted) != SaltSize+alg.size() || a.Algorithm != alg {
			t.Errorf("%s: %d bytes, algorithm %s", alg, len(a.Salted), a.Algorithm)
		}
		if !a.Verify("pw") || !b.Verify("pw") || a.Verify("pW") {
			t.Errorf("%s: verification wrong", alg)
		}
	}
	if _, err := HashPassword("rabbit_password_hashing_bcrypt", "pw"); !errors.Is(err, ErrUnknownAlgorithm) {
		t.Errorf("unknown algorithm: %v", err)
	}
}

func TestAlgorithmForVersion(t *testing.T) {
	// Checked against RabbitMQ's import by TestPasswordHashesWithRabbitMQ.
	for ver, want := range map[string]Algorithm{
		"": SHA256, "3.0.0": MD5, "3.0.4": MD5, "3.1.5": MD5, "3.2.4": MD5, "3.3.5": MD5, "3.4.4": MD5, "3.5.7": MD5,
		"3.6.0": SHA256, "3.6.1": SHA256, "3.6.16": SHA256, "3.10.8": SHA256, "3.13.0": SHA256, "4.0.5": SHA256,
		"3.5": SHA256, "3.55.0": SHA256, "2.8.7": SHA256, "garbage": SHA256,
	} {
		if got := AlgorithmForVersion(ver); got != want {
			t.Errorf("AlgorithmForVersion(%q) = %s, want %s", ver, got, want)
		}
	}
}

func TestParseDefinitionHash(t *testing.T) {
	md5Hash := rabbitVectors[2].hash
	for _, tc := range []struct {
		name             string
		hash, alg, ver   string
		wantAlg          Algorithm
		wantErr          error // nil, ErrUnknownAlgorithm, or errBase64 (any error)
		verify, password string
	}{
		{name: "explicit sha256", hash: rabbitVectors[0].hash, alg: string(SHA256), ver: "3.10.8", wantAlg: SHA256, password: "guest"},
		{name: "explicit sha512", hash: rabbitVectors[1].hash, alg: string(SHA512), wantAlg: SHA512, password: "s3cret"},
		{name: "explicit md5 overrides version", hash: md5Hash, alg: string(MD5), ver: "3.10.8", wantAlg: MD5, password: "legacy"},
		{name: "missing algorithm, 3.5 export", hash: md5Hash, ver: "3.5.7", wantAlg: MD5, password: "legacy"},
		{name: "missing algorithm, modern export", hash: rabbitVectors[0].hash, ver: "3.10.8", wantAlg: SHA256, password: "guest"},
		{name: "empty hash: no password login", hash: "", alg: string(SHA256), wantAlg: SHA256},
		{name: "unknown algorithm", hash: md5Hash, alg: "rabbit_password_hashing_bcrypt", wantErr: ErrUnknownAlgorithm},
		{name: "not base64", hash: "not base64!", alg: string(SHA256), wantErr: errAny},
		{name: "base64 without padding", hash: strings.TrimRight(rabbitVectors[2].hash, "="), alg: string(MD5), wantErr: errAny},
		{name: "white space is skipped, as by Erlang", hash: "3q2+72JS JiL7kQyg\nxVSMz/39nzI=", alg: string(MD5), wantAlg: MD5, password: "legacy"},
		{name: "short hash never verifies", hash: base64.StdEncoding.EncodeToString([]byte{1, 2, 3}), alg: string(SHA256), wantAlg: SHA256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ParseDefinitionHash(tc.hash, tc.alg, tc.ver)
			switch {
			case tc.wantErr == errAny && err == nil, tc.wantErr == nil && err != nil,
				tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if h.Algorithm != tc.wantAlg {
				t.Errorf("algorithm %s, want %s", h.Algorithm, tc.wantAlg)
			}
			if h.Encode() != stripBase64Space(tc.hash) {
				t.Errorf("Encode = %q, want the input %q back", h.Encode(), tc.hash)
			}
			if tc.password != "" && !h.Verify(tc.password) {
				t.Errorf("does not verify %q", tc.password)
			}
			if h.Verify("") || h.Verify("guest") && tc.password != "guest" {
				t.Error("verifies a wrong password")
			}
			if h.IsZero() != (tc.hash == "") {
				t.Errorf("IsZero = %v", h.IsZero())
			}
		})
	}
}

var errAny = errors.New("any error")

func TestVerifyOddHashes(t *testing.T) {
	good, _ := HashPasswordWithSalt(SHA256, [4]byte{1, 2, 3, 4}, "pw")
	for name, h := range map[string]PasswordHash{
		"zero":              {},
		"unknown algorithm": {Algorithm: "x", Salted: good.Salted},
		"wrong algorithm":   {Algorithm: SHA512, Salted: good.Salted},
		"truncated":         {Algorithm: SHA256, Salted: good.Salted[:len(good.Salted)-1]},
		"salt only":         {Algorithm: SHA256, Salted: good.Salted[:SaltSize]},
	} {
		if h.Verify("pw") {
			t.Errorf("%s: verifies", name)
		}
	}
}

func TestCache(t *testing.T) {
	a, _ := HashPassword(SHA256, "a")
	b, _ := HashPassword(SHA256, "b")
	var c Cache
	for i, step := range []struct {
		h    PasswordHash
		pw   string
		want bool
	}{
		{a, "a", true}, {a, "a", true}, {a, "b", false}, {a, "b", false}, {b, "b", true},
		{a, "b", false}, {a, "a", true}, {PasswordHash{}, "a", false}, {a, "", false},
	} {
		if got := c.Verify(step.h, step.pw); got != step.want {
			t.Errorf("step %d: Verify = %v, want %v", i, got, step.want)
		}
	}
	// A new password for the same user is a new stored hash: the cache must not answer.
	changed, _ := HashPassword(SHA256, "new")
	c.Verify(a, "a")
	if c.Verify(changed, "a") {
		t.Error("cached answer survived a password change")
	}
	// The cache keeps its own copy of the stored hash.
	h, _ := HashPassword(SHA256, "x")
	c.Verify(h, "x")
	h.Salted[len(h.Salted)-1] ^= 1
	if c.Verify(h, "x") {
		t.Error("cache answered for a hash changed in place")
	}
}

func FuzzParseDefinitionHash(f *testing.F) {
	for _, v := range rabbitVectors {
		f.Add(v.hash, string(v.alg), "3.10.8", v.password)
	}
	f.Add("", "", "", "")
	f.Add("////", "", "3.5.1", "x")
	f.Add("AQID", "rabbit_password_hashing_md5", "3.6.0", "y")
	f.Fuzz(func(t *testing.T, hash, alg, ver, password string) {
		h, err := ParseDefinitionHash(hash, alg, ver)
		if err != nil {
			if h.Algorithm != "" || h.Salted != nil {
				t.Fatalf("error %v with a result %+v", err, h)
			}
			return
		}
		if _, err := ParseAlgorithm(string(h.Algorithm)); err != nil {
			t.Fatalf("parsed algorithm %q is not one of ours", h.Algorithm)
		}
		// Not Encode() == hash: like Erlang's decoder, Go's ignores the unused bits of the last
		// character ("001=" reads as "000=").
		if b, err := base64.StdEncoding.DecodeString(h.Encode()); err != nil || string(b) != string(h.Salted) {
			t.Fatalf("Encode = %q does not decode to the parsed bytes (input %q)", h.Encode(), hash)
		}
		ok := h.Verify(password)
		if ok != (len(h.Salted) == SaltSize+h.Algorithm.size() && func() bool {
			want, _ := HashPasswordWithSalt(h.Algorithm, [SaltSize]byte(h.Salted[:SaltSize]), password)
			return string(want.Salted) == string(h.Salted)
		}()) {
			t.Fatalf("Verify = %v disagrees with rehashing", ok)
		}
		var c Cache
		if c.Verify(h, password) != ok || c.Verify(h, password) != ok {
			t.Fatal("Cache disagrees with Verify")
		}
	})
}
