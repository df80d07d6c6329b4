"""Where the public traces and the H100 lab run live in the repository (`tests/data/`, each
with its licence and attribution): what the tests, the chaos harness and the benchmarks
replay by default. The runtime never reads them."""

from __future__ import annotations

from pathlib import Path

PUBLIC_DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
AZURE_CODE_TRACE = PUBLIC_DATA / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
MOONCAKE_TRACE = PUBLIC_DATA / "mooncake-fast25" / "conversation_trace.jsonl.gz"
H100_LAB = PUBLIC_DATA / "h100-lab"
