# Warren: build, run and test targets. `make help` lists them.

GO       ?= go
BIN      := bin/warren
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
FUZZTIME ?= 60s
FUZZ_TARGETS := FuzzReadFrame FuzzDecodeMethod FuzzDecodeTable FuzzDecodeProperties
# Packages tested by `make unit`: everything except the black-box conformance tests, which
# `make conformance` runs against the built binary.
UNIT_PKGS = $(shell $(GO) list ./... | grep -v '/conformance$$')

.PHONY: help build run test fmt-check vet unit conformance fuzz gen clean

help:
	@echo "make build        build $(BIN)"
	@echo "make run          build, then run the broker on 127.0.0.1:5672 with data in ./warren-data"
	@echo "make test         gofmt check, go vet, unit tests with -race, then make conformance"
	@echo "make conformance  black-box tests against $(BIN), then amqp091-go's integration suite"
	@echo "make fuzz         run each amqp fuzz target for FUZZTIME (default 60s)"
	@echo "make gen          regenerate amqp/zz_spec091.go from the XML spec"
	@echo "make clean        remove bin/"

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/warren

run: build
	./$(BIN) serve --data-dir ./warren-data

test: fmt-check vet unit
	$(MAKE) conformance

fmt-check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# Includes amqp's TestGeneratedCodeIsFresh, which fails when zz_spec091.go is stale.
unit:
	$(GO) test -race -count=1 $(UNIT_PKGS)

# The Go tests' full -v output goes to bin/conformance.log; the summary (and the measured RSS
# per idle connection) is printed, the log without its === lines on failure. The amqp091-go suite runs
# even when the Go tests failed, so one run shows both results.
conformance: build
	@echo "== conformance tests against $(BIN) (full log: bin/conformance.log)"
	@status=0; \
	WARREN_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 10m -v ./conformance/ >bin/conformance.log 2>&1 || status=$$?; \
	if [ $$status -ne 0 ]; then grep -vE '^=== (RUN|PAUSE|CONT|NAME)' bin/conformance.log; \
	else grep -E '^(--- |ok |FAIL)|KB per connection' bin/conformance.log; fi; \
	echo "== amqp091-go integration suite against $(BIN)"; \
	WARREN_BIN=$(CURDIR)/$(BIN) ./conformance/amqp091-integration.sh || status=1; \
	exit $$status

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "== $$t for $(FUZZTIME)"; \
		$(GO) test ./amqp/ -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) || exit 1; \
	done

gen:
	$(GO) generate ./amqp/

clean:
	rm -rf bin
