// Command specgen generates Warren's AMQP 0-9-1 method codec (amqp/zz_spec091.go)
// from the protocol's XML specification plus Warren's extension file.
//
// Usage:
//
//	go run ./internal/specgen -o zz_spec091.go spec/amqp0-9-1.stripped.extended.xml spec/warren-extensions.xml
//
// With -o - the generated source is written to standard output. Later files
// are merged into earlier ones: constants and domains are added, classes with
// the same name gain the extra methods.
package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"go/format"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// spec mirrors the subset of the AMQP XML specification that the codec needs.
type spec struct {
	Constants []constant `xml:"constant"`
	Domains   []domain   `xml:"domain"`
	Classes   []class    `xml:"class"`
}

type constant struct {
	Name  string `xml:"name,attr"`
	Value int    `xml:"value,attr"`
	Class string `xml:"class,attr"`
}

type domain struct {
	Name string `xml:"name,attr"`
	Type string `xml:"type,attr"`
}

type class struct {
	Name    string   `xml:"name,attr"`
	Index   int      `xml:"index,attr"`
	Methods []method `xml:"method"`
}

type method struct {
	Name        string  `xml:"name,attr"`
	Index       int     `xml:"index,attr"`
	Synchronous int     `xml:"synchronous,attr"`
	Content     int     `xml:"content,attr"`
	Fields      []field `xml:"field"`
}

type field struct {
	Name     string `xml:"name,attr"`
	Domain   string `xml:"domain,attr"`
	Type     string `xml:"type,attr"`
	Reserved int    `xml:"reserved,attr"`
}

func main() {
	out := flag.String("o", "zz_spec091.go", "output file, or - for standard output")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "specgen: no specification files given")
		os.Exit(2)
	}
	src, err := generateFiles(flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "specgen:", err)
		os.Exit(1)
	}
	if *out == "-" {
		_, err = os.Stdout.Write(src)
	} else {
		err = os.WriteFile(*out, src, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "specgen:", err)
		os.Exit(1)
	}
}

// generateFiles reads and merges the given specification files and returns
// the formatted Go source.
func generateFiles(paths []string) ([]byte, error) {
	var merged spec
	var names []string
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("opening spec: %w", err)
		}
		s, err := parse(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", p, err)
		}
		if err := merge(&merged, s); err != nil {
			return nil, fmt.Errorf("merging %s: %w", p, err)
		}
		names = append(names, filepath.Base(p))
	}
	return generate(&merged, names)
}

func parse(r io.Reader) (*spec, error) {
	var s spec
	dec := xml.NewDecoder(r)
	if err := dec.Decode(&s); err != nil {
		return nil, err
	}
	return &s, nil
}

func merge(dst, src *spec) error {
	for _, c := range src.Constants {
		for _, e := range dst.Constants {
			if e.Name == c.Name {
				return fmt.Errorf("duplicate constant %q", c.Name)
			}
		}
		dst.Constants = append(dst.Constants, c)
	}
	dst.Domains = append(dst.Domains, src.Domains...)
	for _, c := range src.Classes {
		found := false
		for i := range dst.Classes {
			d := &dst.Classes[i]
			if d.Name != c.Name {
				continue
			}
			if d.Index != c.Index {
				return fmt.Errorf("class %q: index %d differs from %d", c.Name, c.Index, d.Index)
			}
			for _, m := range c.Methods {
				for _, e := range d.Methods {
					if e.Name == m.Name || e.Index == m.Index {
						return fmt.Errorf("method %s.%s (%d) clashes with %s.%s (%d)",
							c.Name, m.Name, m.Index, d.Name, e.Name, e.Index)
					}
				}
				d.Methods = append(d.Methods, m)
			}
			found = true
		}
		if !found {
			dst.Classes = append(dst.Classes, c)
		}
	}
	return nil
}

