package core

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"warren/amqp"
	"warren/server/auth"
	"warren/storage"
)

// This file is access control's state: users, vhosts as records, permissions, topic
// permissions and vhost limits. Every change is one replicated record (proposed to the metadata
// group, applied on every node by metafsm.go), so any node authenticates any user and a change
// made on one node holds on all. The compiled values (auth.Grant, auth.TopicGrant) are made once,
// when a record is applied, and handed to connections and channels as they open: a permission
// change applies to every connection and channel opened after it, as in RabbitMQ.
//
// Lock order: accessState.mu is a leaf; nothing is called while it is held. Broker.mu (the vhost
// map) is never held while accessState.mu is taken, nor the reverse.

// Record kinds of access control (see records.go for the key layout of the others):
//
//	PrefixMeta 'I'                          the first bootstrap happened (default vhost and user made)
//	PrefixMeta 'V' name                     vhost
//	PrefixMeta 'U' name                     user
//	PrefixMeta 'P' vhost user               permission (vhost uvarint-length-prefixed)
//	PrefixMeta 'T' vhost user exchange      topic permission (vhost, user length-prefixed)
//	PrefixMeta 'M' vhost                    vhost limits
//	PrefixMeta 'Y' / 'O' vhost name         policy / operator policy (policies.go)
const (
	kindInit           byte = 'I'
	kindVHost          byte = 'V'
	kindUser           byte = 'U'
	kindPermission     byte = 'P'
	kindTopicPerm      byte = 'T'
	kindLimits         byte = 'M'
	kindPolicy         byte = 'Y'
	kindOperatorPolicy byte = 'O'
)

// The access-control metadata commands, after those of metafsm.go.
const (
	opInit metaOp = 20 + iota
	opPutVHost
	opDeleteVHost
	opPutUser
	opDeleteUser
	opPutPermission
	opDeletePermission
	opPutTopicPermission
	opDeleteTopicPermission
	opPutLimits
	opPutPolicy
	opDeletePolicy
)

// User is a user: its name, its password hash in RabbitMQ's format and its tags.
type User struct {
	Name string
	Hash auth.PasswordHash
	Tags []string
	// Limits are the user's limits (max-connections, max-channels) as set; kept and exported,
	// not enforced.
	Limits map[string]int64
}

// VHostInfo is what a vhost record holds besides its contents.
type VHostInfo struct {
	Name             string
	Description      string
	Tags             []string
	DefaultQueueType string
}

// PermissionInfo is one user's permission in one vhost.
type PermissionInfo struct {
	User, VHost string
	auth.Permission
}

// TopicPermissionInfo is one user's topic permission on one exchange of a vhost.
type TopicPermissionInfo struct {
	User, VHost string
	auth.TopicPermission
}

// The vhost limits RabbitMQ has; a negative value (or none) is no limit.
const (
	LimitMaxConnections = "max-connections"
	LimitMaxQueues      = "max-queues"
)

// Errors of the access-control API; the HTTP API maps them to RabbitMQ's statuses.
var (
	ErrNoVHost = errors.New("no such vhost")
	ErrNoUser  = errors.New("no such user")
	ErrNoPerm  = errors.New("no such permission")
)

// ValidationError is a value RabbitMQ would refuse (a bad regular expression, an unknown limit):
// the HTTP API answers 400 with Reason.
type ValidationError struct{ Reason string }

func (e *ValidationError) Error() string { return e.Reason }

// accessState is the node's copy of the replicated access-control records.
type accessState struct {
	mu          sync.RWMutex
	initialized bool
	users       map[string]*User
	vhostInfo   map[string]*VHostInfo
	grants      map[string]map[string]*auth.Grant // vhost -> user
	// topics: vhost -> user -> exchange -> grant. The innermost map is replaced, never changed,
	// so a channel may keep the one it was handed.
	topics map[string]map[string]map[string]*auth.TopicGrant
	limits map[string]map[string]int64 // vhost -> limit -> value

	// logins counts accepted [0] and refused [1] logins by protocol (AuthAMQP, AuthStream,
	// AuthHTTP), as rabbitmq_auth_attempts_* are.
	logins   [authProtocols][2]atomic.Uint64
	initDone chan struct{} // closed once the init record is applied
}

func (a *accessState) init() {
	a.users = map[string]*User{}
	a.vhostInfo = map[string]*VHostInfo{}
	a.grants = map[string]map[string]*auth.Grant{}
	a.topics = map[string]map[string]map[string]*auth.TopicGrant{}
	a.limits = map[string]map[string]int64{}
	a.initDone = make(chan struct{})
}

