package auth

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rabbitEbin finds the compiled rabbit_common and rabbit applications of an installed RabbitMQ
// (Debian's package puts them under /usr/lib/rabbitmq), or WARREN_RABBITMQ_LIB.
func rabbitEbin(t *testing.T) []string {
	t.Helper()
	if _, err := exec.LookPath("erl"); err != nil {
		t.Skip("needs erl and an installed RabbitMQ (its rabbit_common ebin) to compare with")
	}
	root := os.Getenv("WARREN_RABBITMQ_LIB")
	if root == "" {
		root = "/usr/lib/rabbitmq/lib"
	}
	common, _ := filepath.Glob(filepath.Join(root, "rabbitmq_server-*", "plugins", "rabbit_common-*", "ebin"))
	rabbit, _ := filepath.Glob(filepath.Join(root, "rabbitmq_server-*", "plugins", "rabbit-*", "ebin"))
	if len(common) == 0 || len(rabbit) == 0 {
		t.Skipf("no RabbitMQ ebin under %s", root)
	}
	return []string{common[len(common)-1], rabbit[len(rabbit)-1]}
}

// runErl evaluates expr with RabbitMQ's modules loadable and the given plain arguments, and
// returns its output lines.
func runErl(t *testing.T, expr string, args ...string) []string {
	t.Helper()
	ebin := rabbitEbin(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	argv := []string{"-noshell", "-pa", ebin[0], "-pa", ebin[1], "-eval", expr, "-extra"}
	cmd := exec.CommandContext(ctx, "erl", append(argv, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("erl: %v\n%s", err, stderr.String())
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// TestDistinguishedNameMatchesRabbitMQ renders every dnCases subject with RabbitMQ 3.10.8's own
// rabbit_ssl (peer_cert_subject, as ssl_cert_login_from = distinguished_name uses it, and
// peer_cert_subject_items for common_name) and compares.
func TestDistinguishedNameMatchesRabbitMQ(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for i, tc := range dnCases {
		f := filepath.Join(dir, fmt.Sprintf("%d.der", i))
		if err := os.WriteFile(f, selfSignedDER(t, rawSubject(t, tc.rdns...)), 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	const expr = `[begin {ok, D} = file:read_file(F),
	  try
	    S = iolist_to_binary(rabbit_ssl:peer_cert_subject(D)),
	    C = case rabbit_ssl:peer_cert_subject_items(D, {2,5,4,3}) of
	          not_found -> <<"not_found">>;
	          L -> binary:encode_hex(list_to_binary(string:join(L, ",")))
	        end,
	    io:format("~s ~s~n", [binary:encode_hex(S), C])
	  catch _:_ -> io:format("error error~n")
	  end end
	 || F <- init:get_plain_arguments()], halt().`
	lines := runErl(t, expr, files...)
	if len(lines) != len(dnCases) {
		t.Fatalf("erl printed %d lines for %d certificates: %q", len(lines), len(dnCases), lines)
	}
	for i, tc := range dnCases {
		dnHex, cnOut, ok := strings.Cut(lines[i], " ")
		if !ok {
			t.Fatalf("%s: erl printed %q", tc.name, lines[i])
		}
		if dnHex == "error" {
			t.Logf("%s: RabbitMQ cannot decode this certificate (it refuses the client); Warren renders %q", tc.name, tc.dn)
			continue
		}
		want, err := hex.DecodeString(dnHex)
		if err != nil {
			t.Fatalf("%s: erl printed %q", tc.name, lines[i])
		}
		raw := rawSubject(t, tc.rdns...)
		if got, _ := DistinguishedName(raw); got != string(want) {
			t.Errorf("%s: DistinguishedName = %q, RabbitMQ says %q", tc.name, got, want)
		}
		gotCN, err := CommonName(raw)
		if cnOut == "not_found" {
			if !errors.Is(err, ErrNoName) {
				t.Errorf("%s: CommonName = %q, RabbitMQ finds none", tc.name, gotCN)
			}
			continue
		}
		wantCN, _ := hex.DecodeString(cnOut)
		if gotCN != string(wantCN) {
			t.Errorf("%s: CommonName = %q, RabbitMQ says %q", tc.name, gotCN, wantCN)
		}
	}
}

// TestPasswordHashMatchesRabbitMQ has RabbitMQ's rabbit_password compute the salted hash of
// known salts and passwords with each algorithm and compares with HashPasswordWithSalt.
func TestPasswordHashMatchesRabbitMQ(t *testing.T) {
	type vec struct {
		alg      Algorithm
		salt     [SaltSize]byte
		password string
	}
	vecs := []vec{
		{SHA256, [4]byte{1, 2, 3, 4}, "guest"},
		{SHA256, [4]byte{0xff, 0, 0x80, 7}, "pässwörd ✓"},
		{SHA512, [4]byte{9, 8, 7, 6}, "s3cret"},
		{MD5, [4]byte{0xde, 0xad, 0xbe, 0xef}, "legacy"},
	}
	var args []string
	for _, v := range vecs {
		args = append(args, string(v.alg), hex.EncodeToString(v.salt[:]), hex.EncodeToString([]byte(v.password)))
	}
	const expr = `Loop = fun L([M, S, P | T]) ->
	    Salt = binary:decode_hex(list_to_binary(S)), Pw = binary:decode_hex(list_to_binary(P)),
	    H = rabbit_password:salted_hash(list_to_atom(M), Salt, Pw),
	    io:format("~s~n", [base64:encode(<<Salt/binary, H/binary>>)]), L(T);
	  L([]) -> ok end,
	  Loop(init:get_plain_arguments()), halt().`
	lines := runErl(t, expr, args...)
	if len(lines) != len(vecs) {
		t.Fatalf("erl printed %q", lines)
	}
	for i, v := range vecs {
		h, err := HashPasswordWithSalt(v.alg, v.salt, v.password)
		if err != nil {
			t.Fatal(err)
		}
		if h.Encode() != lines[i] {
			t.Errorf("%s %q: we hash %s, RabbitMQ %s", v.alg, v.password, h.Encode(), lines[i])
		}
		p, err := ParseDefinitionHash(lines[i], string(v.alg), "3.10.8")
		if err != nil || !p.Verify(v.password) || p.Verify(v.password+"x") {
			t.Errorf("%s: RabbitMQ's hash %s does not verify %q (err %v)", v.alg, lines[i], v.password, err)
		}
	}
}
