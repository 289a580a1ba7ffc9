package exchange

import (
	"slices"
	"strings"
)

// topicNode is a node of a topic exchange's binding-key trie. A binding key
// is split into words on '.' ("" has zero words, "a." is ["a", ""]); each
// word moves one level down, through children for literal words and through
// star or hash for the wildcards. The bindings whose key ends at a node are
// in ds.
//
// Runs of consecutive "#" words are stored as one path step: "#.#" matches
// exactly what "#" matches. The binding keeps its key as given.
type topicNode struct {
	parent   *topicNode
	word     string // the word leading here from parent
	children map[string]*topicNode
	star     *topicNode
	hash     *topicNode
	ds       destSet
}

func newTopicTrie() *topicNode { return &topicNode{} }

// topicPath calls f for each word of the trie path of binding key key.
func topicPath(key string, f func(word string)) {
	if key == "" {
		return
	}
	prevHash := false
	for {
		i := strings.IndexByte(key, '.')
		w := key
		if i >= 0 {
			w = key[:i]
		}
		if w != "#" || !prevHash {
			f(w)
		}
		prevHash = w == "#"
		if i < 0 {
			return
		}
		key = key[i+1:]
	}
}

func (n *topicNode) child(w string) *topicNode {
	switch w {
	case "*":
		return n.star
	case "#":
		return n.hash
	}
	return n.children[w]
}

func (n *topicNode) insert(b *binding) {
	topicPath(b.key, func(w string) {
		c := n.child(w)
		if c == nil {
			c = &topicNode{parent: n, word: w}
			switch w {
			case "*":
				n.star = c
			case "#":
				n.hash = c
			default:
				if n.children == nil {
					n.children = make(map[string]*topicNode)
				}
				n.children[w] = c
			}
		}
		n = c
	})
	n.ds.add(b)
}

func (n *topicNode) remove(b *binding) {
	topicPath(b.key, func(w string) {
		if n != nil {
			n = n.child(w)
		}
	})
	if n == nil {
		return
	}
	n.ds.remove(b)
	// Prune nodes left without bindings or children, up to the root.
	for n.parent != nil && n.ds.empty() && n.star == nil && n.hash == nil && len(n.children) == 0 {
		p := n.parent
		switch n.word {
		case "*":
			p.star = nil
		case "#":
			p.hash = nil
		default:
			delete(p.children, n.word)
		}
		n = p
	}
}

// isHash reports whether n is reached through a "#" word.
func (n *topicNode) isHash() bool { return n.parent != nil && n.parent.hash == n }

// nodeSetScanMax bounds the linear duplicate check of active node sets.
const nodeSetScanMax = 64

// nodeSet is a set of trie nodes kept in a slice; past nodeSetScanMax
// entries it also uses a map. It is passed by value so that its slice can
// live in an array on the caller's stack.
type nodeSet struct {
	nodes []*topicNode
	index map[*topicNode]struct{}
}

func (s nodeSet) add(n *topicNode) nodeSet {
	if s.index != nil {
		if _, ok := s.index[n]; ok {
			return s
		}
		s.index[n] = struct{}{}
	} else {
		if slices.Contains(s.nodes, n) {
			return s
		}
		if len(s.nodes) >= nodeSetScanMax {
			s.index = make(map[*topicNode]struct{}, 2*nodeSetScanMax)
			for _, m := range s.nodes {
				s.index[m] = struct{}{}
			}
			s.index[n] = struct{}{}
		}
	}
	s.nodes = append(s.nodes, n)
	return s
}

// closeOverHash adds the "#" children of the set's nodes ("#" matches zero
// words).
func (s nodeSet) closeOverHash() nodeSet {
	for i := 0; i < len(s.nodes); i++ {
		if h := s.nodes[i].hash; h != nil {
			s = s.add(h)
		}
	}
	return s
}

// routeKey adds to dst and a the destinations of every binding key matching the
// routing key. It walks the trie as an automaton over the words of the key,
// keeping the set of nodes reached so far: each node is visited at most
// once per word, so keys with many "#" words cannot make matching
// exponential.
func (n *topicNode) routeKey(dst []string, a acc, key string) ([]string, acc) {
	var bufA, bufB [16]*topicNode
	cur := nodeSet{nodes: append(bufA[:0], n)}.closeOverHash()
	next := nodeSet{nodes: bufB[:0]}
	rest, more := key, key != ""
	for more {
		word := rest
		if i := strings.IndexByte(rest, '.'); i >= 0 {
			word, rest = rest[:i], rest[i+1:]
		} else {
			more = false
		}
		next = nodeSet{nodes: next.nodes[:0]}
		for _, m := range cur.nodes {
			if m.isHash() {
				next = next.add(m) // "#" swallows this word too
			}
			if c := m.children[word]; c != nil {
				next = next.add(c)
			}
			if m.star != nil {
				next = next.add(m.star)
			}
		}
		if len(next.nodes) == 0 {
			return dst, a
		}
		cur, next = next.closeOverHash(), cur
	}
	for _, m := range cur.nodes {
		dst, a = a.addSet(dst, &m.ds)
	}
	return dst, a
}