// --- records -------------------------------------------------------------------------------

func userKey(name string) []byte    { return append([]byte{storage.PrefixMeta, kindUser}, name...) }
func vhostKey(name string) []byte   { return append([]byte{storage.PrefixMeta, kindVHost}, name...) }
func limitsKey(vhost string) []byte { return appendLP([]byte{storage.PrefixMeta, kindLimits}, vhost) }
func initKey() []byte               { return []byte{storage.PrefixMeta, kindInit} }

// vhostPrefix is the prefix of every record of one kind in a vhost (deleting a vhost scans them).
func vhostPrefix(kind byte, vhost string) []byte {
	return appendLP([]byte{storage.PrefixMeta, kind}, vhost)
}

func permKey(vhost, user string) []byte { return metaKey(kindPermission, vhost, user) }

func topicKey(vhost, user, exchange string) []byte {
	return append(appendLP(appendLP([]byte{storage.PrefixMeta, kindTopicPerm}, vhost), user), exchange...)
}

func strings2any(ss []string) []any { return anys(ss) }

func encodeUser(u *User) []byte {
	t := amqp.Table{"name": u.Name, "hashing_algorithm": string(u.Hash.Algorithm), "password_hash": u.Hash.Salted,
		"tags": strings2any(u.Tags)}
	if len(u.Limits) > 0 {
		lt := amqp.Table{}
		for k, v := range u.Limits {
			lt[k] = v
		}
		t["limits"] = lt
	}
	return encodeRecord(t)
}

func decodeUser(b []byte) (*User, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return nil, err
	}
	u := &User{Name: str(t, "name"), Tags: stringList(t["tags"])}
	u.Hash.Algorithm = auth.Algorithm(str(t, "hashing_algorithm"))
	switch h := t["password_hash"].(type) {
	case []byte:
		u.Hash.Salted = h
	case string:
		u.Hash.Salted = []byte(h)
	}
	if lt := table(t, "limits"); len(lt) > 0 {
		u.Limits = map[string]int64{}
		for k, v := range lt {
			if n, ok := amqp.AsInt64(v); ok {
				u.Limits[k] = n
			}
		}
	}
	return u, nil
}

func encodeVHost(v *VHostInfo) []byte {
	return encodeRecord(amqp.Table{"name": v.Name, "description": v.Description, "tags": strings2any(v.Tags),
		"default_queue_type": v.DefaultQueueType})
}

func decodeVHost(b []byte) (*VHostInfo, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return nil, err
	}
	return &VHostInfo{Name: str(t, "name"), Description: str(t, "description"), Tags: stringList(t["tags"]),
		DefaultQueueType: str(t, "default_queue_type")}, nil
}

func encodePerm(p PermissionInfo) []byte {
	return encodeRecord(amqp.Table{"user": p.User, "vhost": p.VHost, "configure": p.Configure, "write": p.Write, "read": p.Read})
}

func decodePerm(b []byte) (PermissionInfo, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return PermissionInfo{}, err
	}
	return PermissionInfo{User: str(t, "user"), VHost: str(t, "vhost"),
		Permission: auth.Permission{Configure: str(t, "configure"), Write: str(t, "write"), Read: str(t, "read")}}, nil
}

func encodeTopic(p TopicPermissionInfo) []byte {
	return encodeRecord(amqp.Table{"user": p.User, "vhost": p.VHost, "exchange": p.Exchange, "write": p.Write, "read": p.Read})
}

func decodeTopic(b []byte) (TopicPermissionInfo, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return TopicPermissionInfo{}, err
	}
	return TopicPermissionInfo{User: str(t, "user"), VHost: str(t, "vhost"),
		TopicPermission: auth.TopicPermission{Exchange: str(t, "exchange"), Write: str(t, "write"), Read: str(t, "read")}}, nil
}

func encodeLimits(vhost string, l map[string]int64) []byte {
	lt := amqp.Table{}
	for k, v := range l {
		lt[k] = v
	}
	return encodeRecord(amqp.Table{"vhost": vhost, "limits": lt})
}

func decodeLimits(b []byte) (string, map[string]int64, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return "", nil, err
	}
	l := map[string]int64{}
	for k, v := range table(t, "limits") {
		if n, ok := amqp.AsInt64(v); ok {
			l[k] = n
		}
	}
	return str(t, "vhost"), l, nil
}

// initRecord is the first bootstrap's command: the default vhost, user and permission.
type initRecord struct {
	VHost VHostInfo
	User  *User // nil: no default user
}

func encodeInit(r initRecord) []byte {
	t := amqp.Table{"vhost": encodeVHost(&r.VHost)}
	if r.User != nil {
		t["user"] = encodeUser(r.User)
	}
	return encodeRecord(t)
}

