package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// Exit codes, as rabbitmqctl's (sysexits.h).
const (
	ExitUsage       = 64 // EX_USAGE: bad arguments
	ExitDataErr     = 65 // EX_DATAERR: the server refused the input (400)
	ExitSoftware    = 70 // EX_SOFTWARE: the server answered with an error (404 and others)
	ExitUnavailable = 69 // EX_UNAVAILABLE: the broker cannot be reached, or a health check failed
	ExitNoPerm      = 77 // EX_NOPERM: 401/403
)

// client talks to a broker's HTTP API (RabbitMQ's management API paths).
type client struct {
	base       string // http://host:port, no trailing slash
	user, pass string
	http       *http.Client
}

func newClient(c *cli.Context) (*client, error) {
	base := strings.TrimRight(c.String("url"), "/")
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, cli.Exit(fmt.Sprintf("--url %q is not an http:// or https:// URL of Warren's HTTP API", c.String("url")), ExitUsage)
	}
	user, pass := c.String("username"), c.String("password")
	if u.User != nil {
		user = u.User.Username()
		if p, ok := u.User.Password(); ok {
			pass = p
		}
		u.User = nil
		base = strings.TrimRight(u.String(), "/")
	}
	return &client{base: base, user: user, pass: pass, http: &http.Client{Timeout: c.Duration("timeout")}}, nil
}

// apiError is an error answer of the API.
type apiError struct {
	Method, Path string
	Status       int
	Reason       string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.Status, http.StatusText(e.Status), e.Reason)
}

// do sends a request with a JSON body (nil: none) and returns the answer's body for 2xx. Other
// answers and transport failures are cli exit errors with rabbitmqctl's codes.
func (cl *client) do(ctx context.Context, method, path string, body any, hdr http.Header) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		switch b := body.(type) {
		case []byte:
			rd = bytes.NewReader(b)
		default:
			data, err := json.Marshal(body)
			if err != nil {
				return nil, err
			}
			rd = bytes.NewReader(data)
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, cl.base+path, rd)
	if err != nil {
		return nil, cli.Exit(err.Error(), ExitUsage)
	}
	req.SetBasicAuth(cl.user, cl.pass)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := cl.http.Do(req)
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("cannot reach the broker's HTTP API at %s: %v", cl.base, err), ExitUnavailable)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("%s %s: reading the answer: %v", method, path, err), ExitUnavailable)
	}
	if resp.StatusCode/100 == 2 {
		return data, nil
	}
	e := &apiError{Method: method, Path: path, Status: resp.StatusCode, Reason: reason(data)}
	code := ExitSoftware
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		code = ExitNoPerm
	case resp.StatusCode == http.StatusBadRequest:
		code = ExitDataErr
	case resp.StatusCode == http.StatusServiceUnavailable:
		code = ExitUnavailable
	}
	return nil, cli.Exit(e.Error(), code)
}

// reason is the server's reason in an error body ({"error": ..., "reason": ...}).
func reason(body []byte) string {
	var m map[string]any
	if json.Unmarshal(body, &m) == nil {
		if r, ok := m["reason"].(string); ok && r != "" {
			return r
		}
		if r, ok := m["error"].(string); ok && r != "" {
			return r
		}
	}
	s := strings.TrimSpace(string(body))
	if s == "" {
		return "(no reason given)"
	}
	return s
}

// getJSON decodes a GET answer into out.
func (cl *client) getJSON(ctx context.Context, path string, out any) error {
	data, err := cl.do(ctx, "GET", path, nil, nil)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(out); err != nil {
		return cli.Exit(fmt.Sprintf("GET %s: the answer is not JSON: %v", path, err), ExitSoftware)
	}
	return nil
}

// esc escapes one path segment (a vhost "/" becomes %2F, as RabbitMQ's paths want).
func esc(s string) string { return url.PathEscape(s) }

// isNotFound reports an API answer of 404.
func isNotFound(err error) bool {
	var ec cli.ExitCoder
	return errors.As(err, &ec) && strings.Contains(ec.Error(), ": 404 ")
}

// ctx is the command's context with its --timeout.
func ctxOf(c *cli.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.Context, c.Duration("timeout")+time.Second)
}