// camel turns an XML name into a Go identifier: split on '-', title-case
// each part, "id" becomes "ID". The confirm class spells its no-wait field
// "nowait"; it is given the same Go name as everywhere else.
func camel(name string) string {
	if name == "nowait" {
		return "NoWait"
	}
	var b strings.Builder
	for _, part := range strings.Split(name, "-") {
		if part == "" {
			continue
		}
		if part == "id" {
			b.WriteString("ID")
			continue
		}
		b.WriteString(strings.ToUpper(part[:1]))
		b.WriteString(part[1:])
	}
	return b.String()
}

// methodNames are the names of the Method interface; a struct field cannot
// share them.
var methodNames = map[string]bool{
	"ClassID": true, "MethodID": true, "Name": true, "HasContent": true,
	"Synchronous": true, "Decode": true, "AppendArgs": true,
}

// clashRenames gives the fields whose CamelCase name is a Method method
// their Go name. connection.close and channel.close carry the class and
// method that caused the close.
var clashRenames = map[string]string{
	"class-id":  "FailingClassID",
	"method-id": "FailingMethodID",
}

// fieldName returns the Go name of a method field.
func fieldName(xmlName string) (string, error) {
	n := camel(xmlName)
	if !methodNames[n] {
		return n, nil
	}
	if r, ok := clashRenames[xmlName]; ok {
		return r, nil
	}
	return "", fmt.Errorf("field %q clashes with the Method interface", xmlName)
}

