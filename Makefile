# Warren: build, run and test targets. `make help` lists them.

GO       ?= go
BIN      := bin/warren
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
FUZZTIME ?= 60s
FUZZ_TARGETS := FuzzReadFrame FuzzDecodeMethod FuzzDecodeTable FuzzDecodeProperties
# package:target pairs outside ./amqp/ (the stream protocol codec, osiris chunks, AMQP 1.0 messages)
FUZZ_PKG_TARGETS := ./server/streamproto/wire:FuzzDecode ./server/streamproto/wire:FuzzReader \
	./stream/osiris:FuzzParse ./amqp/amqp10:FuzzDecode
# Packages tested by `make unit`: everything except the black-box conformance tests, which
# `make conformance` runs against the built binary.
UNIT_PKGS = $(shell $(GO) list ./... | grep -v '/conformance$$')

.PHONY: help build run test fmt-check vet unit conformance fuzz gen bench bench-stream clean

help:
	@echo "make build        build $(BIN)"
	@echo "make run          build, then run the broker on 127.0.0.1:5672 with data in ./warren-data"
	@echo "make test         gofmt check, go vet, unit tests with -race, then make conformance"
	@echo "make conformance  black-box tests against $(BIN): ours, amqp091-go's, the client suites, Celery"
	@echo "                 REF=amqp://guest:guest@127.0.0.1:5682/ also runs them against RabbitMQ and diffs"
	@echo "make fuzz         run each fuzz target (amqp, stream protocol, osiris, amqp10) for FUZZTIME (default 60s)"
	@echo "make gen          regenerate amqp/zz_spec091.go from the XML spec"
	@echo "make bench        S1-S14 against bin/warren and the reference RabbitMQ; writes docs/benchmarks.md"
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
# per idle connection) is printed, the log without its === lines on failure. The amqp091-go suite
# and the client suites (pika, kombu, amqplib, bunny, php-amqplib, Celery: conformance/clients/)
# run even when an earlier suite failed, so one run shows every result. With REF set to a
# reference broker's URL, the same suites then run against it and conformance/clients/
# differential.sh prints, test by test, where the two differ.
REF ?=
conformance: build
	@echo "== conformance tests against $(BIN) (full log: bin/conformance.log)"
	@status=0; \
	WARREN_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 10m -v ./conformance/ >bin/conformance.log 2>&1 || status=$$?; \
	gostatus=$$status; \
	if [ $$status -ne 0 ]; then grep -vE '^=== (RUN|PAUSE|CONT|NAME)' bin/conformance.log; \
	else grep -E '^(--- |ok |FAIL)|KB per connection' bin/conformance.log; fi; \
	echo "== amqp091-go integration suite against $(BIN)"; \
	WARREN_BIN=$(CURDIR)/$(BIN) ./conformance/amqp091-integration.sh || status=1; \
	echo "== client suites against $(BIN) (logs: bin/clients/)"; \
	WARREN_BIN=$(CURDIR)/$(BIN) RESULTS_DIR=$(CURDIR)/bin/clients ./conformance/clients/run.sh || status=1; \
	if [ -n "$(REF)" ]; then \
		WARREN_BIN=$(CURDIR)/$(BIN) ./conformance/clients/differential.sh "$(REF)" || status=1; \
	fi; \
	echo "== rabbitmq-stream-go-client's suite against $(BIN) (private network namespace; log: bin/stream-go-suite.log)"; \
	SUITE_LOG=$(CURDIR)/bin/stream-go-suite.log unshare --net ./conformance/clients/stream-go-suite.sh $(CURDIR)/$(BIN) || status=1; \
	if [ $$gostatus -ne 0 ]; then echo "== the failed conformance tests' own lines (from bin/conformance.log; node logs left out)"; \
		./conformance/failed-lines.sh bin/conformance.log; fi; \
	exit $$status

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "== $$t for $(FUZZTIME)"; \
		$(GO) test ./amqp/ -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) || exit 1; \
	done
	@for pt in $(FUZZ_PKG_TARGETS); do \
		p=$${pt%%:*}; t=$${pt#*:}; \
		echo "== $$p $$t for $(FUZZTIME)"; \
		$(GO) test $$p -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) || exit 1; \
	done

gen:
	$(GO) generate ./amqp/

# S1-S14 against bin/warren (the bench starts it on a free port, fresh data dir per run) and, when
# reachable, the reference RabbitMQ (../shared/tools/rabbitmq.sh start); writes docs/benchmarks.md.
# S10 (object counts: 10,000 durable queues declared and bound, restart, memory, and a
# 100,000-queue run of Warren alone) prints issue 12's targets with PASS/FAIL; only S10, e.g.:
#   make bench BENCH_FLAGS='--scenarios S10'   (--declare-queues, --declare-large-queues, --declare-timeout)
BENCH_REF   ?= amqp://guest:guest@127.0.0.1:5682/
BENCH_FLAGS ?=
bench: build
	./$(BIN) perf bench --ref-uri $(BENCH_REF) --out docs/benchmarks.md $(BENCH_FLAGS)
	$(MAKE) bench-stream

# The stream protocol (issue 17): `warren perf stream` publishes with confirms and consumes, 12 B
# and 1 KB, Warren (bin/warren started per run) and the reference RabbitMQ's stream port in the
# same run, median of 3; it replaces its own section of docs/benchmarks.md, as perf bench does
# its own: the sections written by hand stay.
BENCH_STREAM_REF   ?= rabbitmq-stream://guest:guest@127.0.0.1:5562/%2f
BENCH_STREAM_FLAGS ?=
bench-stream: build
	./$(BIN) perf stream --ref-uri '$(BENCH_STREAM_REF)' --out docs/benchmarks.md $(BENCH_STREAM_FLAGS)

clean:
	rm -rf bin
