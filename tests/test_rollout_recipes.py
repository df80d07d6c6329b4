"""The manifests `tailwatch rollout recipe` writes, run through each controller's documented
rules against the real signal API (its router and verdict answers, no HTTP port needed):

- Flagger (docs.flagger.app/usage/webhooks, pkg/controller/scheduler_hooks.go): a hook passes
  on 200-202; a failed pre-rollout or rollout hook is a failed check and `threshold` of them
  roll back; the confirm-* hooks hold without counting; a rollback hook's pass rolls back at
  once; a failed post-rollout hook is only logged.
- Argo Rollouts (analysis docs): a measurement is Successful when `successCondition` holds,
  Failed when `failureCondition` does, otherwise Inconclusive; a metric fails past
  `failureLimit`, is inconclusive past `inconclusiveLimit` (which pauses the Rollout) and
  succeeds when `count` measurements are taken within both.

The claim under test: the only way to full weight is a `promote` verdict; a rollback verdict
rolls back; stale or missing data never advances nor rolls back."""

from __future__ import annotations

import json

import pytest
import yaml

from tailwatch.signals.api import FLAGGER_CHECKS, SignalApi
from tests.conftest import call_api
from tailwatch.signals.answers import Verdict
from tailwatch.signals.config import ApiConfig
from tailwatch.signals.live import Scoped, SignalSnapshot, answer
from tailwatch.signals.served import ServedView, serve
from tailwatch.signals.recipes import GATE_TEMPLATE, BACKGROUND_TEMPLATE, argo_rollout, argo_templates, flagger_canary
from tailwatch.cli import main

MODEL, VERSION = "llama-3.1-70b", "2024-11"


class Fleet:
    """The signal API over a view whose canary verdict (and data age) the test sets each minute."""

    def __init__(self):
        self.now_s = 1_000.0
        self.verdict: str | None = None  # None: no closed minute of the canary yet
        self.moved_s = self.now_s
        self.events: list[tuple[str, str]] = []
        self.api = SignalApi(ApiConfig(stale_after_s=120.0), self.snapshot, lambda: (True, ""),
                             wall_clock=lambda: self.now_s, on_flagger_event=lambda *e: self.events.append(e))

    def snapshot(self) -> ServedView:
        rollouts = {} if self.verdict is None else {(MODEL, VERSION): Scoped(answer(
            {"verdict": self.verdict, "reasons": [], "model": MODEL, "version": VERSION, "window_minutes": 30,
             "as_of": "2026-11-02T00:30:00Z"}, Verdict), frozenset({"t"}), 0, self.moved_s, self.moved_s)}
        return serve(SignalSnapshot(self.now_s, 0, {}, rollouts, {MODEL: frozenset(rollouts and {VERSION})}, [], []))

    def minute(self, verdict: str | None, stale: bool = False) -> None:
        self.now_s += 60
        self.verdict = verdict
        if not stale:
            self.moved_s = self.now_s

    def post(self, url: str, body: dict) -> int:
        status, _ct, _body = call_api(self.api, "POST", url.removeprefix("http://tailwatch.monitoring:8000"),
                                                     None, json.dumps(body).encode())
        return status

    def get(self, url: str) -> dict:
        status, _ct, body = call_api(self.api, "GET", url.removeprefix("http://tailwatch.monitoring:8000"),
                                                    None, b"")
        assert status == 200, body
        return json.loads(body)


# ---- Flagger ----------------------------------------------------------------------------

