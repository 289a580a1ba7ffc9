package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"warren/server"
	"warren/server/httpapi"
)

// admin is a broker under test with its management API: an in-process Warren with its HTTP
// API on a loopback port, or, with WARREN_TEST_URL set, that broker and the management API at
// WARREN_TEST_MGMT (default http://127.0.0.1:15682, the reference RabbitMQ's). Tests provision
// vhosts, users, permissions and policies through the API, as deployment tools do, and every
// object they create is deleted at the end (the external broker is shared).
type admin struct {
	t        *testing.T
	host     string // AMQP host:port
	mgmt     string // http://host:port
	user     string // the administrator
	pass     string
	srv      *server.Server // nil against an external broker
	vhosts   []string
	users    []string
	policies [][2]string
}

// startAdmin starts (or finds) the broker under test with its management API.
func startAdmin(t *testing.T) *admin {
	t.Helper()
	return startAdminConfig(t, nil)
}

func startAdminConfig(t *testing.T, edit func(*server.Config)) *admin {
	t.Helper()
	a := &admin{t: t, user: "guest", pass: "guest"}
	if u := externalURL(); u != "" {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		a.host = pu.Host
		a.mgmt = os.Getenv("WARREN_TEST_MGMT")
		if a.mgmt == "" {
			a.mgmt = "http://127.0.0.1:15682"
		}
	} else {
		lw := &testLogWriter{t: t}
		cfg := server.DefaultConfig()
		cfg.AMQPListen = "127.0.0.1:0"
		cfg.DataDir = t.TempDir()
		cfg.Logger = slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelInfo}))
		if edit != nil {
			edit(&cfg)
		}
		s, err := server.New(cfg)
		if err != nil {
			t.Fatalf("server.New: %v", err)
		}
		if err := s.Start(); err != nil {
			t.Fatalf("server.Start: %v", err)
		}
		l, err := httpapi.Listen("127.0.0.1:0", s, httpapi.Options{Version: "test", Logger: cfg.Logger})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := l.Shutdown(ctx); err != nil {
				t.Error(err)
			}
			if err := s.Shutdown(ctx); err != nil {
				t.Errorf("server.Shutdown: %v", err)
			}
			lw.stop()
		})
		a.srv, a.host, a.mgmt = s, s.Addr().String(), "http://"+l.Addr().String()
	}
	t.Cleanup(a.cleanup)
	return a
}

func (a *admin) cleanup() {
	for _, p := range a.policies {
		a.do("DELETE", "/api/policies/"+url.PathEscape(p[0])+"/"+url.PathEscape(p[1]), nil)
	}
	for _, v := range a.vhosts {
		a.do("DELETE", "/api/vhosts/"+url.PathEscape(v), nil)
	}
	for _, u := range a.users {
		a.do("DELETE", "/api/users/"+url.PathEscape(u), nil)
	}
}

// do sends one API request as the administrator and returns the status and body.
func (a *admin) do(method, path string, body any) (int, []byte) {
	return a.doAs(a.user, a.pass, method, path, body)
}

func (a *admin) doAs(user, pass, method, path string, body any) (int, []byte) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, a.mgmt+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	req.SetBasicAuth(user, pass)
	req.Header.Set("Content-Type", "application/json")
	client := http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// must sends a request that must answer a 2xx status.
func (a *admin) must(method, path string, body any) []byte {
	a.t.Helper()
	st, out := a.do(method, path, body)
	if st/100 != 2 {
		a.t.Fatalf("%s %s: %d %s", method, path, st, out)
	}
	return out
}

// vhost creates a vhost named after the test.
func (a *admin) vhost(what string) string {
	a.t.Helper()
	v := uniq(a.t, what)
	a.vhosts = append(a.vhosts, v)
	a.must("PUT", "/api/vhosts/"+url.PathEscape(v), map[string]any{})
	// The administrator may work there too (tests set up objects with it).
	a.permit(a.user, v, ".*", ".*", ".*")
	return v
}

// newUser creates a user (no tags) with password pass.
func (a *admin) newUser(what, pass string, tags ...string) string {
	a.t.Helper()
	u := uniq(a.t, what)
	a.users = append(a.users, u)
	a.must("PUT", "/api/users/"+url.PathEscape(u), map[string]any{"password": pass, "tags": strings.Join(tags, ",")})
	return u
}

func (a *admin) permit(user, vhost, configure, write, read string) {
	a.t.Helper()
	a.must("PUT", "/api/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(user),
		map[string]string{"configure": configure, "write": write, "read": read})
}

func (a *admin) policy(vhost, name string, body map[string]any) {
	a.t.Helper()
	a.policies = append(a.policies, [2]string{vhost, name})
	a.must("PUT", "/api/policies/"+url.PathEscape(vhost)+"/"+url.PathEscape(name), body)
}

// url is the AMQP URL of user in vhost.
func (a *admin) url(user, pass, vhost string) string {
	return fmt.Sprintf("amqp://%s:%s@%s/%s", url.QueryEscape(user), url.QueryEscape(pass), a.host, url.PathEscape(vhost))
}

// getJSON decodes a GET answer.
func (a *admin) getJSON(path string, out any) int {
	a.t.Helper()
	st, body := a.do("GET", path, nil)
	if st == http.StatusOK && out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			a.t.Fatalf("GET %s: %v: %s", path, err, body)
		}
	}
	return st
}

// jsonReason reports whether a JSON error body has this reason.
func jsonReason(body []byte, want string) bool {
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return false
	}
	return m["reason"] == want
}
