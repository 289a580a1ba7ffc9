package auth

import (
	"errors"
	"slices"
	"testing"
)

func TestParseTags(t *testing.T) {
	for in, want := range map[string][]string{
		"":                       {},
		"administrator":          {"administrator"},
		"monitoring, custom ,,x": {"monitoring", "custom", "x"}, // RabbitMQ 3.10.8 stores exactly these
		" , ":                    {},
		"a,a":                    {"a", "a"},
		"with space inside":      {"with space inside"},
	} {
		if got := ParseTags(in); !slices.Equal(got, want) {
			t.Errorf("ParseTags(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTagPredicates(t *testing.T) {
	for _, tc := range []struct {
		tags                        []string
		admin, monitor, policy, api bool
	}{
		{nil, false, false, false, false},
		{[]string{"custom"}, false, false, false, false},
		{[]string{TagImpersonator}, false, false, false, false},
		{[]string{TagManagement}, false, false, false, true},
		{[]string{TagPolicymaker}, false, false, true, true},
		{[]string{TagMonitoring}, false, true, false, true},
		{[]string{TagAdministrator}, true, true, true, true},
		{[]string{"custom", TagMonitoring, TagPolicymaker}, false, true, true, true},
	} {
		if IsAdministrator(tc.tags) != tc.admin || IsMonitor(tc.tags) != tc.monitor ||
			IsPolicymaker(tc.tags) != tc.policy || IsManagementUser(tc.tags) != tc.api {
			t.Errorf("%q: admin %v monitor %v policymaker %v management %v", tc.tags,
				IsAdministrator(tc.tags), IsMonitor(tc.tags), IsPolicymaker(tc.tags), IsManagementUser(tc.tags))
		}
	}
}

func TestAuthorizeHTTP(t *testing.T) {
	const (
		notMgmt   = "Not management user"
		notAdmin  = "Not administrator user"
		notMon    = "Not monitor user"
		notVhost  = "User not authorised to access virtual host"
		notObject = "User not authorised to access object"
	)
	admin := []string{TagAdministrator}
	mgmt := []string{TagManagement}
	mon := []string{TagMonitoring}
	pol := []string{TagPolicymaker}
	for _, tc := range []struct {
		name   string
		rule   HTTPAccess
		req    HTTPRequest
		reason string // "" means allowed
	}{
		{"no tags anywhere", HTTPAny, HTTPRequest{Method: "GET"}, notMgmt},
		{"custom tag only", HTTPAny, HTTPRequest{Method: "GET", Tags: []string{"x"}}, notMgmt},
		{"OPTIONS needs nothing", HTTPAdministrator, HTTPRequest{Method: "OPTIONS"}, ""},
		{"management, any", HTTPAny, HTTPRequest{Method: "GET", Tags: mgmt}, ""},
		{"management, admin rule", HTTPAdministrator, HTTPRequest{Method: "GET", Tags: mgmt}, notAdmin},
		{"monitoring, admin rule", HTTPAdministrator, HTTPRequest{Method: "GET", Tags: mon}, notAdmin},
		{"administrator, admin rule", HTTPAdministrator, HTTPRequest{Method: "DELETE", Tags: admin}, ""},
		{"management, monitor rule", HTTPMonitor, HTTPRequest{Method: "GET", Tags: mgmt}, notMon},
		{"monitoring, monitor rule", HTTPMonitor, HTTPRequest{Method: "GET", Tags: mon}, ""},
		{"management, own vhost", HTTPVhost, HTTPRequest{Method: "GET", Tags: mgmt, Vhost: "v", VhostAccess: true}, ""},
		{"management, other vhost", HTTPVhost, HTTPRequest{Method: "GET", Tags: mgmt, Vhost: "v"}, notVhost},
		{"management, no vhost named", HTTPVhost, HTTPRequest{Method: "GET", Tags: mgmt}, ""},
		{"monitoring, other vhost", HTTPVhost, HTTPRequest{Method: "GET", Tags: mon, Vhost: "v"}, notVhost},
		{"administrator, other vhost", HTTPVhost, HTTPRequest{Method: "PUT", Tags: admin, Vhost: "v"}, ""},
		{"monitoring, visible vhost", HTTPVhostVisible, HTTPRequest{Method: "GET", Tags: mon, Vhost: "v"}, ""},
		{"management, invisible vhost", HTTPVhostVisible, HTTPRequest{Method: "GET", Tags: mgmt, Vhost: "v"}, notVhost},
		{"policymaker, own vhost", HTTPPolicies, HTTPRequest{Method: "PUT", Tags: pol, Vhost: "v", VhostAccess: true}, ""},
		{"policymaker, other vhost", HTTPPolicies, HTTPRequest{Method: "PUT", Tags: pol, Vhost: "v"}, notObject},
		{"management, policies", HTTPPolicies, HTTPRequest{Method: "PUT", Tags: mgmt, Vhost: "v", VhostAccess: true}, notObject},
		{"administrator, policies anywhere", HTTPPolicies, HTTPRequest{Method: "PUT", Tags: admin, Vhost: "v"}, ""},
		{"policymaker, global parameters", HTTPGlobalParameters, HTTPRequest{Method: "GET", Tags: pol}, ""},
		{"monitoring, global parameters", HTTPGlobalParameters, HTTPRequest{Method: "GET", Tags: mon}, notObject},
		{"own connection", HTTPOwner, HTTPRequest{Method: "DELETE", Tags: mgmt, User: "u", Owner: "u"}, ""},
		{"other's connection", HTTPOwner, HTTPRequest{Method: "GET", Tags: mgmt, User: "u", Owner: "o"}, notObject},
		{"monitor reads other's", HTTPOwner, HTTPRequest{Method: "GET", Tags: mon, User: "u", Owner: "o"}, ""},
		{"monitor deletes other's", HTTPOwner, HTTPRequest{Method: "DELETE", Tags: mon, User: "u", Owner: "o"}, notObject},
		{"administrator deletes other's", HTTPOwner, HTTPRequest{Method: "DELETE", Tags: admin, User: "u", Owner: "o"}, ""},
		{"unknown rule fails closed", HTTPAccess(200), HTTPRequest{Method: "GET", Tags: mon}, notAdmin},
	} {
		err := AuthorizeHTTP(tc.rule, tc.req)
		if tc.reason == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		var he *HTTPError
		if !errors.As(err, &he) || he.Status != 401 || he.Err != "not_authorised" || he.Reason != tc.reason {
			t.Errorf("%s: %#v, want 401 not_authorised %q", tc.name, err, tc.reason)
		}
	}
	if lf := LoginFailed(); lf.Status != 401 || lf.Err != "not_authorized" || lf.Reason != "Login failed" || lf.Error() != "Login failed" {
		t.Errorf("LoginFailed() = %#v", lf)
	}
}

func TestListingVisibility(t *testing.T) {
	for _, tc := range []struct {
		tags                   []string
		access                 bool
		vhost, objects, others bool
	}{
		{[]string{TagManagement}, true, true, true, false},
		{[]string{TagManagement}, false, false, false, false},
		{[]string{TagMonitoring}, false, true, false, true}, // as RabbitMQ 3.10.8: sees the vhost, not its queues
		{[]string{TagAdministrator}, false, true, true, true},
		{[]string{TagPolicymaker}, true, true, true, false},
	} {
		if VhostVisible(tc.tags, tc.access) != tc.vhost || ListsVhostObjects(tc.tags, tc.access) != tc.objects ||
			SeesOthersConnections(tc.tags) != tc.others {
			t.Errorf("%q access %v: vhost %v objects %v others %v", tc.tags, tc.access,
				VhostVisible(tc.tags, tc.access), ListsVhostObjects(tc.tags, tc.access), SeesOthersConnections(tc.tags))
		}
	}
}
