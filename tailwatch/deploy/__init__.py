"""Deployment: Kubernetes manifests for a whole installation (`tailwatch deploy generate`).

`settings.py` reads the one file a platform team writes (pools, canaries, replicas, image,
Kafka); `workloads.py` builds tailwatch's own objects (tier-1 and tier-2 StatefulSets, the
OTLP adapter, Services, PodDisruptionBudgets, ConfigMaps, Secret references);
`neighbours.py` builds what wires it to the rest of the fleet (KEDA, Argo Rollouts,
Flagger, the Prometheus Operator, Grafana's sidecar, the OpenTelemetry Collector,
dcgm-exporter); `generate.py` writes them as files a `kubectl apply -k` takes whole.
"""