class FlaggerScheduler:
    """Flagger's canary loop, as its docs and scheduler describe it, one call per interval."""

    def __init__(self, fleet: Fleet, canary: dict):
        self.fleet = fleet
        self.analysis = canary["spec"]["analysis"]
        self.hooks = {h["type"]: h for h in self.analysis["webhooks"]}
        self.phase = "Initializing"
        self.weight = 0
        self.failed_checks = 0
        self.log: list[str] = []

    def call(self, hook_type: str) -> bool:
        hook = self.hooks[hook_type]
        body = {"name": "chat", "namespace": "serving", "phase": self.phase, "metadata": hook.get("metadata", {})}
        return self.fleet.post(hook["url"], body) <= 202  # Flagger: `r.StatusCode > 202` is an error

    def event(self, message: str, kind: str = "Normal") -> None:
        hook = self.hooks["event"]
        self.fleet.post(hook["url"], {"name": "chat", "namespace": "serving", "phase": self.phase,
                                      "metadata": {"eventMessage": message, "eventType": kind, "timestamp": "0"}})

    def interval(self) -> None:
        if self.phase in ("Succeeded", "Failed"):
            return
        if self.phase in ("Initializing", "Waiting"):
            if not self.call("confirm-rollout"):
                self.phase = "Waiting"
                self.log.append("waiting for approval")
                return
            self.phase = "Progressing"
            if not self.call("pre-rollout"):
                self.failed_checks += 1
                self.log.append("pre-rollout failed")
                return self._maybe_roll_back()
        if self.call("rollback"):
            return self._roll_back("rollback hook")
        if not self.call("rollout"):
            self.failed_checks += 1
            self.log.append("rollout check failed")
            return self._maybe_roll_back()
        if self.weight < self.analysis["maxWeight"]:
            if self.call("confirm-traffic-increase"):
                self.weight += self.analysis["stepWeight"]
                self.event(f"Advance chat.serving canary weight {self.weight}")
                self.log.append(f"weight {self.weight}")
            else:
                self.log.append(f"held at {self.weight}")
            return
        if self.call("confirm-promotion"):
            self.phase = "Succeeded"
            self.log.append("promoted")
            self.call("post-rollout")  # a failure is only logged
            self.event("Promotion completed")
        else:
            self.log.append("promotion held")

    def _maybe_roll_back(self) -> None:
        if self.failed_checks >= self.analysis["threshold"]:
            self._roll_back("threshold")

    def _roll_back(self, why: str) -> None:
        self.phase = "Failed"
        self.weight = 0
        self.log.append(f"rolled back ({why})")
        self.call("post-rollout")
        self.event("Canary failed! Scaling down chat.serving", "Warning")


def flagger_recipe() -> dict:
    return flagger_canary("chat", "serving", MODEL, VERSION, "http://tailwatch.monitoring:8000")


def run_flagger(verdicts: list[tuple[str | None, bool]]) -> tuple[FlaggerScheduler, Fleet]:
    fleet = Fleet()
    scheduler = FlaggerScheduler(fleet, flagger_recipe())
    for verdict, stale in verdicts:
        fleet.minute(verdict, stale)
        scheduler.interval()
    return scheduler, fleet


def test_the_flagger_recipe_wires_every_hook_type_to_a_route_that_answers():
    canary = flagger_recipe()
    types = [h["type"] for h in canary["spec"]["analysis"]["webhooks"]]
    assert sorted(types) == sorted([*FLAGGER_CHECKS, "event"])
    assert set(types) == {"confirm-rollout", "pre-rollout", "rollout", "confirm-traffic-increase", "confirm-promotion",
                          "post-rollout", "rollback", "event"}  # every type Flagger's docs list
    fleet = Fleet()
    fleet.minute("continue")
    for hook in canary["spec"]["analysis"]["webhooks"]:
        assert fleet.post(hook["url"], {"metadata": hook.get("metadata", {})}) in (200, 412), hook["type"]


def test_flagger_promotes_only_on_promote_and_holds_on_pause():
    # A new canary: no data for a minute, then continue, a pause, continue to the top weight, promote.
    script = [(None, False), ("continue", False), ("continue", False), ("pause", False), ("continue", False),
              ("continue", False), ("continue", False), ("continue", False), ("continue", False), ("promote", False)]
    scheduler, fleet = run_flagger(script)
    assert scheduler.log == ["held at 0", "weight 10", "weight 20", "held at 20", "weight 30", "weight 40", "weight 50",
                             "promotion held", "promotion held", "promoted"], scheduler.log
    assert scheduler.phase == "Succeeded" and scheduler.failed_checks == 0
    assert ("Progressing", "Normal") in fleet.events and ("Succeeded", "Normal") in fleet.events


def test_flagger_never_promotes_a_canary_that_only_continues():
    scheduler, _ = run_flagger([("continue", False)] * 30)
    assert scheduler.phase == "Progressing" and scheduler.weight == 50 and "promoted" not in scheduler.log
    assert scheduler.log[-1] == "promotion held" and scheduler.failed_checks == 0


