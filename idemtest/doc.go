// Package idemtest holds the test kits of idem's modules, one package each:
//
//   - [github.com/seed-a1b882c0/idem/idemtest/clocktest]: a manual store.Clock.
//   - [github.com/seed-a1b882c0/idem/idemtest/faultstore]: a store.Store
//     wrapper that counts calls and injects failures and lost replies.
//   - [github.com/seed-a1b882c0/idem/idemtest/faultproxy]: a TCP proxy that
//     delays, loses and resets traffic to a real server.
//   - [github.com/seed-a1b882c0/idem/idemtest/storefaults]: the network-fault
//     suite for stores that talk to a server, built on faultproxy.
//   - [github.com/seed-a1b882c0/idem/idemtest/testenv]: skip outside CI, fail
//     in CI, when a test's server is missing.
//   - [github.com/seed-a1b882c0/idem/idemtest/benchkit]: the store benchmark
//     harness.
//   - [github.com/seed-a1b882c0/idem/idemtest/httpasync]: the suite of
//     idemhttp's asynchronous mode (202 and a status resource), run over
//     the in-memory store and over a real one.
//   - [github.com/seed-a1b882c0/idem/idemtest/redisnodes]: drives the Redis
//     servers the project's scripts start (a cluster, a primary with a
//     replica and a Sentinel): ask them, kill one, start it again.
//   - [github.com/seed-a1b882c0/idem/idemtest/failover]: measures what a
//     store's failover loses, callers running while a server is killed.
//   - [github.com/seed-a1b882c0/idem/idemtest/consoletest]: seeds a store
//     with the records the operator console's tests read, and drives the
//     console over HTTP.
//   - [github.com/seed-a1b882c0/idem/idemtest/consumetest]: the consumer
//     conformance suite: the verdict table every message consumer runs,
//     and the find, batch, kill and zombie scenarios.
//   - [github.com/seed-a1b882c0/idem/idemtest/childproc]: runs a test of
//     the test binary as a process of its own, to kill or stop it.
//
// They are exported, not internal, because the stores, idemlambda and
// idem-gateway are modules of their own: a module that imported the core's
// internal packages would compile against whatever core version its user
// selects, and the kits are as usable for a store written outside this
// repository. No production package imports them (internal/repocheck's
// deps_test.go checks every module). Like [github.com/seed-a1b882c0/idem/store/storetest], they are
// for tests only and change with the module's version.
package idemtest
