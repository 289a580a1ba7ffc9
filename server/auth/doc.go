// Package auth holds Warren's access-control rules, written to match RabbitMQ's so that users,
// passwords and permissions exported from RabbitMQ behave the same here:
//
//   - password hashes in RabbitMQ's formats (rabbit_password_hashing_sha256, _sha512, _md5),
//     parsed from a definitions file, made and verified (password.go);
//   - login refusals and the loopback-users rule (login.go), and the EXTERNAL mechanism's login
//     name from a verified client certificate (external.go);
//   - user tags and what each lets a user do in the management API (tags.go);
//   - configure/write/read permissions and topic permissions, compiled once (permissions.go),
//     and the check each AMQP method needs, with RabbitMQ's reply codes and texts (channel.go).
//
// The package stores nothing and imports no broker package: the core keeps the user, permission
// and topic-permission records (holding the compiled values made here) and the session calls the
// checks. Everything here is pure or owned by one connection or channel, so there is no locking.
package auth
