package auth

import (
	"net/http"
	"slices"
	"strings"
)

// The user tags RabbitMQ gives a meaning to. Any other string is a valid tag that means nothing
// to the broker (tools use them as labels).
const (
	TagAdministrator = "administrator" // everything in the management API
	TagMonitoring    = "monitoring"    // management, plus read access to every vhost, node and connection
	TagPolicymaker   = "policymaker"   // management, plus policies and parameters in vhosts they can access
	TagManagement    = "management"    // the management API, for the vhosts they have permissions in
	TagImpersonator  = "impersonator"  // may publish with another user's user-id
)

// ParseTags reads tags given as one comma-separated string (the management API's PUT body and
// definitions files before 3.9), trimming spaces and dropping empty items, as
// rabbit_auth_backend_internal:tag_list_from/1 does.
func ParseTags(s string) []string {
	tags := []string{}
	for _, t := range strings.Split(s, ",") {
		if t = strings.Trim(t, " "); t != "" {
			tags = append(tags, t)
		}
	}
	return tags
}

// IsAdministrator reports whether tags include administrator.
func IsAdministrator(tags []string) bool { return slices.Contains(tags, TagAdministrator) }

// IsMonitor reports whether tags let a user read everything (administrator or monitoring).
func IsMonitor(tags []string) bool {
	return slices.Contains(tags, TagAdministrator) || slices.Contains(tags, TagMonitoring)
}

// IsPolicymaker reports whether tags let a user manage policies (administrator or policymaker).
func IsPolicymaker(tags []string) bool {
	return slices.Contains(tags, TagAdministrator) || slices.Contains(tags, TagPolicymaker)
}

// IsManagementUser reports whether tags let a user into the management API at all.
func IsManagementUser(tags []string) bool {
	return IsMonitor(tags) || slices.Contains(tags, TagPolicymaker) || slices.Contains(tags, TagManagement)
}

// HTTPAccess is the authorisation rule of one management API endpoint, one per
// rabbit_mgmt_util:is_authorized* function.
type HTTPAccess uint8

// The rules. Which endpoint uses which, as RabbitMQ 3.10 has it:
//
//	HTTPAny: /api/overview, /api/whoami, /api/vhosts (list), /api/connections, /api/channels,
//	  /api/consumers, /api/cluster-name (GET), /api/health/checks/*
//	HTTPAdministrator: /api/users*, /api/vhosts/{v} (GET, PUT, DELETE), /api/permissions*,
//	  /api/topic-permissions*, /api/definitions*, /api/operator-policies/{v}/{name},
//	  /api/vhost-limits/{v}/{name}, /api/user-limits/{u}/{name}, /api/cluster-name (PUT),
//	  /api/queues/{v}/{q}/actions, /api/feature-flags
//	HTTPMonitor: /api/nodes*, /api/auth/attempts
//	HTTPVhost: /api/queues*, /api/exchanges*, /api/bindings*, /api/policies (lists),
//	  /api/operator-policies (lists), /api/aliveness-test/{v}, /api/connections/vhost (etc.)
//	HTTPVhostVisible: /api/vhost-limits (lists), /api/user-limits (lists)
//	HTTPPolicies: /api/policies/{v}/{name}, /api/parameters*
//	HTTPGlobalParameters: /api/global-parameters*
//	HTTPOwner: /api/connections/{name}, /api/channels/{name}, /api/connections/username/{u}
const (
	HTTPAny HTTPAccess = iota
	HTTPAdministrator
	HTTPMonitor
	HTTPVhost
	HTTPVhostVisible
	HTTPPolicies
	HTTPGlobalParameters
	HTTPOwner
)

// HTTPRequest is what an HTTPAccess rule looks at, once the user has authenticated.
type HTTPRequest struct {
	User string
	Tags []string
	// Method is the HTTP method; OPTIONS is always allowed, and HTTPOwner lets only
	// administrators DELETE other users' objects.
	Method string
	// Vhost is the vhost the request names (in the path, or the X-Vhost header); "" if none or
	// if it does not exist (the handler answers 404 for that later).
	Vhost string
	// VhostAccess is whether User has permissions in Vhost.
	VhostAccess bool
	// Owner is the user owning the object (a connection's or channel's user), for HTTPOwner.
	Owner string
}