func decodeInit(b []byte) (initRecord, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return initRecord{}, err
	}
	var r initRecord
	vb, _ := t["vhost"].([]byte)
	v, err := decodeVHost(vb)
	if err != nil {
		return r, err
	}
	r.VHost = *v
	if ub, ok := t["user"].([]byte); ok {
		if r.User, err = decodeUser(ub); err != nil {
			return r, err
		}
	}
	return r, nil
}

// --- applying ------------------------------------------------------------------------------

// applyAccessOp applies an access-control or policy command; false if op is not one.
func (b *Broker) applyAccessOp(op metaOp, rec []byte, batch *storage.Batch) (bool, error) {
	switch op {
	case opInit:
		r, err := decodeInit(rec)
		if err == nil {
			b.applyInit(r, batch)
		}
		return true, err
	case opPutVHost:
		v, err := decodeVHost(rec)
		if err == nil {
			b.applyPutVHost(v, batch)
		}
		return true, err
	case opDeleteVHost:
		v, err := decodeVHost(rec)
		if err == nil {
			b.applyDeleteVHost(v.Name, batch)
		}
		return true, err
	case opPutUser:
		u, err := decodeUser(rec)
		if err == nil {
			b.applyPutUser(u, batch)
		}
		return true, err
	case opDeleteUser:
		u, err := decodeUser(rec)
		if err == nil {
			b.applyDeleteUser(u.Name, batch)
		}
		return true, err
	case opPutPermission, opDeletePermission:
		p, err := decodePerm(rec)
		if err == nil {
			if op == opPutPermission {
				b.applyPutPermission(p, batch)
			} else {
				b.applyDeletePermission(p.VHost, p.User, batch)
			}
		}
		return true, err
	case opPutTopicPermission, opDeleteTopicPermission:
		p, err := decodeTopic(rec)
		if err == nil {
			if op == opPutTopicPermission {
				b.applyPutTopic(p, batch)
			} else {
				b.applyDeleteTopic(p.VHost, p.User, p.Exchange, batch)
			}
		}
		return true, err
	case opPutLimits:
		vhost, l, err := decodeLimits(rec)
		if err == nil {
			b.applyPutLimits(vhost, l, batch)
		}
		return true, err
	case opPutPolicy, opDeletePolicy:
		r, err := decodePolicyRecord(rec)
		if err == nil {
			if op == opPutPolicy {
				b.applyPutPolicy(r, batch)
			} else {
				b.applyDeletePolicy(r, batch)
			}
		}
		return true, err
	}
	return false, nil
}

func (b *Broker) applyInit(r initRecord, batch *storage.Batch) {
	a := &b.access
	a.mu.Lock()
	done := a.initialized
	a.initialized = true
	a.mu.Unlock()
	if done {
		return
	}
	batch.Set(initKey(), encodeRecord(amqp.Table{}))
	b.applyPutVHost(&r.VHost, batch)
	if r.User != nil {
		b.applyPutUser(r.User, batch)
		b.applyPutPermission(PermissionInfo{User: r.User.Name, VHost: r.VHost.Name, Permission: auth.FullAccess}, batch)
	}
	close(a.initDone)
	b.log.Info("first start: default vhost and user created", "vhost", r.VHost.Name, "user", userName(r.User))
}

// restoreInit marks the first bootstrap as done (a snapshot that has its record was installed).
func (b *Broker) restoreInit(batch *storage.Batch) {
	a := &b.access
	a.mu.Lock()
	done := a.initialized
	a.initialized = true
	a.mu.Unlock()
	batch.Set(initKey(), encodeRecord(amqp.Table{}))
	if !done {
		close(a.initDone)
	}
}

func userName(u *User) string {
	if u == nil {
		return ""
	}
	return u.Name
}

// applyPutVHost creates a vhost (or updates its description and tags).
func (b *Broker) applyPutVHost(info *VHostInfo, batch *storage.Batch) {
	b.mu.Lock()
	v := b.vhosts[info.Name]
	created := v == nil
	if created {
		v = newVHost(b, info.Name)
		b.vhosts[info.Name] = v
	}
	b.mu.Unlock()
	a := &b.access
	a.mu.Lock()
	cp := *info
	a.vhostInfo[info.Name] = &cp
	a.mu.Unlock()
	batch.Set(vhostKey(info.Name), encodeVHost(info))
	if created && !b.recovering {
		b.log.Info("vhost created", "vhost", info.Name)
	}
}

