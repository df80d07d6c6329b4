"""OpenTelemetry in: the Collector's `kafka` exporter topics and Prometheus `/metrics`,
mapped onto `request.v1` and `gpu.v1`.

- `wire`: OTLP batches as bytes (`otlp_proto` or `otlp_json`) ⇄ the official protobuf messages;
- `mapping`: the mapping file (where tenant, traffic class, pool ... come from);
- `attributes`: an OTLP attribute list as a plain dict, and value lookups by rule;
- `views`: one shape for a span from either encoding, and OTLP/JSON readers;
- `spans`: a TracesData batch → request.v1 events (GenAI conventions, vLLM and Triton aliases);
- `samples`: metric samples and histogram points from OTLP MetricsData or a Prometheus text exposition;
- `gpu`: samples → gpu.v1 (DCGM, vLLM, Triton names; counters to deltas; per GPU and time);
- `histogram_requests`: GenAI and runtime latency/token histograms → the request.v1 events they counted;
- `encode`: request.v1 / gpu.v1 → OTLP batches (`tailwatch simulate --format otlp`);
- `scrape`: `tailwatch collect prometheus`, `/metrics` over HTTP;
- `republish`: the `tailwatch ingest otlp` consumer group, Kafka in and out.
"""
