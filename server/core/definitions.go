package core

import (
	"context"
	"fmt"
	"strings"

	"warren/amqp"
	"warren/exchange"
	"warren/server/auth"
	"warren/server/definitions"
	"warren/server/policy"
)

// ImportDefinitions applies a decoded definitions document (GET/POST /api/definitions,
// --load-definitions) in RabbitMQ's order: users, vhosts, limits, permissions, exchanges, topic
// permissions, policies, operator policies, queues, bindings. Everything that can be checked is
// checked first (vhosts and users named, password hashes, queue arguments, binding ends), and a
// document with any problem is refused whole with a *definitions.Error before anything changes.
// Existing queues and exchanges are left as they are. into is the vhost of a single-vhost
// document ("" for a whole one). It returns what the document holds that was not imported.
func (b *Broker) ImportDefinitions(ctx context.Context, d *definitions.Definitions, into string) ([]definitions.Skipped, error) {
	if actorOf(ctx).Via == "" {
		ctx = WithActor(ctx, Actor{Via: "definitions"}) // --load-definitions at boot
	}
	if into != "" {
		if _, ok := b.LookupVHost(into); !ok {
			return nil, ErrNoVHost
		}
	}
	vhostExists := func(n string) bool { _, ok := b.LookupVHost(n); return ok }
	userExists := func(n string) bool { _, ok := b.LookupUser(n); return ok }
	if err := d.Validate(vhostExists, userExists); err != nil {
		return nil, err
	}
	var problems []definitions.Problem
	problem := func(path, format string, args ...any) {
		problems = append(problems, definitions.Problem{Path: path, Reason: fmt.Sprintf(format, args...)})
	}
	users := make([]User, 0, len(d.Users))
	for i, u := range d.Users {
		nu := User{Name: u.Name, Tags: u.Tags, Limits: u.Limits}
		switch {
		case u.HasPassword:
			h, err := auth.HashPassword(auth.DefaultAlgorithm, u.Password)
			if err != nil {
				problem(fmt.Sprintf("users[%d]", i), "%v", err)
				continue
			}
			nu.Hash = h
		case u.PasswordHash != "":
			h, err := auth.ParseDefinitionHash(u.PasswordHash, u.HashingAlgorithm, d.RabbitVersion)
			if err != nil {
				problem(fmt.Sprintf("users[%d].password_hash", i), "%v", err)
				continue
			}
			nu.Hash = h
		}
		users = append(users, nu)
	}
	// Exchanges that will exist: those of the file and those on the broker.
	fileExchange := map[[2]string]bool{}
	for _, x := range d.Exchanges {
		fileExchange[[2]string{x.VHost, x.Name}] = true
	}
	fileQueue := map[[2]string]bool{}
	for i, q := range d.Queues {
		fileQueue[[2]string{q.VHost, q.Name}] = true
		args := definitions.Table(q.Arguments)
		if q.Type != "" && q.Type != "classic" {
			if args == nil {
				args = amqp.Table{}
			}
			args["x-queue-type"] = q.Type
		}
		if _, err := parseQueueArgs(q.Name, q.VHost, args, b.hasType); err != nil {
			problem(fmt.Sprintf("queues[%d]", i), "%s", err.Text)
		}
	}
	exchangeExists := func(vhost, name string) bool {
		if name == "" || fileExchange[[2]string{vhost, name}] {
			return true
		}
		if v := b.VHost(vhost); v != nil {
			_, ok := v.Exchange(name)
			return ok || strings.HasPrefix(name, "amq.")
		}
		return strings.HasPrefix(name, "amq.")
	}
	for i, bd := range d.Bindings {
		if !exchangeExists(bd.VHost, bd.Source) {
			problem(fmt.Sprintf("bindings[%d]", i), "source exchange '%s' in vhost '%s' does not exist and is not created by this file", bd.Source, bd.VHost)
		}
		if bd.DestinationType == "exchange" {
			if !exchangeExists(bd.VHost, bd.Destination) {
				problem(fmt.Sprintf("bindings[%d]", i), "destination exchange '%s' in vhost '%s' does not exist and is not created by this file", bd.Destination, bd.VHost)
			}
		} else if !fileQueue[[2]string{bd.VHost, bd.Destination}] {
			if v := b.VHost(bd.VHost); v == nil || v.Queue(bd.Destination) == nil {
				problem(fmt.Sprintf("bindings[%d]", i), "destination queue '%s' in vhost '%s' does not exist and is not created by this file", bd.Destination, bd.VHost)
			}
		}
	}
	if len(problems) > 0 {
		return nil, &definitions.Error{Problems: problems}
	}

	fail := func(what string, err error) error { return fmt.Errorf("import %s: %w", what, err) }
	for _, u := range users {
		if err := b.PutUser(ctx, u); err != nil {
			return nil, fail("user '"+u.Name+"'", err)
		}
	}
	for _, v := range d.VHosts {
		if err := b.PutVHost(ctx, VHostInfo{Name: v.Name, Description: v.Description, Tags: v.Tags, DefaultQueueType: v.DefaultQueueType}); err != nil {
			return nil, fail("vhost '"+v.Name+"'", err)
		}
	}
	for _, l := range d.VHostLimits {
		if err := b.SetVHostLimits(ctx, l.VHost, l.Limits); err != nil {
			return nil, fail("limits of vhost '"+l.VHost+"'", err)
		}
	}
	for _, p := range d.Permissions {
		if err := b.SetPermission(ctx, PermissionInfo{User: p.User, VHost: p.VHost,
			Permission: auth.Permission{Configure: p.Configure, Write: p.Write, Read: p.Read}}); err != nil {
			return nil, fail(fmt.Sprintf("permission of '%s' in vhost '%s'", p.User, p.VHost), err)
		}
	}
	for _, x := range d.Exchanges {
		v := b.VHost(x.VHost)
		if v == nil {
			return nil, fail("exchange '"+x.Name+"'", ErrNoVHost)
		}
		if _, exists := v.Exchange(x.Name); exists {
			continue
		}
		if err := v.DeclareExchange(ctx, ExchangeDecl{Name: x.Name, Type: x.Type, Durable: x.Durable, AutoDelete: x.AutoDelete,
			Internal: x.Internal, Args: definitions.Table(x.Arguments)}); err != nil {
			return nil, fail(fmt.Sprintf("exchange '%s' in vhost '%s'", x.Name, x.VHost), fmt.Errorf("%s", err.Text))
		}
	}
	for _, p := range d.TopicPermissions {
		if err := b.SetTopicPermission(ctx, TopicPermissionInfo{User: p.User, VHost: p.VHost,
			TopicPermission: auth.TopicPermission{Exchange: p.Exchange, Write: p.Write, Read: p.Read}}); err != nil {
			return nil, fail(fmt.Sprintf("topic permission of '%s' in vhost '%s'", p.User, p.VHost), err)
		}
	}
	for _, p := range d.Policies {
		if err := b.PutPolicy(ctx, policy.ComponentPolicy, p); err != nil {
			return nil, fail(fmt.Sprintf("policy '%s' in vhost '%s'", p.Name, p.VHost), err)
		}
	}
	for _, p := range d.OperatorPolicies {
		if err := b.PutPolicy(ctx, policy.ComponentOperatorPolicy, p); err != nil {
			return nil, fail(fmt.Sprintf("operator policy '%s' in vhost '%s'", p.Name, p.VHost), err)
		}
	}
	for _, q := range d.Queues {
		v := b.VHost(q.VHost)
		if v == nil {
			return nil, fail("queue '"+q.Name+"'", ErrNoVHost)
		}
		if v.Queue(q.Name) != nil {
			continue
		}
		args := definitions.Table(q.Arguments)
		if q.Type != "" && q.Type != "classic" {
			if args == nil {
				args = amqp.Table{}
			}
			args["x-queue-type"] = q.Type
		}
		if _, err := v.DeclareQueue(ctx, QueueDecl{Name: q.Name, Durable: q.Durable, AutoDelete: q.AutoDelete, Args: args}, nil); err != nil {
			return nil, fail(fmt.Sprintf("queue '%s' in vhost '%s'", q.Name, q.VHost), fmt.Errorf("%s", err.Text))
		}
	}
	for _, bd := range d.Bindings {
		v := b.VHost(bd.VHost)
		if v == nil {
			return nil, fail("binding", ErrNoVHost)
		}
		kind := exchange.ToQueue
		if bd.DestinationType == "exchange" {
			kind = exchange.ToExchange
		}
		if err := v.Bind(ctx, exchange.Binding{Source: bd.Source, Dest: bd.Destination, DestKind: kind, Key: bd.RoutingKey,
			Args: definitions.Table(bd.Arguments)}, nil); err != nil {
			return nil, fail(fmt.Sprintf("binding of '%s' to '%s' in vhost '%s'", bd.Source, bd.Destination, bd.VHost), fmt.Errorf("%s", err.Text))
		}
	}
	for _, s := range d.Skipped {
		b.log.Info("definitions: not imported", "path", s.Path, "what", s.What, "reason", s.Reason)
	}
	b.log.Info("definitions imported", "users", len(d.Users), "vhosts", len(d.VHosts), "permissions", len(d.Permissions),
		"policies", len(d.Policies)+len(d.OperatorPolicies), "exchanges", len(d.Exchanges), "queues", len(d.Queues),
		"bindings", len(d.Bindings), "skipped", len(d.Skipped))
	return d.Skipped, nil
}

