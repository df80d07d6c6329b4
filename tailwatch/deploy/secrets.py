"""The Secrets an installation reads: which ones the manifests reference (namespace, name,
keys) and the templates `deploy generate` writes for those the settings do not name as
existing.

Credentials live only in Secrets: the signal API's bearer tokens (one key per caller, read
into each worker's environment through `secretKeyRef`) and the Kafka client settings (one
key `kafka.properties`, mounted as a file: `bootstrap.servers` and librdkafka's `sasl.*` and
`ssl.*` lines, with a CA file beside it where TLS needs one). A template's token values are
empty, so a worker started before they are filled in stops on its API config naming the
variable, rather than answering without authentication.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailwatch.deploy.settings import TOKEN_NAMES, DeployError, DeploySettings

KAFKA_DIR = "/etc/tailwatch/kafka"  # where the workloads mount the Kafka Secret
KAFKA_PROPERTIES = "kafka.properties"
KAFKA_CA_FILE = "ca.crt"  # optional key of the Kafka Secret, mounted beside kafka.properties


@dataclass(frozen=True)
class SecretRef:
    namespace: str
    name: str
    keys: tuple[str, ...]
    existing: bool  # made outside tailwatch (kubectl, External Secrets, Sealed Secrets): referenced only

    def line(self) -> str:
        return f"{self.namespace}/{self.name} ({', '.join(self.keys)})"


def referenced(s: DeploySettings) -> list[SecretRef]:
    """Every Secret the manifests reference, in tailwatch's namespace first, then the pools'
    (KEDA's TriggerAuthentication) and canaries' (Argo's AnalysisTemplate) namespaces."""
    if s.tokens_secret == s.kafka.client_config_secret:
        raise DeployError(f"tokens_secret and kafka.client_config_secret are both {s.tokens_secret}: name two Secrets")
    keys: dict[tuple[str, str], list[str]] = {(s.namespace, s.tokens_secret): list(TOKEN_NAMES),
                                              (s.namespace, s.kafka.client_config_secret): [KAFKA_PROPERTIES]}
    for namespace, key in [(p.namespace, "keda") for p in s.pools] + [(c.namespace, "argo") for c in s.canaries]:
        held = keys.setdefault((namespace, s.tokens_secret), [])
        if key not in held:
            held.append(key)
    existing = set(s.existing_secrets)
    unknown = existing - {name for _ns, name in keys}
    if unknown:
        raise DeployError(f"existing_secrets: {', '.join(sorted(unknown))} is no Secret the manifests read "
                          f"(they read {s.tokens_secret} and {s.kafka.client_config_secret})")
    return [SecretRef(ns, name, tuple(k), name in existing) for (ns, name), k in keys.items()]


def kafka_properties_template(s: DeploySettings) -> str:
    """The Kafka Secret's file: the settings' bootstrap servers, SASL and TLS lines to fill in."""
    return (f"bootstrap.servers={s.kafka.bootstrap_servers}\n"
            "# SASL over TLS (uncomment and fill in; librdkafka property names):\n"
            "# security.protocol=SASL_SSL\n"
            "# sasl.mechanism=SCRAM-SHA-512\n"
            "# sasl.username=\n"
            "# sasl.password=\n"
            f"# a private CA: add its certificate to this Secret as the key {KAFKA_CA_FILE}, then\n"
            f"# ssl.ca.location={KAFKA_DIR}/{KAFKA_CA_FILE}\n")


def templates(s: DeploySettings, refs: list[SecretRef]) -> list[dict]:
    """A Secret object for each referenced Secret not named in `existing_secrets`."""
    out = []
    for ref in refs:
        if ref.existing:
            continue
        if ref.name == s.kafka.client_config_secret:
            data = {KAFKA_PROPERTIES: kafka_properties_template(s)}
        else:  # the same token in every namespace: each caller presents the one the workers hold
            data = {key: "" for key in ref.keys}
        out.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": ref.name, "namespace": ref.namespace,
                                 "labels": {"app.kubernetes.io/name": s.name,
                                            "app.kubernetes.io/component": "credentials"}},
                    "stringData": data})
    return out
