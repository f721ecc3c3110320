# Every target loops over the modules of go.work.
MODULES := $(shell go work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')
GO ?= go
FUZZTIME ?= 30s
STATICCHECK ?= $(shell command -v staticcheck || echo $(HOME)/go/bin/staticcheck)
PROMTOOL ?= promtool

DEMO_ARGS ?=

.PHONY: installcheck screenshots failover help demo demo-reset test test-modules race bench bench-modules bench-peers bench-consumers bench-engine bench-engine-before bench-plots fuzz lint tools modcheck tidy ops-check

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

demo: ## idem-gateway on the embedded file store in front of the example orders service (:8080 → :9000)
	@scripts/demo $(DEMO_ARGS)

demo-reset: ## forget every key the demo stored (removes .cache/demo)
	rm -rf .cache/demo

test: ## run every module's tests with the race detector (the CI command); starts DynamoDB Local, stepfunctions-local, s3rver, a Redis Cluster, a Redis primary + replica + Sentinel and a PostgreSQL primary + standby
	@$(SERVICES) $(MAKE) --no-print-directory test-modules

# The servers the project's scripts start for the tests, each wrapping the
# next command with its address in the environment.
SERVICES := scripts/dynamodb-local run scripts/stepfunctions-local run scripts/s3rver run scripts/redis-cluster run scripts/redis-replicas run scripts/pg-standby run

test-modules: ## run the tests against services already running (IDEM_DYNAMODB_ENDPOINT, IDEM_SFN_ENDPOINT, IDEM_S3_ENDPOINT, IDEM_REDIS_CLUSTER_ADDRS, IDEM_REDIS_SENTINEL_ADDR, IDEM_PG_PRIMARY_ADDR …)
	@set -e; for m in $(MODULES); do echo "== $$m"; (cd $$m && $(GO) test -race -count=1 ./...); done

race: test ## alias of test: tests always run with -race

# Measurements on a shared machine take this lock (flock(1), where there is
# one), so that they never overlap; bench/peers takes it itself.
BENCH_LOCK ?= /tmp/idem-bench.lock
LOCKED := $(shell command -v flock >/dev/null && echo flock $(BENCH_LOCK))
# The commit before issue 17's engine work: engine.png's "before".
ENGINE_BEFORE ?= f03a8e3
PEERS_ARGS ?=

bench: ## every benchmark and figure of docs/benchmarks.md: the modules' benchmarks, the side-by-side with Powertools, the engine before/after, the plots (docs/img); starts DynamoDB Local, stepfunctions-local and s3rver
	@scripts/dynamodb-local run scripts/stepfunctions-local run scripts/s3rver run $(MAKE) --no-print-directory bench-modules bench-peers
	@$(MAKE) --no-print-directory bench-engine-before bench-engine bench-plots

bench-modules: ## the benchmarks of every module (-benchmem), against services already running
	@set -e; for m in $(MODULES); do echo "== $$m"; (cd $$m && $(LOCKED) $(GO) test -run '^$$' -bench . -benchmem ./...); done

bench-peers: ## idem and AWS Powertools (TypeScript) side by side (bench/peers; needs node, npm, java, redis-server) → bench/results/peers.{json,csv}; PEERS_ARGS=-quick for a short run
	@scripts/dynamodb-local run sh -c 'cd bench && $(GO) run ./peers $(PEERS_ARGS)'

CONSUMERS_N ?= 5000x
CONSUMERS_COUNT ?= 3
# idemkafka over DynamoDB Local and PostgreSQL: a few hundred records/s, so
# fewer records than the other rows.
CONSUMERS_STORES_N ?= 1000x
CONSUMERS_REDIS_PORT ?= 6398
CONSUMERS_STREAMS_PORT ?= 6399

bench-consumers: ## consumers (idemnats, idemamqp, idemkafka, idemwatermill) in msgs/s and CPU per message of the client, Redis (a redis-server of its own, INFO cpu; another is the Redis Streams broker) and the broker (/proc/PID/stat), bare, single and batch paths, the dedup a team writes by hand (ConsumeHandDedup) and a pipelined SET NX + SET, in one run; idemkafka over DynamoDB Local (scripts/dynamodb-local run, for that step only) and PostgreSQL (127.0.0.1:5432) with CONSUMERS_STORES_N records; then again pinned (scripts/bench-consumers-pinned: Redis and a nats-server of its own on CPU 0, the client on CPU 1; RabbitMQ only with CONSUMERS_PIN_RABBITMQ=1) → bench/results/consumers{,-pinned}.txt, consumers.md, docs/benchmarks.md and docs/img/consumers.png; needs NATS on :4222 and RabbitMQ on :5672
	@mkdir -p bench/results .cache/bench-consumers
	@set -e; d=$(CURDIR)/.cache/bench-consumers; \
		redis-server --port $(CONSUMERS_REDIS_PORT) --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --dir $$d --pidfile $$d/redis.pid --logfile $$d/redis.log; \
		redis-server --port $(CONSUMERS_STREAMS_PORT) --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --dir $$d --pidfile $$d/streams.pid --logfile $$d/streams.log; \
		trap 'kill $$(cat $$d/redis.pid) $$(cat $$d/streams.pid)' EXIT; \
		until redis-cli -p $(CONSUMERS_REDIS_PORT) ping >/dev/null 2>&1 && redis-cli -p $(CONSUMERS_STREAMS_PORT) ping >/dev/null 2>&1; do sleep 0.1; done; \
		export IDEM_REDIS_ADDR=127.0.0.1:$(CONSUMERS_REDIS_PORT) IDEM_REDISSTREAM_ADDR=127.0.0.1:$(CONSUMERS_STREAMS_PORT); \
		{ uptime; \
		  (cd idemnats && $(LOCKED) $(GO) test -run '^$$' -bench 'RedisBaseline|Consume' -benchtime $(CONSUMERS_N) -count $(CONSUMERS_COUNT) .); \
		  (cd idemamqp && $(LOCKED) $(GO) test -run '^$$' -bench 'Consume' -benchtime $(CONSUMERS_N) -count $(CONSUMERS_COUNT) .); \
		  (cd idemkafka && $(LOCKED) $(GO) test -run '^$$' -bench 'Consume/^(bare|idemkafka|idemkafka\+redis|redis)$$' -benchtime $(CONSUMERS_N) -count $(CONSUMERS_COUNT) .); \
		  (cd idemkafka && $(CURDIR)/scripts/dynamodb-local run $(LOCKED) $(GO) test -run '^$$' -bench 'Consume/^idemkafka\+(dynamodb|postgres)$$' -benchtime $(CONSUMERS_STORES_N) -count $(CONSUMERS_COUNT) .); \
		  (cd idemwatermill && $(LOCKED) $(GO) test -run '^$$' -bench 'Consume' -benchtime $(CONSUMERS_N) -count $(CONSUMERS_COUNT) .); \
		  uptime; } >bench/results/consumers.txt
	GO=$(GO) CONSUMERS_N=$(CONSUMERS_N) CONSUMERS_COUNT=$(CONSUMERS_COUNT) BENCH_LOCK=$(BENCH_LOCK) scripts/bench-consumers-pinned >bench/results/consumers-pinned.txt
	cd bench && $(GO) run ./consumers && $(GO) run ./plot -only consumers

bench-engine: ## the core engine benchmarks on this tree → bench/results/engine-after.txt
	$(LOCKED) $(GO) test -run '^$$' -bench . -benchmem -count 5 . >bench/results/engine-after.txt.tmp
	@mv bench/results/engine-after.txt.tmp bench/results/engine-after.txt && cat bench/results/engine-after.txt

bench-engine-before: ## the same at ENGINE_BEFORE (f03a8e3, before issue 17), in a throwaway worktree → bench/results/engine-before.txt
	@set -e; d="$$(mktemp -d)"; trap 'git worktree remove --force "$$d"' EXIT; \
		git worktree add --detach "$$d" $(ENGINE_BEFORE) >/dev/null; \
		(cd "$$d" && $(LOCKED) $(GO) test -run '^$$' -bench . -benchmem -count 5 .) >bench/results/engine-before.txt.tmp; \
		mv bench/results/engine-before.txt.tmp bench/results/engine-before.txt; cat bench/results/engine-before.txt

FAILOVER_ROUNDS ?= 20

failover: ## the failover measurements of docs/failover.md (Redis Cluster, Sentinel, PostgreSQL standby; FAILOVER_ROUNDS rounds per setting, default 20) → bench/results/failover/*.json (the tests' output in log.txt) and the tables of docs/failover.md (bench/failover)
	@mkdir -p bench/results/failover
	@scripts/redis-cluster run scripts/redis-replicas run scripts/pg-standby run sh -c '\
		export IDEM_FAILOVER_ROUNDS=$(FAILOVER_ROUNDS) IDEM_FAILOVER_OUT=$(CURDIR)/bench/results/failover; \
		(cd store/redisstore && $(GO) test -count=1 -timeout 2h -run "^Test(Cluster|Sentinel)FailoverUnderLoad$$" -v .) && \
		(cd store/pgstore && $(GO) test -count=1 -timeout 2h -run "^TestStandbyFailoverUnderLoad$$" -v .)' \
		>bench/results/failover/log.txt 2>&1 || { tail -40 bench/results/failover/log.txt; exit 1; }
	cd bench && $(GO) run ./failover

bench-plots: ## draw docs/img/*.png from bench/results (bench/plot, gonum/plot)
	cd bench && $(GO) run ./plot

FUZZ_TARGETS := .:FuzzCanonicalize .:FuzzParseStoreKey .:FuzzParseToken store:FuzzUnmarshalRecord idemhttp:FuzzParseHeader idemhttp:FuzzMiddleware idemhttp:FuzzResponseCodec idemlambda:FuzzWrapRaw idemlambda:FuzzHTTPAdapter store/dynamostore:FuzzDecodeCursor store/redisstore:FuzzDecodeValue store/redisstore:FuzzDecodeSteps store/pgstore:FuzzDecodeSteps idemsfn:FuzzExecutionName idemgrpc/idemrpc:FuzzParseKey

fuzz: ## run each fuzz target for FUZZTIME (default 30s)
	@set -e; for t in $(FUZZ_TARGETS); do d=$${t%%:*}; f=$${t##*:}; echo "== $$d $$f"; \
		(cd $$d && $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) .); done

modcheck: ## install idem-gateway@VERSION and build and vet every module as users get them: GOWORK=off, from a file-system module proxy of this tree (scripts/modcheck)
	@scripts/modcheck

installcheck: ## follow the README's Install from this clone for every library module: a throwaway module with the README's replace lines, go get, go mod tidy, go build (scripts/installcheck)
	@scripts/installcheck

tidy: ## go mod tidy in every module through that proxy (a plain go mod tidy cannot resolve the unpublished VERSION)
	@scripts/modcheck tidy

tools: ## install staticcheck
	$(GO) install honnef.co/go/tools/cmd/staticcheck@v0.7.0

screenshots: ## redraw the console's screenshots (docs/img/console-*.png) from its browser test, on the memory store (needs Debian's chromium)
	cd cmd/idemctl && IDEM_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/img $(GO) test -count=1 -run 'TestBrowserResolveStuckRecord/memory' ./internal/command

ops-check: ## check the Prometheus rules (ops/prometheus) and run their unit tests with promtool (Debian: apt-get install prometheus)
	$(PROMTOOL) check rules ops/prometheus/idem-rules.yml
	$(PROMTOOL) test rules ops/prometheus/idem-rules_test.yml

lint: ## gofmt, go vet and staticcheck over every module
	@test -z "$$(find . -path './.*' -prune -o -name '*.go' -print | xargs gofmt -l | tee /dev/stderr)" || (echo "gofmt needed"; exit 1)
	@set -e; for m in $(MODULES); do echo "== $$m"; (cd $$m && $(GO) vet ./... && $(STATICCHECK) ./...); done
