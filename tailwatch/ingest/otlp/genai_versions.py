"""Which OpenTelemetry GenAI convention defines each name the OTLP mapping reads, and in which
releases: the one place the docs' "Defined by" columns and the mapping tables take it from.

The GenAI conventions lived in open-telemetry/semantic-conventions until v1.41. v1.42.0
deprecated the whole gen-ai model there ("Moved to the OpenTelemetry GenAI semantic
conventions repository"); v1.42 to v1.44 carry it only as deprecated. That repository,
open-telemetry/semantic-conventions-genai, has made no release: it is cited as its main
branch at the commits read. Every entry was read in the registry text of semantic-conventions
v1.26.0, v1.27.0, v1.39.0 to v1.42.0 and v1.44.0 (model/gen-ai/) and of that repository's
model/gen-ai/*.yaml on 2026-11-28; tests/test_semconv_versions.py checks that every name the
mapping reads has an entry here and that the docs say what this table says.
"""

from __future__ import annotations

from dataclasses import dataclass

SEMCONV = "OpenTelemetry semantic-conventions"
GENAI_MAIN = "OpenTelemetry semantic-conventions-genai (main branch, no release)"
LAST_IN_SEMCONV = "v1.41"  # v1.42.0 deprecated the gen-ai model: moved to semantic-conventions-genai


@dataclass(frozen=True)
class Defined:
    since: str | None  # the first semantic-conventions release that defines it; None: older than v1.26, or never
    until: str | None  # the last release that defines it undeprecated; None: no release defines it
    genai_main: bool  # defined on semantic-conventions-genai's main branch

    @property
    def text(self) -> str:
        parts = []
        if self.until is not None:
            span = f"{self.since}–{self.until}" if self.since and self.since != self.until else \
                f"{self.until}" if self.since else f"up to {self.until}"
            parts.append(f"{SEMCONV} {span} (deprecated from "
                         f"{'v1.42' if self.until == LAST_IN_SEMCONV else _next(self.until)})")
        if self.genai_main:
            parts.append(GENAI_MAIN)
        return "; ".join(parts) or (f"in no {SEMCONV} release and not on semantic-conventions-genai's main "
                                    "branch as read: read for instrumentations that emit it")


def _next(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    return f"v{major}.{int(minor) + 1}"


_GENERATION_1 = Defined("v1.27", LAST_IN_SEMCONV, True)  # the v1.27 renames, kept since
GENAI_NAMES: dict[str, Defined] = {
    # span attributes
    "gen_ai.usage.input_tokens": _GENERATION_1,
    "gen_ai.usage.output_tokens": _GENERATION_1,
    "gen_ai.usage.prompt_tokens": Defined(None, "v1.26", False),
    "gen_ai.usage.completion_tokens": Defined(None, "v1.26", False),
    "gen_ai.usage.cache_read.input_tokens": Defined("v1.40", LAST_IN_SEMCONV, True),
    "gen_ai.response.time_to_first_chunk": Defined("v1.41", LAST_IN_SEMCONV, True),
    # metrics
    "gen_ai.client.token.usage": _GENERATION_1,
    "gen_ai.client.operation.duration": _GENERATION_1,
    "gen_ai.server.request.duration": _GENERATION_1,
    "gen_ai.server.time_to_first_token": _GENERATION_1,
    "gen_ai.server.time_per_output_token": _GENERATION_1,
    "gen_ai.client.operation.time_to_first_chunk": Defined("v1.41", LAST_IN_SEMCONV, True),
    "gen_ai.client.operation.time_per_output_chunk": Defined("v1.41", LAST_IN_SEMCONV, True),
    "gen_ai.client.inference.operation.input_tokens": Defined(None, None, True),
    "gen_ai.client.inference.operation.output_tokens": Defined(None, None, True),
    "gen_ai.client.inference.usage.cache_read.input_tokens": Defined(None, None, True),
    "gen_ai.client.inference.usage.detailed.cache_read.input_tokens": Defined(None, None, True),  # an older file there
    "gen_ai.client.inference.duration": Defined(None, None, False),
    "gen_ai.client.inference.time_to_first_chunk": Defined(None, None, False),
    "gen_ai.client.inference.time_per_output_chunk": Defined(None, None, False),
}


def defined_by(name: str) -> str:
    return GENAI_NAMES[name].text