// applyDeleteVHost deletes a vhost and everything in it: its connections are closed with 320,
// its queues deleted with their stored messages and stream segments, its exchanges, bindings,
// permissions, policies and limits removed.
func (b *Broker) applyDeleteVHost(name string, batch *storage.Batch) {
	b.mu.Lock()
	v := b.vhosts[name]
	delete(b.vhosts, name)
	b.mu.Unlock()
	a := &b.access
	a.mu.Lock()
	delete(a.vhostInfo, name)
	perms := a.grants[name]
	delete(a.grants, name)
	topics := a.topics[name]
	delete(a.topics, name)
	delete(a.limits, name)
	a.mu.Unlock()
	batch.Delete(vhostKey(name))
	batch.Delete(limitsKey(name))
	for user := range perms {
		batch.Delete(permKey(name, user))
	}
	for user, xs := range topics {
		for x := range xs {
			batch.Delete(topicKey(name, user, x))
		}
	}
	b.dropVHostPolicies(name, batch)
	if v == nil {
		return
	}
	v.deleted.Store(true)
	b.CloseAll(amqp.ConnectionForced, fmt.Sprintf("vhost '%s' is deleted", name), func(ci ConnectionInfo) bool { return ci.VHost == name })
	for _, q := range v.Queues() {
		v.removeQueue(q, batch)
	}
	for _, bd := range v.ex.Bindings() {
		rec := BindingRecord{VHost: name, Binding: bd}
		k := rec.key()
		batch.Delete(k)
		lk := append([]byte(nil), k...)
		lk[1] = kindLocalBinding
		batch.Delete(lk)
	}
	for _, x := range v.ex.Exchanges() {
		if x.Durable {
			rec := ExchangeRecord{VHost: name, Name: x.Name}
			batch.Delete(rec.key())
		}
	}
	// Records written by earlier applies whose batches are still on their way are found in
	// memory above; a scan catches anything else stored under the vhost.
	for _, kind := range [...]byte{kindExchange, kindQueue, kindBinding, kindLocalQueue, kindLocalBinding, kindPermission, kindTopicPerm, kindPolicy, kindOperatorPolicy} {
		_ = b.db.Scan(vhostPrefix(kind, name), false, func(k, _ []byte) error {
			batch.Delete(append([]byte(nil), k...))
			return nil
		})
	}
	b.log.Info("vhost deleted", "vhost", name)
}

func (b *Broker) applyPutUser(u *User, batch *storage.Batch) {
	a := &b.access
	a.mu.Lock()
	_, existed := a.users[u.Name]
	a.users[u.Name] = u
	a.mu.Unlock()
	batch.Set(userKey(u.Name), encodeUser(u))
	if !existed && !b.recovering {
		b.log.Info("user created", "user", u.Name, "tags", strings.Join(u.Tags, ","))
	}
}

// applyDeleteUser deletes a user with its permissions and closes its connections with 320.
func (b *Broker) applyDeleteUser(name string, batch *storage.Batch) {
	a := &b.access
	a.mu.Lock()
	_, existed := a.users[name]
	delete(a.users, name)
	for vhost, m := range a.grants {
		if _, ok := m[name]; ok {
			delete(m, name)
			batch.Delete(permKey(vhost, name))
		}
	}
	for vhost, m := range a.topics {
		for x := range m[name] {
			batch.Delete(topicKey(vhost, name, x))
		}
		delete(m, name)
	}
	a.mu.Unlock()
	batch.Delete(userKey(name))
	if existed {
		b.CloseAll(amqp.ConnectionForced, fmt.Sprintf("user '%s' is deleted", name), func(ci ConnectionInfo) bool { return ci.User == name })
		b.log.Info("user deleted", "user", name)
	}
}

func (b *Broker) applyPutPermission(p PermissionInfo, batch *storage.Batch) {
	g, err := auth.NewGrant(p.Permission)
	if err != nil {
		b.log.Warn("replicated permission not applied", "user", p.User, "vhost", p.VHost, "err", err)
		return
	}
	a := &b.access
	a.mu.Lock()
	m := a.grants[p.VHost]
	if m == nil {
		m = map[string]*auth.Grant{}
		a.grants[p.VHost] = m
	}
	m[p.User] = g
	a.mu.Unlock()
	batch.Set(permKey(p.VHost, p.User), encodePerm(p))
}

func (b *Broker) applyDeletePermission(vhost, user string, batch *storage.Batch) {
	a := &b.access
	a.mu.Lock()
	delete(a.grants[vhost], user)
	a.mu.Unlock()
	batch.Delete(permKey(vhost, user))
}

