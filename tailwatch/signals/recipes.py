"""Rollout controller recipes: a Flagger Canary with every webhook wired to tailwatch, and
Argo Rollouts AnalysisTemplates, as manifests (`tailwatch rollout recipe flagger|argo`).

Both are built so that the only success at the last step is a `promote` verdict:
- Flagger: `confirm-promotion` passes only on promote, `confirm-traffic-increase` only on
  continue or promote (a `pause` holds the weight there), or before the canary has traffic
  on a healthy stable side (signals/first_step.py); `pre-rollout` and `rollout` fail
  only on rollback, since each failure counts toward `threshold`; `rollback` rolls back at
  once on a rollback verdict; `post-rollout` and `event` record what happened.
- Argo: `continue` counts as a successful measurement and a count-limited analysis that only
  ever saw `continue` would succeed, so the verdict is read twice: a background analysis that
  aborts on rollback and pauses on repeated `pause`/`inconclusive`, and a gate analysis as the
  step before full weight whose only success is `promote` (anything else is inconclusive,
  which pauses the Rollout for a person; rollback fails it).

The status codes each hook answers are in `signals/api.py` (FLAGGER_PASSES) and
docs/signal-api.md; tests/test_rollout_recipes.py runs these manifests through each
controller's documented rules against the real API.
"""

from __future__ import annotations

from tailwatch.signals.api import FLAGGER_CHECKS  # every hook type with a verdict; `event` has a route of its own
GATE_TEMPLATE = "tailwatch-promotion-gate"
BACKGROUND_TEMPLATE = "tailwatch-verdict"


def flagger_canary(target: str, namespace: str, model: str, version: str, url: str, token: str | None = None,
                   interval: str = "1m", threshold: int = 3, step_weight: int = 10, max_weight: int = 50) -> dict:
    """A Canary for `target` whose analysis asks tailwatch at every hook Flagger has."""
    metadata = {"model": model, "version": version, **({"token": token} if token else {})}
    hooks = [{"name": f"tailwatch-{hook}", "type": hook, "url": f"{url.rstrip('/')}/v1/flagger/{hook}",
              "timeout": "5s", "metadata": dict(metadata)} for hook in FLAGGER_CHECKS]
    hooks.append({"name": "tailwatch-events", "type": "event", "url": f"{url.rstrip('/')}/v1/flagger/event",
                  "timeout": "5s"})
    return {
        "apiVersion": "flagger.app/v1beta1",
        "kind": "Canary",
        "metadata": {"name": target, "namespace": namespace},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "service": {"port": 8000},
            "analysis": {"interval": interval, "threshold": threshold, "stepWeight": step_weight,
                         "maxWeight": max_weight, "webhooks": hooks},
        },
    }


def _web_metric(name: str, url: str, success: str, failure: str, **limits) -> dict:
    return {
        "name": name,
        **limits,
        "successCondition": success,
        "failureCondition": failure,
        "provider": {"web": {
            "url": f"{url.rstrip('/')}/v1/argo/{{{{args.model}}}}/{{{{args.version}}}}",
            "headers": [{"key": "Authorization", "value": "Bearer {{args.token}}"}],
            "timeoutSeconds": 5,
            "jsonPath": "{$.verdict}",
        }},
    }


def _template(name: str, metric: dict, token_secret: tuple[str, str]) -> dict:
    secret, key = token_secret
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": name},
        "spec": {
            "args": [{"name": "model"}, {"name": "version"},
                     {"name": "token", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}],
            "metrics": [metric],
        },
    }


def argo_templates(url: str, inconclusive_limit: int = 5,
                   token_secret: tuple[str, str] = ("tailwatch-token", "token")) -> list[dict]:
    """The background verdict (aborts on rollback; pauses after `inconclusive_limit` looks at
    pause, stale or missing data) and the promotion gate (one look: promote passes, rollback
    fails, anything else pauses); the bearer token from the Secret `token_secret` (name, key)."""
    background = _web_metric(BACKGROUND_TEMPLATE, url, 'result == "promote" || result == "continue"',
                             'result == "rollback"', interval="1m", failureLimit=0,
                             inconclusiveLimit=inconclusive_limit)
    gate = _web_metric(GATE_TEMPLATE, url, 'result == "promote"', 'result == "rollback"', count=1, failureLimit=0,
                       inconclusiveLimit=0)
    return [_template(BACKGROUND_TEMPLATE, background, token_secret), _template(GATE_TEMPLATE, gate, token_secret)]


def argo_rollout(target: str, namespace: str, model: str, version: str, weights: tuple[int, ...] = (10, 25, 50),
                 pause: str = "10m") -> dict:
    """A Rollout over the existing Deployment `target` (`workloadRef`; its pods must carry
    `app: <target>`): the background analysis from the first step, the weights with pauses,
    and the gate before full weight."""

    def args() -> list[dict]:
        return [{"name": "model", "value": model}, {"name": "version", "value": version}]

    steps: list[dict] = []
    for weight in weights:
        steps += [{"setWeight": weight}, {"pause": {"duration": pause}}]
    steps.append({"analysis": {"templates": [{"templateName": GATE_TEMPLATE}], "args": args()}})
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": target, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": target}},
            "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "strategy": {"canary": {"analysis": {"templates": [{"templateName": BACKGROUND_TEMPLATE}], "args": args()},
                                    "steps": steps}},
        },
    }
