package server_test

import (
	"encoding/json"
	"net/url"
	"slices"
	"testing"
)

// TestITManagementTags checks the management API's tag rules as RabbitMQ has them: no tag is
// 401 everywhere; management sees only the vhosts it has permissions in; monitoring reads
// everything but changes nothing; policymaker manages policies of its vhosts; administrator does
// all.
func TestITManagementTags(t *testing.T) {
	a := startAdmin(t)
	v := a.vhost("tags")
	other := a.vhost("hidden")
	none := a.newUser("none", "pw")
	mgmt := a.newUser("mgmt", "pw", "management")
	mon := a.newUser("mon", "pw", "monitoring")
	pm := a.newUser("pm", "pw", "policymaker")
	for _, u := range []string{mgmt, pm} {
		a.permit(u, v, ".*", ".*", ".*")
	}
	pol := "/api/policies/" + url.PathEscape(v) + "/p"
	a.policies = append(a.policies, [2]string{v, "p"})
	body := map[string]any{"pattern": "^x", "definition": map[string]any{"max-length": 3}}
	for _, tc := range []struct {
		user, method, path string
		body               any
		want               int
	}{
		{none, "GET", "/api/overview", nil, 401},
		{none, "GET", "/api/whoami", nil, 401},
		{mgmt, "GET", "/api/whoami", nil, 200},
		{mgmt, "GET", "/api/users", nil, 401},
		{mgmt, "PUT", "/api/vhosts/" + url.PathEscape(v+".new"), map[string]any{}, 401},
		{mgmt, "GET", "/api/queues/" + url.PathEscape(other), nil, 401},
		{mgmt, "GET", "/api/queues/" + url.PathEscape(v), nil, 200},
		{mgmt, "PUT", pol, body, 401},
		{mon, "GET", "/api/queues", nil, 200},
		{mon, "GET", "/api/nodes", nil, 200},
		{mon, "GET", "/api/users", nil, 401},
		{mon, "PUT", "/api/vhosts/" + url.PathEscape(v+".new"), map[string]any{}, 401},
		{mgmt, "GET", "/api/nodes", nil, 401},
		{pm, "PUT", pol, body, 201},
		{pm, "GET", pol, nil, 200},
		{pm, "DELETE", pol, nil, 204},
		{pm, "PUT", "/api/permissions/" + url.PathEscape(v) + "/" + url.PathEscape(pm), map[string]string{"configure": ".*", "write": ".*", "read": ".*"}, 401},
		{a.user, "GET", "/api/users", nil, 200},
		{a.user, "GET", "/api/definitions", nil, 200},
	} {
		st, out := a.doAs(tc.user, "pw", tc.method, tc.path, tc.body)
		if tc.user == a.user {
			st, out = a.do(tc.method, tc.path, tc.body)
		}
		if st != tc.want {
			t.Errorf("%s %s as %s: %d %s, want %d", tc.method, tc.path, tc.user, st, out, tc.want)
		}
	}
	// management lists only its vhosts; monitoring lists all.
	names := func(user string) []string {
		_, out := a.doAs(user, "pw", "GET", "/api/vhosts", nil)
		var vs []map[string]any
		json.Unmarshal(out, &vs)
		var n []string
		for _, x := range vs {
			n = append(n, x["name"].(string))
		}
		return n
	}
	if n := names(mgmt); !slices.Contains(n, v) || slices.Contains(n, other) {
		t.Errorf("management user lists vhosts %v, want %s and not %s", n, v, other)
	}
	if n := names(mon); !slices.Contains(n, v) || !slices.Contains(n, other) {
		t.Errorf("monitoring user lists vhosts %v, want both", n)
	}
	var who map[string]any
	_, out := a.doAs(mon, "pw", "GET", "/api/whoami", nil)
	json.Unmarshal(out, &who)
	if who["name"] != mon {
		t.Errorf("whoami %s", out)
	}
}

// TestITManagementUsersAndPermissions checks the bodies and codes of the user, vhost and
// permission endpoints, and that a password is never returned.
func TestITManagementUsersAndPermissions(t *testing.T) {
	a := startAdmin(t)
	v := a.vhost("api")
	u := uniq(t, "u")
	a.users = append(a.users, u)
	path := "/api/users/" + url.PathEscape(u)
	if st, out := a.do("PUT", path, map[string]any{"password": "s3cret", "tags": "management"}); st != 201 {
		t.Fatalf("PUT new user: %d %s", st, out)
	}
	if st, out := a.do("PUT", path, map[string]any{"password": "s3cret", "tags": "monitoring"}); st != 204 {
		t.Fatalf("PUT existing user: %d %s", st, out)
	}
	st, out := a.do("GET", path, nil)
	if st != 200 || json.Valid(out) == false {
		t.Fatalf("GET user: %d %s", st, out)
	}
	var user map[string]any
	json.Unmarshal(out, &user)
	if _, has := user["password"]; has || user["hashing_algorithm"] != "rabbit_password_hashing_sha256" {
		t.Fatalf("user %s", out)
	}
	perm := "/api/permissions/" + url.PathEscape(v) + "/" + url.PathEscape(u)
	if st, out := a.do("PUT", perm, map[string]string{"configure": "(", "write": ".*", "read": ".*"}); st != 400 {
		t.Fatalf("PUT an invalid permission regex: %d %s, want 400", st, out)
	}
	if st, out := a.do("PUT", perm, map[string]string{"configure": ".*", "write": ".*", "read": ".*"}); st != 201 {
		t.Fatalf("PUT permission: %d %s", st, out)
	}
	if st, _ := a.do("PUT", "/api/permissions/no-such-vhost/"+url.PathEscape(u), map[string]string{"configure": ".*", "write": ".*", "read": ".*"}); st != 400 {
		t.Fatalf("PUT permission in a missing vhost: %d, want 400", st)
	}
	if st, _ := a.do("DELETE", perm, nil); st != 204 {
		t.Fatalf("DELETE permission: %d", st)
	}
	if st, _ := a.do("GET", perm, nil); st != 404 {
		t.Fatalf("GET deleted permission: %d, want 404", st)
	}
	if st, _ := a.do("DELETE", "/api/vhosts/no-such-vhost", nil); st != 404 {
		t.Fatalf("DELETE missing vhost: %d, want 404", st)
	}
	if st, _ := a.do("DELETE", path, nil); st != 204 {
		t.Fatalf("DELETE user: %d", st)
	}
	if st, _ := a.do("GET", path, nil); st != 404 {
		t.Fatalf("GET deleted user: %d, want 404", st)
	}
}
