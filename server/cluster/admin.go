package cluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"time"
)

// adminTimeout bounds an admin request served by this node.
const adminTimeout = 30 * time.Second

// AdminRequest is one request of the `warren cluster` commands. Op: "status", "add" (ID, Addr: add a node
// to the metadata group as a voter), "remove" (ID: remove it from the metadata group); and between
// members, "count-connections" (VHost: how many client connections this node has to it, for the
// cluster-wide vhost connection limit).
type AdminRequest struct {
	Op    string `json:"op"`
	ID    string `json:"id,omitempty"`
	Addr  string `json:"addr,omitempty"`
	VHost string `json:"vhost,omitempty"`
}

// AdminResponse answers an AdminRequest: Error is empty on success; Status is set for "status",
// Count for "count-connections".
type AdminResponse struct {
	Error  string  `json:"error,omitempty"`
	Status *Status `json:"status,omitempty"`
	Count  int     `json:"count,omitempty"`
}

// CountPeerConnections asks every other member that is up how many client connections it has to
// vhost (Config.CountConnections) and returns the sum; members that do not answer within ctx count
// as none.
func (n *Node) CountPeerConnections(ctx context.Context, vhost string) int {
	total := 0
	for _, m := range n.Members() {
		if m.ID == n.cfg.NodeID || !n.PeerUp(m.ID) || m.Addr == "" {
			continue
		}
		resp, err := Admin(ctx, m.Addr, AdminRequest{Op: "count-connections", VHost: vhost})
		if err != nil || resp.Error != "" {
			n.log.Debug("cannot count a peer's connections", "peer", m.ID, "err", err, "answer", resp.Error)
			continue
		}
		total += resp.Count
	}
	return total
}

// Status describes this node, the members and the groups running here.
type Status struct {
	Node    string        `json:"node"`
	Addr    string        `json:"addr"`
	Members []Member      `json:"members"`
	Groups  []GroupStatus `json:"groups"`
}

// GroupStatus describes one group running on the node.
type GroupStatus struct {
	ID        uint64   `json:"id"`
	Name      string   `json:"name"`
	Leader    string   `json:"leader"`
	Voters    []string `json:"voters"`
	Nonvoters []string `json:"nonvoters"`
	Applied   uint64   `json:"applied"`
}

// Status returns this node's view of the cluster.
func (n *Node) Status() Status {
	st := Status{Node: n.cfg.NodeID, Addr: n.addr, Members: n.Members()}
	n.mu.Lock()
	groups := make([]*Group, 0, len(n.groups))
	for _, g := range n.groups {
		groups = append(groups, g)
	}
	n.mu.Unlock()
	slices.SortFunc(groups, func(a, b *Group) int {
		switch {
		case a.id < b.id:
			return -1
		case a.id > b.id:
			return 1
		}
		return 0
	})
	st.Groups = make([]GroupStatus, 0, len(groups))
	for _, g := range groups {
		st.Groups = append(st.Groups, GroupStatus{
			ID:        g.id,
			Name:      g.name,
			Leader:    g.Leader(),
			Voters:    g.Voters(),
			Nonvoters: g.Nonvoters(),
			Applied:   g.AppliedIndex(),
		})
	}
	return st
}

// Admin sends one admin request to the node at addr (its cluster port) and returns its answer.
func Admin(ctx context.Context, addr string, req AdminRequest) (AdminResponse, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return AdminResponse{}, fmt.Errorf("cluster admin %s: %w", addr, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	hdr := make([]byte, headerLen)
	hdr[0] = tagAdmin
	if _, err := c.Write(hdr); err != nil {
		return AdminResponse{}, fmt.Errorf("cluster admin %s: %w", addr, err)
	}
	if err := writeJSON(c, req); err != nil {
		return AdminResponse{}, fmt.Errorf("cluster admin %s: send %s: %w", addr, req.Op, err)
	}
	var resp AdminResponse
	if err := readJSON(bufio.NewReader(c), &resp); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return AdminResponse{}, fmt.Errorf("cluster admin %s: read answer to %s: %w", addr, req.Op, err)
	}
	return resp, nil
}

// serveAdmin answers one admin request.
func (n *Node) serveAdmin(c net.Conn, br *bufio.Reader) {
	_ = c.SetReadDeadline(time.Now().Add(headerReadTimeout))
	var req AdminRequest
	if err := readJSON(br, &req); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithTimeout(n.ctx, adminTimeout)
	defer cancel()
	resp := n.admin(ctx, req)
	_ = c.SetWriteDeadline(time.Now().Add(headerReadTimeout))
	_ = writeJSON(c, resp)
}

func (n *Node) admin(ctx context.Context, req AdminRequest) AdminResponse {
	switch req.Op {
	case "count-connections":
		if n.cfg.CountConnections == nil {
			return AdminResponse{}
		}
		return AdminResponse{Count: n.cfg.CountConnections(req.VHost)}
	case "status":
		st := n.Status()
		return AdminResponse{Status: &st}
	case "add", "remove":
		if req.ID == "" {
			return AdminResponse{Error: fmt.Sprintf("%s: a node id is required", req.Op)}
		}
		g := n.Group(0)
		if g == nil {
			return AdminResponse{Error: fmt.Sprintf("node %s does not run the metadata group", n.cfg.NodeID)}
		}
		var err error
		if req.Op == "add" {
			if req.Addr == "" {
				return AdminResponse{Error: "add: a cluster address is required"}
			}
			err = g.AddVoter(ctx, req.ID, req.Addr)
		} else {
			err = g.RemoveServer(ctx, req.ID)
		}
		if err != nil {
			return AdminResponse{Error: err.Error()}
		}
		return AdminResponse{}
	}
	return AdminResponse{Error: fmt.Sprintf("unknown admin operation %q", req.Op)}
}