def test_flagger_rolls_back_at_once_on_a_rollback_verdict():
    scheduler, fleet = run_flagger([("continue", False), ("continue", False), ("rollback", False), ("promote", False)])
    assert scheduler.log == ["weight 10", "weight 20", "rolled back (rollback hook)"], scheduler.log
    assert scheduler.phase == "Failed" and scheduler.failed_checks == 0
    assert ("Failed", "Warning") in fleet.events


def test_flagger_neither_advances_nor_rolls_back_on_stale_data():
    # The canary's data stopped moving ten minutes ago: its last verdict, rollback or promote, is
    # not acted on, and no failed check is counted while it waits.
    for last in ("rollback", "promote"):
        fleet = Fleet()
        scheduler = FlaggerScheduler(fleet, flagger_recipe())
        for _ in range(5):
            fleet.minute("continue")
            scheduler.interval()
        fleet.now_s += 600
        for _ in range(6):
            fleet.minute(last, stale=True)
            scheduler.interval()
        assert scheduler.phase == "Progressing" and scheduler.failed_checks == 0, (last, scheduler.log)
        assert scheduler.weight == 50 and scheduler.log[5:] == ["promotion held"] * 6, scheduler.log


def test_an_event_outside_flaggers_sets_is_counted_as_other():
    fleet = Fleet()
    assert fleet.post("/v1/flagger/event", {"phase": "Pwned\n", "metadata": {"eventType": "x" * 60}}) == 200
    assert fleet.post("/v1/flagger/event", {"phase": "Promoting", "metadata": {"eventType": "Warning"}}) == 200
    assert fleet.post("/v1/flagger/event", {"phase": "Promoting", "metadata": {"eventType": "x" * 100}}) == 400
    assert fleet.events == [("other", "other"), ("Promoting", "Warning")]


# ---- Argo Rollouts ------------------------------------------------------------------------

def condition(expression: str, result: str) -> bool:
    """The recipes' conditions: `result == "x"` terms joined by `||`."""
    return any(term.strip() == f'result == "{result}"' for term in expression.split("||"))


