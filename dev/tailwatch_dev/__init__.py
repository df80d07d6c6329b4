"""tailwatch's development tools, a distribution of their own (tailwatch-dev): the embedded
broker, the fleet simulator and public-trace replays, the benchmarks, the chaos harness, the
decode fuzzer and the detector evaluation. They import the runtime (`tailwatch.*`); the runtime
never imports them: the command line finds their commands through the `tailwatch.commands`
entry point and the worker its hooks through `tailwatch.dev` (tailwatch.config.plugins). The
container image installs the runtime only."""