// HTTPError is a management API refusal: its status and the JSON body {"error": Error,
// "reason": Reason} RabbitMQ sends.
type HTTPError struct {
	Status int
	Err    string
	Reason string
}

// Error implements error.
func (e *HTTPError) Error() string { return e.Reason }

// LoginFailed is the management API's answer to bad or missing credentials (RabbitMQ also sets
// a WWW-Authenticate header then). Lookups of unknown users answer the same.
func LoginFailed() *HTTPError {
	return &HTTPError{Status: http.StatusUnauthorized, Err: "not_authorized", Reason: "Login failed"}
}

// notAuthorised is RabbitMQ's 401 for an authenticated user the rule refuses (there is no
// WWW-Authenticate header then).
func notAuthorised(reason string) *HTTPError {
	return &HTTPError{Status: http.StatusUnauthorized, Err: "not_authorised", Reason: reason}
}

// AuthorizeHTTP applies rule a to an authenticated request (rabbit_mgmt_util:is_authorized/6 and
// the functions it is given): a user without a management tag is refused everywhere, then the
// rule decides. nil means allowed. Loopback users connecting from elsewhere are refused before
// (CheckLoopback, whose HTTP reason is "User can only log in via localhost").
func AuthorizeHTTP(a HTTPAccess, r HTTPRequest) error {
	if r.Method == http.MethodOptions {
		return nil
	}
	if !IsManagementUser(r.Tags) {
		return notAuthorised("Not management user")
	}
	admin := IsAdministrator(r.Tags)
	inVhost := r.Vhost == "" || r.VhostAccess
	switch a {
	case HTTPAny:
		return nil
	case HTTPAdministrator:
		if !admin {
			return notAuthorised("Not administrator user")
		}
	case HTTPMonitor:
		if !IsMonitor(r.Tags) {
			return notAuthorised("Not monitor user")
		}
	case HTTPVhost:
		if !admin && !inVhost {
			return notAuthorised("User not authorised to access virtual host")
		}
	case HTTPVhostVisible:
		if !admin && !IsMonitor(r.Tags) && !inVhost {
			return notAuthorised("User not authorised to access virtual host")
		}
	case HTTPPolicies:
		if !admin && !(IsPolicymaker(r.Tags) && inVhost) {
			return notAuthorised("User not authorised to access object")
		}
	case HTTPGlobalParameters:
		if !IsPolicymaker(r.Tags) {
			return notAuthorised("User not authorised to access object")
		}
	case HTTPOwner:
		ok := IsMonitor(r.Tags)
		if r.Method == http.MethodDelete {
			ok = admin
		}
		if !ok && r.User != r.Owner {
			return notAuthorised("User not authorised to access object")
		}
	default:
		return notAuthorised("Not administrator user")
	}
	return nil
}

// VhostVisible reports whether a vhost appears in a user's listings (/api/vhosts, and the vhost
// filter of /api/queues, /api/exchanges and the like): monitors see every vhost, other users those
// they have permissions in (rabbit_mgmt_util:list_visible_vhosts/2).
func VhostVisible(tags []string, vhostAccess bool) bool { return IsMonitor(tags) || vhostAccess }

// ListsVhostObjects reports whether a vhost's queues, exchanges and bindings appear in a user's
// listings: administrators see every vhost's, everyone else, monitors included, only those of
// vhosts they have permissions in (rabbit_mgmt_util:filter_vhost/3).
func ListsVhostObjects(tags []string, vhostAccess bool) bool {
	return IsAdministrator(tags) || vhostAccess
}

// SeesOthersConnections reports whether a user's connection and channel listings include other
// users' (monitors and administrators); everyone else sees only their own
// (rabbit_mgmt_util:filter_user/2).
func SeesOthersConnections(tags []string) bool { return IsMonitor(tags) }