func (b *Broker) applyPutTopic(p TopicPermissionInfo, batch *storage.Batch) {
	g, err := auth.NewTopicGrant(p.User, p.VHost, p.TopicPermission)
	if err != nil {
		b.log.Warn("replicated topic permission not applied", "user", p.User, "vhost", p.VHost, "err", err)
		return
	}
	a := &b.access
	a.mu.Lock()
	m := a.topics[p.VHost]
	if m == nil {
		m = map[string]map[string]*auth.TopicGrant{}
		a.topics[p.VHost] = m
	}
	next := make(map[string]*auth.TopicGrant, len(m[p.User])+1)
	for k, v := range m[p.User] {
		next[k] = v
	}
	next[p.Exchange] = g
	m[p.User] = next
	a.mu.Unlock()
	batch.Set(topicKey(p.VHost, p.User, p.Exchange), encodeTopic(p))
}

func (b *Broker) applyDeleteTopic(vhost, user, exchange string, batch *storage.Batch) {
	a := &b.access
	a.mu.Lock()
	if m := a.topics[vhost]; m != nil && m[user] != nil {
		next := make(map[string]*auth.TopicGrant, len(m[user]))
		for k, v := range m[user] {
			if k != exchange {
				next[k] = v
			}
		}
		if len(next) == 0 {
			delete(m, user)
		} else {
			m[user] = next
		}
	}
	a.mu.Unlock()
	batch.Delete(topicKey(vhost, user, exchange))
}

func (b *Broker) applyPutLimits(vhost string, l map[string]int64, batch *storage.Batch) {
	a := &b.access
	a.mu.Lock()
	if len(l) == 0 {
		delete(a.limits, vhost)
	} else {
		a.limits[vhost] = l
	}
	a.mu.Unlock()
	if len(l) == 0 {
		batch.Delete(limitsKey(vhost))
		return
	}
	batch.Set(limitsKey(vhost), encodeLimits(vhost, l))
}

// --- bootstrap -----------------------------------------------------------------------------

// initTimeout bounds how long New waits for the first bootstrap's records (a cluster may still
// be waiting for a majority; the proposal goes on in the background after that).
const initTimeout = 30 * time.Second

// bootstrapAccess proposes the first bootstrap's records, unless they were applied before: the
// vhost "/" and, when configured, the default user with full permissions there. Every node that
// bootstraps proposes it; the first one applied wins, the others change nothing.
func (b *Broker) bootstrapAccess() {
	a := &b.access
	a.mu.RLock()
	done := a.initialized
	a.mu.RUnlock()
	if done || b.opts.Join {
		return
	}
	rec := initRecord{VHost: VHostInfo{Name: "/", Description: "Default virtual host"}}
	if b.opts.DefaultUser != "" {
		h, err := auth.HashPassword(auth.DefaultAlgorithm, b.opts.DefaultPass)
		if err != nil {
			b.log.Error("cannot hash the default user's password", "err", err)
			return
		}
		rec.User = &User{Name: b.opts.DefaultUser, Hash: h, Tags: []string{auth.TagAdministrator}}
	}
	cmd := encodeInit(rec)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), metaTimeout)
			go func() {
				select {
				case <-b.quit:
				case <-ctx.Done():
				}
				cancel()
			}()
			err := b.propose(ctx, opInit, cmd)
			cancel()
			if err == nil {
				return
			}
			select {
			case <-b.quit:
				return
			case <-a.initDone:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	select {
	case <-a.initDone:
	case <-b.opts.StartAbort:
	case <-time.After(initTimeout):
		b.log.Warn("the default vhost and user are not created yet (no majority of the cluster?); still trying", "after", initTimeout)
	}
}

// --- reading -------------------------------------------------------------------------------

// Principal is an authenticated user as a connection keeps it.
type Principal struct {
	Name string
	Tags []string
}

// Login checks a password login (PLAIN, AMQPLAIN, HTTP Basic) from remote, as RabbitMQ's
// internal backend does, including the loopback-users rule. cache, if not nil, holds this
// connection's previous check (a repeated check costs a comparison, not a hash). A failure is an
// *auth.LoginError; it is logged and counted here, never with the password.
func (b *Broker) Login(mechanism, name, password string, remote net.Addr, cache *auth.Cache) (Principal, error) {
	return b.login(mechanism, name, password, remote, cache, AuthAMQP)
}

// LoginHTTP is Login (PLAIN) for the HTTP API, counted apart as RabbitMQ's auth attempts are
// by protocol.
func (b *Broker) LoginHTTP(name, password string, remote net.Addr, cache *auth.Cache) (Principal, error) {
	return b.login("PLAIN", name, password, remote, cache, AuthHTTP)
}

