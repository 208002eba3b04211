"""docs/telemetry.md's span and metric tables, checked against the code: the names of
``llm_latency.semconv``, the instruments the emitter creates (name, kind, unit), their
Prometheus names, every attribute of the emitter's attribute table, and the attributes a real
streamed call puts on its request spans."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from llm_latency import attribute_table, semconv
from llm_latency.emitter import Emitter
from llm_latency.semconv import GenAINames
from llm_latency.settings import Settings
from llm_latency.timeline import PHASE_NAMES
from tests.conftest import Telemetry
from tests.provider_api import provider_server

PAGE = Path(__file__).resolve().parent.parent / "docs" / "telemetry.md"
KINDS = {
    "create_histogram": "histogram",
    "create_counter": "counter",
    "create_observable_counter": "counter",
    "create_gauge": "gauge",
    "create_observable_gauge": "gauge",
    "create_up_down_counter": "updowncounter",
    "create_observable_up_down_counter": "updowncounter",
}


def table(after: str, page: Path = PAGE) -> list[list[str]]:
    """The rows (cells) of the first table after the text ``after`` in ``page``
    (docs/telemetry.md)."""
    text = page.read_text().split(after, 1)[1]
    lines = text[text.index("\n|") + 1 :].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def semconv_names() -> set[str]:
    values = vars(semconv).values()
    found = {v for v in values if isinstance(v, str)}
    return found | {v for t in values if isinstance(t, tuple) for v in t if isinstance(v, str)}


class RecordingMeter:
    """A real SDK meter that also notes each instrument created: kind, name, unit."""

    def __init__(self, meter: Any) -> None:
        self._meter = meter
        self.created: dict[str, tuple[str, str]] = {}

    def __getattr__(self, attribute: str) -> Any:
        method = getattr(self._meter, attribute)
        if attribute not in KINDS:
            return method

        def create(name: str, *args: Any, **kwargs: Any) -> Any:
            self.created[name] = (KINDS[attribute], kwargs.get("unit", ""))
            return method(name, *args, **kwargs)

        return create


def in_mode(cell: str, genai: GenAINames) -> list[str]:
    """The names of a metrics table cell without the GenAI switch (``OLD``) or with it: a cell
    gives the switch's names after "with the switch:"."""
    old, switch, latest = cell.partition("with the switch:")
    if genai is GenAINames.OLD:
        return names(old)
    return names(latest) if switch else names(old)


@pytest.mark.parametrize("genai", [GenAINames.OLD, GenAINames.LATEST, GenAINames.DUP])
def test_the_metrics_table_is_every_instrument_the_emitter_creates(genai: GenAINames) -> None:
    meter = RecordingMeter(MeterProvider().get_meter("test"))
    Emitter(TracerProvider().get_tracer("test"), meter, Settings(), genai=genai)  # type: ignore[arg-type]
    shown_in = [GenAINames.OLD, GenAINames.LATEST] if genai is GenAINames.DUP else [genai]
    rows: dict[str, tuple[list[str], str]] = {}
    for row in table("\n## Metrics\n"):
        for mode in shown_in:
            found = in_mode(row[0], mode)
            prometheus_names = in_mode(row[3], mode)
            assert len(found) == len(prometheus_names), row
            for name, prometheus_name in zip(found, prometheus_names, strict=True):
                rows[name] = ([prometheus_name], row[1])
    assert set(rows) == set(meter.created)
    assert set(rows) <= semconv_names()
    for name, (kind, unit) in meter.created.items():
        shown = rows[name][1]
        assert shown.split(",")[0] == kind, (name, shown)
        if unit:
            shown_unit = shown.split(",")[1].split()[0].strip("`")
            assert shown_unit == unit, (name, shown)
        snake = name.replace(".", "_")
        # Prometheus drops annotation units ({retry}); seconds and counters get suffixes, and a
        # histogram is its series (_bucket, _sum, _count).
        prometheus = snake
        if unit == "s":
            prometheus += "_seconds_*"
        elif kind == "histogram":
            prometheus += "_*"
        elif kind == "counter":
            prometheus += "_total"
        assert rows[name][0] == [prometheus], (name, rows[name][0])


def test_the_phase_table_is_the_phases_of_the_code() -> None:
    rows = table("**Phase spans**")
    assert [names(row[0])[0] for row in rows] == list(semconv.PHASE_SPAN_NAMES)
    assert [row[1] for row in rows] == list(PHASE_NAMES)


def test_the_call_table_names_what_calls_and_backoffs_carry() -> None:
    """The names a logical call's span and its backoffs carry are on the page, as the code
    spells them."""
    documented = {name for row in table("**Calls and retries.**") for name in names("".join(row))}
    emitted = {
        semconv.SDK,
        semconv.ATTEMPTS,
        semconv.BACKOFF_SPAN,
        semconv.BACKOFF_REASON,
        semconv.BACKOFF_RETRY_AFTER,
    }
    assert emitted <= documented, emitted - documented


def documented_attributes() -> list[str]:
    """The request span's attributes the page's span model and token tables name."""
    return [
        name
        for after in ("\n## The span model\n", "\n### Tokens and the server's share\n")
        for row in table(after)
        for name in names(row[0])
    ]


def test_the_attribute_tables_name_every_attribute_the_table_of_the_code_sets() -> None:
    """Every attribute an attempt's end can set, as the emitter's table lists them: a real
    call sets only some (no proxy, no failure, no resend, one provider's tokens)."""
    missing = attribute_table.attribute_names() - set(documented_attributes())
    assert not missing, missing


async def test_the_attribute_table_names_what_a_real_call_records(telemetry: Telemetry) -> None:
    documented = documented_attributes()
    known = semconv_names()
    for name in documented:
        assert name in known or name == "http.response.header.<name>", name
    async with provider_server() as provider:
        client = openai.AsyncOpenAI(base_url=provider.openai_base, api_key="sk-test-key")
        stream = await client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        async for _ in stream:
            pass
        await client.close()
    recorded = {key for span in telemetry.requests() for key in (span.attributes or {})}
    assert semconv.STREAM_EVENTS in recorded  # the streamed call's attributes are there
    missing = {
        key for key in recorded
        if key not in documented and not key.startswith("http.response.header.")
    }  # fmt: skip
    assert not missing, missing