// upperSnake turns an XML name into RabbitMQ's reply name: NOT_FOUND.
func upperSnake(name string) string {
	return strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

var goTypes = map[string]string{
	"bit":       "bool",
	"octet":     "uint8",
	"short":     "uint16",
	"long":      "uint32",
	"longlong":  "uint64",
	"shortstr":  "string",
	"longstr":   "string",
	"timestamp": "time.Time",
	"table":     "Table",
}

func resolveType(domains map[string]string, f field) (string, error) {
	t := f.Type
	if t == "" {
		t = f.Domain
	}
	for i := 0; i < 16; i++ {
		if _, ok := goTypes[t]; ok {
			return t, nil
		}
		next, ok := domains[t]
		if !ok || next == t {
			return "", fmt.Errorf("field %q: unknown domain %q", f.Name, t)
		}
		t = next
	}
	return "", fmt.Errorf("field %q: domain chain too deep", f.Name)
}

type genField struct {
	GoName  string
	XMLName string
	Kind    string // AMQP primitive type
}

type genMethod struct {
	GoName      string
	FullName    string
	ClassID     int
	MethodID    int
	Synchronous bool
	Content     bool
	Fields      []genField
}

func isReplyCode(c constant) bool {
	return c.Class != "" || c.Name == "reply-success"
}

func generate(s *spec, sources []string) ([]byte, error) {
	domains := map[string]string{}
	for _, d := range s.Domains {
		domains[d.Name] = d.Type
	}
	classes := append([]class(nil), s.Classes...)
	sort.SliceStable(classes, func(i, j int) bool { return classes[i].Index < classes[j].Index })

	var methods []genMethod
	usesTime := false
	for _, c := range classes {
		ms := append([]method(nil), c.Methods...)
		sort.SliceStable(ms, func(i, j int) bool { return ms[i].Index < ms[j].Index })
		for _, m := range ms {
			gm := genMethod{
				GoName:      camel(c.Name) + camel(m.Name),
				FullName:    c.Name + "." + m.Name,
				ClassID:     c.Index,
				MethodID:    m.Index,
				Synchronous: m.Synchronous == 1,
				Content:     m.Content == 1,
			}
			for _, f := range m.Fields {
				kind, err := resolveType(domains, f)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", gm.FullName, err)
				}
				if kind == "timestamp" {
					usesTime = true
				}
				goName, err := fieldName(f.Name)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", gm.FullName, err)
				}
				gm.Fields = append(gm.Fields, genField{GoName: goName, XMLName: f.Name, Kind: kind})
			}
			methods = append(methods, gm)
		}
	}

	var w bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }

	p("// Code generated by specgen; DO NOT EDIT.\n")
	p("// Sources: %s.\n\n", strings.Join(sources, ", "))
	p("package amqp\n\n")
	if usesTime {
		p("import \"time\"\n\n")
	}

	// Frame and size constants.
	p("// Frame types and sizes from the AMQP 0-9-1 specification.\nconst (\n")
	for _, c := range s.Constants {
		if isReplyCode(c) {
			continue
		}
		p("\t// %s is the spec constant %q.\n\t%s = %d\n", camel(c.Name), c.Name, camel(c.Name), c.Value)
	}
	p(")\n\n")

	replies := []constant{}
	for _, c := range s.Constants {
		if isReplyCode(c) {
			replies = append(replies, c)
		}
	}
	sort.SliceStable(replies, func(i, j int) bool { return replies[i].Value < replies[j].Value })
	p("// Reply codes used in connection.close, channel.close and basic.return.\nconst (\n")
	for _, c := range replies {
		kind := "reply"
		if c.Class != "" {
			kind = c.Class
		}
		p("\t// %s is %s (%s).\n\t%s uint16 = %d\n", camel(c.Name), upperSnake(c.Name), kind, camel(c.Name), c.Value)
	}
	p(")\n\n")

	p("// IsHardError reports whether code is a connection-level (hard) error.\n")
	p("func IsHardError(code uint16) bool {\n\tswitch code {\n\tcase ")
	first := true
	for _, c := range replies {
		if c.Class == "hard-error" {
			if !first {
				p(", ")
			}
			p("%d", c.Value)
			first = false
		}
	}
	p(":\n\t\treturn true\n\t}\n\treturn false\n}\n\n")

	p("// ReplyName returns RabbitMQ's upper-case name for a reply code, e.g.\n")
	p("// 406 -> \"PRECONDITION_FAILED\", or \"\" if the code is unknown.\n")
	p("func ReplyName(code uint16) string {\n\tswitch code {\n")
	for _, c := range replies {
		p("\tcase %d:\n\t\treturn %q\n", c.Value, upperSnake(c.Name))
	}
	p("\t}\n\treturn \"\"\n}\n\n")

	p("// Class ids.\nconst (\n")
	for _, c := range classes {
		p("\t// Class%s is the %s class.\n\tClass%s uint16 = %d\n", camel(c.Name), c.Name, camel(c.Name), c.Index)
	}
	p(")\n\n")

	for _, m := range methods {
		if err := genMethodCode(&w, m); err != nil {
			return nil, err
		}
	}

	p("// NewMethod returns a new zero value of the method with the given ids, or\n")
	p("// nil if the pair is unknown.\n")
	p("func NewMethod(classID, methodID uint16) Method {\n")
	p("\tswitch uint32(classID)<<16 | uint32(methodID) {\n")
	for _, m := range methods {
		p("\tcase %d<<16 | %d:\n\t\treturn new(%s)\n", m.ClassID, m.MethodID, m.GoName)
	}
	p("\t}\n\treturn nil\n}\n\n")

	p("// methodName returns \"class.method\" for known ids, else \"\".\n")
	p("func methodName(classID, methodID uint16) string {\n")
	p("\tswitch uint32(classID)<<16 | uint32(methodID) {\n")
	for _, m := range methods {
		p("\tcase %d<<16 | %d:\n\t\treturn %q\n", m.ClassID, m.MethodID, m.FullName)
	}
	p("\t}\n\treturn \"\"\n}\n")

	out, err := format.Source(w.Bytes())
	if err != nil {
		return nil, errors.Join(fmt.Errorf("formatting generated code: %w", err), errors.New(w.String()))
	}
	return out, nil
}