// ExportDefinitions describes the broker as a definitions document: everything, or one vhost's
// exchanges, queues, bindings, policies and limits when vhost is set (RabbitMQ's single-vhost
// export). Durable queues, exchanges and the bindings between them are exported, as RabbitMQ
// does; exclusive queues never are.
func (b *Broker) ExportDefinitions(vhost, version string) *definitions.Definitions {
	d := &definitions.Definitions{RabbitVersion: version, RabbitMQVersion: version, ProductName: "Warren", ProductVersion: version}
	in := func(v string) bool { return vhost == "" || v == vhost }
	if vhost == "" {
		for _, u := range b.Users() {
			d.Users = append(d.Users, definitions.User{Name: u.Name, PasswordHash: u.Hash.Encode(),
				HashingAlgorithm: string(u.Hash.Algorithm), Tags: u.Tags, Limits: u.Limits})
		}
		for _, v := range b.VHostInfos() {
			d.VHosts = append(d.VHosts, definitions.VHost{Name: v.Name, Description: v.Description, Tags: v.Tags, DefaultQueueType: v.DefaultQueueType})
		}
		for _, p := range b.Permissions() {
			d.Permissions = append(d.Permissions, definitions.Permission{User: p.User, VHost: p.VHost, Configure: p.Configure, Write: p.Write, Read: p.Read})
		}
		for _, p := range b.TopicPermissions() {
			d.TopicPermissions = append(d.TopicPermissions, definitions.TopicPermission{User: p.User, VHost: p.VHost, Exchange: p.Exchange, Write: p.Write, Read: p.Read})
		}
	} else {
		d.DefinitionFormat, d.OriginalVHostName = "single_virtual_host", vhost
	}
	for _, cp := range b.Policies(policy.ComponentPolicy, vhost) {
		d.Policies = append(d.Policies, cp.Policy)
	}
	for _, cp := range b.Policies(policy.ComponentOperatorPolicy, vhost) {
		d.OperatorPolicies = append(d.OperatorPolicies, cp.Policy)
	}
	for _, v := range b.VHosts() {
		if !in(v.name) {
			continue
		}
		if l := b.VHostLimits(v.name); len(l) > 0 {
			d.VHostLimits = append(d.VHostLimits, definitions.VHostLimits{VHost: v.name, Limits: l})
		}
		durableX := map[string]bool{"": true}
		for _, x := range v.Exchanges() {
			if !x.Durable {
				continue
			}
			durableX[x.Name] = true
			if x.Name == "" || strings.HasPrefix(x.Name, "amq.") {
				continue
			}
			d.Exchanges = append(d.Exchanges, definitions.Exchange{Name: x.Name, VHost: v.name, Type: x.Kind.String(), Durable: true,
				AutoDelete: x.AutoDelete, Internal: x.Internal, Arguments: definitions.Arguments(x.Args)})
		}
		durableQ := map[string]bool{}
		for _, q := range v.Queues() {
			if !q.durable || q.owner != nil {
				continue
			}
			durableQ[q.name] = true
			args := definitions.Arguments(q.args)
			delete(args, "x-queue-type")
			d.Queues = append(d.Queues, definitions.Queue{Name: q.name, VHost: v.name, Type: q.kind, Durable: true,
				AutoDelete: q.autoDelete, Arguments: args})
		}
		for _, bd := range v.Bindings() {
			if bd.Source == "" || !durableX[bd.Source] {
				continue
			}
			dt := "queue"
			if bd.DestKind == exchange.ToExchange {
				dt = "exchange"
				if !durableX[bd.Dest] {
					continue
				}
			} else if !durableQ[bd.Dest] {
				continue
			}
			d.Bindings = append(d.Bindings, definitions.Binding{VHost: v.name, Source: bd.Source, Destination: bd.Dest,
				DestinationType: dt, RoutingKey: bd.Key, Arguments: definitions.Arguments(bd.Args)})
		}
	}
	return d
}