// LoginStream is Login for RabbitMQ's stream protocol, counted under its own protocol.
func (b *Broker) LoginStream(mechanism, name, password string, remote net.Addr) (Principal, error) {
	return b.login(mechanism, name, password, remote, nil, AuthStream)
}

// AuthProtocol is the protocol a login came by, as rabbitmq_auth_attempts_* label it.
type AuthProtocol uint8

// The protocols logins are counted by.
const (
	AuthAMQP AuthProtocol = iota
	AuthStream
	AuthHTTP
	authProtocols
)

// String is the protocol's label value (rabbitmq_prometheus's "amqp091", "stream", "http").
func (p AuthProtocol) String() string {
	switch p {
	case AuthStream:
		return "stream"
	case AuthHTTP:
		return "http"
	}
	return "amqp091"
}

func (b *Broker) login(mechanism, name, password string, remote net.Addr, cache *auth.Cache, proto AuthProtocol) (Principal, error) {
	a := &b.access
	a.mu.RLock()
	u := a.users[name]
	a.mu.RUnlock()
	var stored *auth.PasswordHash
	if u != nil {
		stored = &u.Hash
	}
	err := auth.Authenticate(mechanism, name, stored, password, cache)
	if err == nil {
		err = auth.CheckLoopback(mechanism, name, b.opts.LoopbackUsers, remote)
	}
	return b.loginResult(u, name, mechanism, remote, err, proto)
}

// LoginExternal logs in the user a verified certificate named (the EXTERNAL mechanism): the
// user must exist; no password is checked.
func (b *Broker) LoginExternal(name string, remote net.Addr) (Principal, error) {
	a := &b.access
	a.mu.RLock()
	u := a.users[name]
	a.mu.RUnlock()
	var err error
	if u == nil {
		err = auth.UnknownUser("EXTERNAL", name)
	} else {
		err = auth.CheckLoopback("EXTERNAL", name, b.opts.LoopbackUsers, remote)
	}
	return b.loginResult(u, name, "EXTERNAL", remote, err, AuthAMQP)
}

// LoginRefused logs and counts a login the session refused itself (an EXTERNAL login without a
// usable certificate).
func (b *Broker) LoginRefused(name string, remote net.Addr, err error) {
	b.loginResult(nil, name, "EXTERNAL", remote, err, AuthAMQP)
}

// loginResult counts and logs a login by protocol.
func (b *Broker) loginResult(u *User, name, mechanism string, remote net.Addr, err error, proto AuthProtocol) (Principal, error) {
	counts := &b.access.logins[proto]
	if err != nil {
		n := counts[1].Add(1)
		peer := ""
		if remote != nil {
			peer = remote.String()
		}
		b.log.Warn("login refused", "user", name, "peer", peer, "mechanism", mechanism, "protocol", proto.String(),
			"reason", err.Error(), "failed_total", n)
		return Principal{}, err
	}
	counts[0].Add(1)
	return Principal{Name: u.Name, Tags: slices.Clone(u.Tags)}, nil
}

// AuthAttempts reports the logins accepted and refused since the node started, of every
// protocol.
func (b *Broker) AuthAttempts() (succeeded, failed uint64) {
	for p := range b.access.logins {
		succeeded += b.access.logins[p][0].Load()
		failed += b.access.logins[p][1].Load()
	}
	return succeeded, failed
}

// AuthAttemptsOf splits AuthAttempts by protocol.
func (b *Broker) AuthAttemptsOf(p AuthProtocol) (succeeded, failed uint64) {
	return b.access.logins[p][0].Load(), b.access.logins[p][1].Load()
}

// AuthProtocols lists the protocols logins are counted by.
func AuthProtocols() []AuthProtocol { return []AuthProtocol{AuthAMQP, AuthStream, AuthHTTP} }

// VHostGrant is the user's compiled permission in vhost, nil if the user has none there.
func (b *Broker) VHostGrant(user, vhost string) *auth.Grant {
	a := &b.access
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.grants[vhost][user]
}

// TopicGrants are the user's topic permissions in vhost by exchange (nil if none). The map is
// shared and never changed: do not modify it.
func (b *Broker) TopicGrants(user, vhost string) map[string]*auth.TopicGrant {
	a := &b.access
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.topics[vhost][user]
}

// LookupUser returns the named user.
func (b *Broker) LookupUser(name string) (User, bool) {
	a := &b.access
	a.mu.RLock()
	defer a.mu.RUnlock()
	u := a.users[name]
	if u == nil {
		return User{}, false
	}
	return *u, true
}

