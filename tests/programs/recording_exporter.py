"""A span exporter of a program's own, printing ``RECORDED <span name>`` for each span;
tests/test_providers.py registers it under the SDK's ``opentelemetry_traces_exporter`` entry
point (as ``recording``) with a dist-info directory of its own."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class Recording(SpanExporter):
    """Prints each exported span's name."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            print("RECORDED", span.name, flush=True)
        return SpanExportResult.SUCCESS
