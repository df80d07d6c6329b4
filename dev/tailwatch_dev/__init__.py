"""Developer tooling: fuzzers, benchmarks, the chaos harness, detector evaluation. Nothing in
the runtime packages imports from here; the `tailwatch fuzz`, `bench` and `eval` commands
are entry points into it."""