// Users lists the users, sorted by name.
func (b *Broker) Users() []User {
	a := &b.access
	a.mu.RLock()
	out := make([]User, 0, len(a.users))
	for _, u := range a.users {
		out = append(out, *u)
	}
	a.mu.RUnlock()
	slices.SortFunc(out, func(x, y User) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// VHostInfos lists the vhosts' records, sorted by name.
func (b *Broker) VHostInfos() []VHostInfo {
	a := &b.access
	a.mu.RLock()
	out := make([]VHostInfo, 0, len(a.vhostInfo))
	for _, v := range a.vhostInfo {
		out = append(out, *v)
	}
	a.mu.RUnlock()
	slices.SortFunc(out, func(x, y VHostInfo) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// LookupVHost returns a vhost's record.
func (b *Broker) LookupVHost(name string) (VHostInfo, bool) {
	a := &b.access
	a.mu.RLock()
	defer a.mu.RUnlock()
	v := a.vhostInfo[name]
	if v == nil {
		return VHostInfo{}, false
	}
	return *v, true
}

// Permissions lists every permission, by vhost then user.
func (b *Broker) Permissions() []PermissionInfo {
	a := &b.access
	a.mu.RLock()
	var out []PermissionInfo
	for vhost, m := range a.grants {
		for user, g := range m {
			out = append(out, PermissionInfo{User: user, VHost: vhost, Permission: g.Permission()})
		}
	}
	a.mu.RUnlock()
	slices.SortFunc(out, func(x, y PermissionInfo) int {
		if c := strings.Compare(x.VHost, y.VHost); c != 0 {
			return c
		}
		return strings.Compare(x.User, y.User)
	})
	return out
}

// TopicPermissions lists every topic permission, by vhost, user, exchange.
func (b *Broker) TopicPermissions() []TopicPermissionInfo {
	a := &b.access
	a.mu.RLock()
	var out []TopicPermissionInfo
	for vhost, m := range a.topics {
		for user, xs := range m {
			for _, g := range xs {
				out = append(out, TopicPermissionInfo{User: user, VHost: vhost, TopicPermission: g.Permission()})
			}
		}
	}
	a.mu.RUnlock()
	slices.SortFunc(out, func(x, y TopicPermissionInfo) int {
		if c := strings.Compare(x.VHost, y.VHost); c != 0 {
			return c
		}
		if c := strings.Compare(x.User, y.User); c != 0 {
			return c
		}
		return strings.Compare(x.Exchange, y.Exchange)
	})
	return out
}

// VHostLimits returns a vhost's limits as set (nil: none).
func (b *Broker) VHostLimits(vhost string) map[string]int64 {
	a := &b.access
	a.mu.RLock()
	defer a.mu.RUnlock()
	l := a.limits[vhost]
	if l == nil {
		return nil
	}
	out := make(map[string]int64, len(l))
	for k, v := range l {
		out[k] = v
	}
	return out
}

// vhostLimit returns one limit of a vhost, or -1 when none is set.
func (b *Broker) vhostLimit(vhost, name string) int64 {
	a := &b.access
	a.mu.RLock()
	defer a.mu.RUnlock()
	if n, ok := a.limits[vhost][name]; ok && n >= 0 {
		return n
	}
	return -1
}

// peerCountTimeout bounds how long connection.open waits for the other nodes' connection counts
// of a vhost with a connection limit.
const peerCountTimeout = 2 * time.Second

// CheckConnectionLimit is connection.open's check of the vhost's max-connections, counted across
// the cluster as RabbitMQ does: this node's connections to it, then (while under the limit) those
// of every other member that is up, asked over the cluster port. Only vhosts with a limit pay for
// that. The error is RabbitMQ's 530.
func (b *Broker) CheckConnectionLimit(vhost, user string) *amqp.Error {
	limit := b.vhostLimit(vhost, LimitMaxConnections)
	if limit < 0 {
		return nil
	}
	n := b.LocalConnections(vhost)
	if int64(n) < limit && b.clustered() {
		ctx, cancel := context.WithTimeout(context.Background(), peerCountTimeout)
		n += b.node.CountPeerConnections(ctx, vhost)
		cancel()
	}
	if int64(n) >= limit {
		return amqp.Errorf(amqp.NotAllowed, "access to vhost '%s' refused for user '%s': connection limit (%d) is reached",
			vhost, user, limit)
	}
	return nil
}

// --- changing ------------------------------------------------------------------------------

// proposeErr replicates a change and turns the failure into an error.
func (b *Broker) proposeErr(ctx context.Context, op metaOp, rec []byte) error {
	if err := b.propose(ctx, op, rec); err != nil {
		return errors.New(err.Text)
	}
	return nil
}

// PutVHost creates a vhost or updates its description, tags and default queue type.
func (b *Broker) PutVHost(ctx context.Context, info VHostInfo) error {
	if info.Name == "" {
		return &ValidationError{Reason: "vhost name must not be empty"}
	}
	return b.proposeErr(ctx, opPutVHost, encodeVHost(&info))
}

// DeleteVHost deletes a vhost and everything in it (ErrNoVHost if there is none).
func (b *Broker) DeleteVHost(ctx context.Context, name string) error {
	if _, ok := b.LookupVHost(name); !ok {
		return ErrNoVHost
	}
	return b.proposeErr(ctx, opDeleteVHost, encodeVHost(&VHostInfo{Name: name}))
}

// PutUser creates or replaces a user.
func (b *Broker) PutUser(ctx context.Context, u User) error {
	if u.Name == "" {
		return &ValidationError{Reason: "user name must not be empty"}
	}
	if u.Tags == nil {
		u.Tags = []string{}
	}
	return b.proposeErr(ctx, opPutUser, encodeUser(&u))
}

// DeleteUser deletes a user and its permissions (ErrNoUser if there is none); its connections
// are closed with 320.
func (b *Broker) DeleteUser(ctx context.Context, name string) error {
	if _, ok := b.LookupUser(name); !ok {
		return ErrNoUser
	}
	return b.proposeErr(ctx, opDeleteUser, encodeUser(&User{Name: name}))
}

// SetPermission sets a user's permission in a vhost; both must exist. An invalid pattern is a
// *ValidationError.
func (b *Broker) SetPermission(ctx context.Context, p PermissionInfo) error {
	if _, ok := b.LookupUser(p.User); !ok {
		return ErrNoUser
	}
	if _, ok := b.LookupVHost(p.VHost); !ok {
		return ErrNoVHost
	}
	if _, err := auth.NewGrant(p.Permission); err != nil {
		return &ValidationError{Reason: err.Error()}
	}
	return b.proposeErr(ctx, opPutPermission, encodePerm(p))
}

// ClearPermission removes a user's permission in a vhost (ErrNoPerm if there is none).
func (b *Broker) ClearPermission(ctx context.Context, user, vhost string) error {
	if b.VHostGrant(user, vhost) == nil {
		return ErrNoPerm
	}
	return b.proposeErr(ctx, opDeletePermission, encodePerm(PermissionInfo{User: user, VHost: vhost}))
}

// SetTopicPermission sets a user's topic permission on one exchange of a vhost.
func (b *Broker) SetTopicPermission(ctx context.Context, p TopicPermissionInfo) error {
	if _, ok := b.LookupUser(p.User); !ok {
		return ErrNoUser
	}
	if _, ok := b.LookupVHost(p.VHost); !ok {
		return ErrNoVHost
	}
	if _, err := auth.NewTopicGrant(p.User, p.VHost, p.TopicPermission); err != nil {
		return &ValidationError{Reason: err.Error()}
	}
	return b.proposeErr(ctx, opPutTopicPermission, encodeTopic(p))
}

// ClearTopicPermissions removes a user's topic permissions in a vhost: on one exchange, or on
// all when exchange is "" (ErrNoPerm if there is none).
func (b *Broker) ClearTopicPermissions(ctx context.Context, user, vhost, exchange string) error {
	grants := b.TopicGrants(user, vhost)
	if len(grants) == 0 {
		return ErrNoPerm
	}
	for x := range grants {
		if exchange != "" && x != exchange {
			continue
		}
		if err := b.proposeErr(ctx, opDeleteTopicPermission, encodeTopic(TopicPermissionInfo{User: user, VHost: vhost,
			TopicPermission: auth.TopicPermission{Exchange: x}})); err != nil {
			return err
		}
	}
	return nil
}

// SetVHostLimits replaces a vhost's limits (an empty map clears them). Names other than
// max-connections and max-queues are a *ValidationError, as in RabbitMQ.
func (b *Broker) SetVHostLimits(ctx context.Context, vhost string, limits map[string]int64) error {
	if _, ok := b.LookupVHost(vhost); !ok {
		return ErrNoVHost
	}
	for k := range limits {
		if k != LimitMaxConnections && k != LimitMaxQueues {
			return &ValidationError{Reason: fmt.Sprintf("Validation failed\n\n[{<<\"%s\">>,%d}] are not recognised limit settings\n", k, limits[k])}
		}
	}
	return b.proposeErr(ctx, opPutLimits, encodeLimits(vhost, limits))
}