class ArgoMetric:
    """One metric of an AnalysisRun, assessed as Argo documents it."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.counts = {"Successful": 0, "Failed": 0, "Inconclusive": 0}

    def measure(self, fleet: Fleet) -> str:
        url = self.spec["provider"]["web"]["url"].replace("{{args.model}}", MODEL).replace("{{args.version}}", VERSION)
        assert self.spec["provider"]["web"]["jsonPath"] == "{$.verdict}"
        result = fleet.get(url)["verdict"]
        if condition(self.spec["successCondition"], result):
            outcome = "Successful"
        elif condition(self.spec["failureCondition"], result):
            outcome = "Failed"
        else:
            outcome = "Inconclusive"
        self.counts[outcome] += 1
        return self.phase()

    def phase(self) -> str:
        if self.counts["Failed"] > self.spec.get("failureLimit", 0):
            return "Failed"
        if self.counts["Inconclusive"] > self.spec.get("inconclusiveLimit", 0):
            return "Inconclusive"
        if "count" in self.spec and sum(self.counts.values()) >= self.spec["count"]:
            return "Successful"
        return "Running"


def templates() -> dict[str, dict]:
    return {t["metadata"]["name"]: t["spec"]["metrics"][0] for t in argo_templates("http://tailwatch.monitoring:8000")}


@pytest.mark.parametrize("verdict, stale, phase", [
    ("promote", False, "Successful"),
    ("continue", False, "Inconclusive"),  # the Rollout pauses at the gate: never full weight on continue
    ("pause", False, "Inconclusive"),
    (None, False, "Inconclusive"),  # no data for the canary
    ("promote", True, "Inconclusive"),  # a promote on data that stopped moving
    ("rollback", False, "Failed"),  # the Rollout aborts
])
def test_argo_gate_succeeds_only_on_promote(verdict, stale, phase):
    fleet = Fleet()
    fleet.minute("continue")
    fleet.minute(verdict, stale=False)
    if stale:
        fleet.now_s += 600
    gate = ArgoMetric(templates()[GATE_TEMPLATE])
    assert gate.measure(fleet) == phase


def test_argo_background_aborts_on_rollback_and_pauses_on_repeated_doubt():
    spec = templates()[BACKGROUND_TEMPLATE]
    assert "count" not in spec  # runs for the whole rollout
    fleet = Fleet()
    background = ArgoMetric(spec)
    for _ in range(40):
        fleet.minute("continue")
        assert background.measure(fleet) == "Running"  # continue never ends it, and never promotes by itself
    fleet.minute("rollback")
    assert background.measure(fleet) == "Failed"
    doubtful = ArgoMetric(spec)
    phases = []
    for verdict in ("pause", None, "pause", "continue", "pause", "pause", "pause"):
        fleet.minute(verdict)
        phases.append(doubtful.measure(fleet))
    assert phases == ["Running"] * 6 + ["Inconclusive"]  # six doubtful looks, past the limit of five


def test_the_argo_rollout_gates_full_weight_on_the_promotion_template():
    rollout = argo_rollout("chat", "serving", MODEL, VERSION)
    steps = rollout["spec"]["strategy"]["canary"]["steps"]
    assert steps[-1]["analysis"]["templates"] == [{"templateName": GATE_TEMPLATE}]
    assert max(s.get("setWeight", 0) for s in steps) < 100  # full weight only after the gate
    assert rollout["spec"]["strategy"]["canary"]["analysis"]["templates"] == [{"templateName": BACKGROUND_TEMPLATE}]


def test_the_recipe_command_writes_what_the_docs_show(capsys):
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "signal-api.md").read_text()
    for controller in ("argo", "flagger"):
        assert main(["rollout", "recipe", controller, "--model", MODEL, "--version", VERSION, "--target", "chat",
                     "--namespace", "serving"]) == 0
        out = capsys.readouterr().out
        assert out.rstrip() in doc, controller  # the docs show the command's own output
        kinds = [d["kind"] for d in yaml.safe_load_all(out)]
        assert kinds == (["AnalysisTemplate", "AnalysisTemplate", "Rollout"] if controller == "argo" else ["Canary"])


def test_kubernetes_names_are_made_the_same_way_everywhere(capsys, tmp_path):
    """A model's name is no Kubernetes name (`llama-3.1-70b`: Flagger names Services after the
    Canary, and a Service name holds no dot): the recipe makes one, the deployment file's
    refusal says in words what would do, and the rule always gives a valid label."""
    from hypothesis import given, settings, strategies as st

    from tailwatch.config.kubernetes import is_kubernetes_name, kubernetes_name
    from tailwatch.deploy.settings import DeployError, load_settings

    for controller in ("flagger", "argo"):
        assert main(["rollout", "recipe", controller, "--model", MODEL, "--version", VERSION]) == 0
        docs = list(yaml.safe_load_all(capsys.readouterr().out))
        named = [d["metadata"]["name"] for d in docs if d["kind"] in ("Canary", "Rollout")]
        assert named == ["llama-3-1-70b"]
    assert main(["rollout", "recipe", "flagger", "--model", MODEL, "--version", VERSION, "--target", "Chat.v2"]) == 2
    assert "'chat-v2' would do" in capsys.readouterr().err
    f = tmp_path / "deploy.yaml"
    f.write_text(f"canaries:\n  - {{model: {MODEL}, version: '2', target: {MODEL}}}\n")
    with pytest.raises(DeployError) as refused:
        load_settings(f)
    message = str(refused.value)
    assert "canaries[0].target: 'llama-3.1-70b' is not a Kubernetes name" in message
    assert "'llama-3-1-70b' would do" in message and "regex" not in message and "^[a-z0-9]" not in message

    @settings(max_examples=300, deadline=None)
    @given(st.text(min_size=1, max_size=120))
    def made_names_are_valid(text):
        try:
            name = kubernetes_name(text)
        except ValueError:
            assert not any(c.isascii() and c.isalnum() for c in text.lower())
            return
        assert is_kubernetes_name(name) and kubernetes_name(name) == name
        if is_kubernetes_name(text):
            assert name == text  # a valid name is kept as it is

    made_names_are_valid()
    long_a, long_b = "m" * 70 + "a", "m" * 70 + "b"
    assert kubernetes_name(long_a) != kubernetes_name(long_b) and len(kubernetes_name(long_a)) == 63