func genMethodCode(w *bytes.Buffer, m genMethod) error {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("// %s is the method %s (class %d, method %d).\n", m.GoName, m.FullName, m.ClassID, m.MethodID)
	if len(m.Fields) == 0 {
		p("type %s struct{}\n\n", m.GoName)
	} else {
		p("type %s struct {\n", m.GoName)
		for _, f := range m.Fields {
			p("\t%s %s // %s (%s)\n", f.GoName, goTypes[f.Kind], f.XMLName, f.Kind)
		}
		p("}\n\n")
	}
	p("// ClassID returns %d.\nfunc (*%s) ClassID() uint16 { return %d }\n\n", m.ClassID, m.GoName, m.ClassID)
	p("// MethodID returns %d.\nfunc (*%s) MethodID() uint16 { return %d }\n\n", m.MethodID, m.GoName, m.MethodID)
	p("// Name returns %q.\nfunc (*%s) Name() string { return %q }\n\n", m.FullName, m.GoName, m.FullName)
	p("// HasContent reports whether the method is followed by content frames.\n")
	p("func (*%s) HasContent() bool { return %t }\n\n", m.GoName, m.Content)
	p("// Synchronous reports whether the method expects a reply.\n")
	p("func (*%s) Synchronous() bool { return %t }\n\n", m.GoName, m.Synchronous)

	recv := "m"
	if len(m.Fields) == 0 {
		recv = ""
	}
	// Decode.
	p("// Decode sets m from the method arguments (the bytes after the class and\n// method ids). Arguments that do not fill them exactly (a field past the\n// end, bytes left over) are a *FramingError, as RabbitMQ refuses them.\n")
	if len(m.Fields) == 0 {
		p("func (*%s) Decode(args []byte) error {\n\td := decoder{b: args}\n\treturn d.finish(%d, %d, %q)\n}\n\n", m.GoName, m.ClassID, m.MethodID, m.FullName)
	} else {
		p("func (%s *%s) Decode(args []byte) error {\n\td := decoder{b: args}\n", recv, m.GoName)
		for i := 0; i < len(m.Fields); {
			f := m.Fields[i]
			if f.Kind == "bit" {
				j := i
				for j < len(m.Fields) && m.Fields[j].Kind == "bit" && j-i < 8 {
					j++
				}
				p("\tbits%d := d.octet()\n", i)
				for k := i; k < j; k++ {
					p("\tm.%s = bits%d&(1<<%d) != 0\n", m.Fields[k].GoName, i, k-i)
				}
				i = j
				continue
			}
			p("\tm.%s = d.%s()\n", f.GoName, f.Kind)
			i++
		}
		p("\treturn d.finish(%d, %d, %q)\n}\n\n", m.ClassID, m.MethodID, m.FullName)
	}

	// AppendArgs.
	p("// AppendArgs appends the encoded method arguments to b.\n")
	if len(m.Fields) == 0 {
		p("func (*%s) AppendArgs(b []byte) []byte { return b }\n\n", m.GoName)
		return nil
	}
	p("func (m *%s) AppendArgs(b []byte) []byte {\n", m.GoName)
	for i := 0; i < len(m.Fields); {
		f := m.Fields[i]
		if f.Kind == "bit" {
			j := i
			for j < len(m.Fields) && m.Fields[j].Kind == "bit" && j-i < 8 {
				j++
			}
			p("\tvar bits%d uint8\n", i)
			for k := i; k < j; k++ {
				p("\tif m.%s {\n\t\tbits%d |= 1 << %d\n\t}\n", m.Fields[k].GoName, i, k-i)
			}
			p("\tb = append(b, bits%d)\n", i)
			i = j
			continue
		}
		switch f.Kind {
		case "octet":
			p("\tb = append(b, m.%s)\n", f.GoName)
		default:
			p("\tb = append%s(b, m.%s)\n", camel(f.Kind), f.GoName)
		}
		i++
	}
	p("\treturn b\n}\n\n")
	return nil
}
