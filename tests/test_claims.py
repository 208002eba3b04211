"""Two findings never claim the same seconds: every pair of rules with a saving, laid on the
same calls (tests/claim_workloads.py), gives both findings, and their claims in each part of
each attempt add up to no more than the part (``claims.over_claimed``)."""

from __future__ import annotations

from itertools import combinations

import pytest

from llm_latency import diagnose
from llm_latency.diagnosis import Attempt, Backoff, Call, Evidence, Finding, claims
from llm_latency.diagnosis.claims import layout, over_claimed
from llm_latency.diagnosis.records import Phase
from llm_latency.diagnosis.rules import RULES
from tests.claim_workloads import CAUSES, workload

#: The pairs that cannot both be found on one workload, and why.
NEVER_TOGETHER = {
    frozenset({"pool-queue", "http2-stream-limit"}): "a queue is a pool's (HTTP/1.1) or the "
    "connection's stream limit's (HTTP/2), by the attempt's protocol",
    frozenset({"pool-queue", "small-prompts-one-by-one"}): "requests waiting for a pooled "
    "connection run at once, not one after another",
    frozenset({"http2-stream-limit", "small-prompts-one-by-one"}): "requests waiting for a "
    "stream run at once, not one after another",
    frozenset({"long-answer", "small-prompts-one-by-one"}): "a small prompt's answer is short",
    frozenset({"long-prompt", "small-prompts-one-by-one"}): "a small prompt is not long",
    frozenset({"long-answer", "not-streamed"}): "not-streamed yields to long-answer (SUPERSEDED):"
    " the same seconds, seen from the first byte",
}

PAIRS = [
    pytest.param(a, b, id=f"{a}+{b}")
    for a, b in combinations(CAUSES, 2)
    if frozenset({a, b}) not in NEVER_TOGETHER
]


@pytest.mark.parametrize("cause", list(CAUSES))
def test_each_cause_alone_gives_its_finding_and_its_claims(cause: str) -> None:
    """The workloads are what they say: each cause alone gives its rule's finding, with a
    saving and the seconds it counts."""
    findings = diagnose(workload([cause]))
    (found,) = [f for f in findings if f.rule == cause]
    assert found.saving is not None and found.claims
    assert over_claimed(findings) == []


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_two_findings_never_claim_the_same_seconds(first: str, second: str) -> None:
    """Two causes on the same calls, in either order: both findings, no second claimed twice."""
    for causes in ([first, second], [second, first]):
        findings = diagnose(workload(causes))
        found = {f.rule for f in findings}
        assert {first, second} <= found, (causes, sorted(found))
        assert over_claimed(findings) == [], causes


def test_three_causes_at_once_never_claim_the_same_seconds() -> None:
    """Every three causes laid on the same calls: whichever findings stand out, no second is
    claimed twice (a part shared by three rules, such as the provider's first token, is
    where two of them could fit beside each other and the third not)."""
    over = {}
    for causes in combinations(CAUSES, 3):
        said = over_claimed(diagnose(workload(causes)))
        if said:
            over[causes] = said
    assert over == {}


def test_every_cause_that_can_be_at_once_claims_its_own_seconds() -> None:
    """Every cause laid on the same calls but those that exclude another (one of each pair of
    :data:`NEVER_TOGETHER`): the findings that stand out of so much slowness still claim no
    second twice."""
    left_out = {"http2-stream-limit", "small-prompts-one-by-one", "long-answer"}
    causes = [cause for cause in CAUSES if cause not in left_out]
    assert not any(pair <= set(causes) for pair in NEVER_TOGETHER)
    findings = diagnose(workload(causes))
    assert len([f for f in findings if f.claims]) >= 5, [f.rule for f in findings]
    assert over_claimed(findings) == []


def test_a_larger_pool_saves_no_more_than_the_queue_s_own_time() -> None:
    """Six requests at once on a pool of three, 0.2 s each: the second three waited 0.2 s, of
    which the loop's stall held 0.12 s (the stalled loop handed the connections on late).
    pool-queue's replay removes the whole wait; its claim stops at the 80 ms that were the
    pool's, event-loop-lag's at the stall."""
    attempts = []
    for wave in range(2):
        for _ in range(3):
            queue = 0.2 * wave
            phases = [Phase("send", queue, 0.001), Phase("wait", queue + 0.001, 0.199)]
            if queue:
                phases.insert(0, Phase("queue", 0.0, queue, 0.12))
            attempts.append(Attempt(0, queue + 0.2, tuple(phases), host="h", method="POST",
                                    status=200, client="aiohttp",
                                    event_loop_lag=0.12 if queue else 0.0))  # fmt: skip
    findings = diagnose([Call("c", 0, 0.4, attempts)])
    assert {"pool-queue", "event-loop-lag"} <= {f.rule for f in findings}
    (pool,) = [f for f in findings if f.rule == "pool-queue"]
    assert [c.seconds for c in pool.claims] == pytest.approx([0.08] * 3)
    assert over_claimed(findings) == []


def test_every_rule_with_a_saving_has_a_cause() -> None:
    """A new rule with a saving needs a cause here, so that every pair stays held."""
    named = {rule.__name__.replace("_", "-") for rule in RULES}
    without_saving = {"server-time", "dns-failure", "connect-failure", "tls-failure",
                      "timeouts", "connection-reset", "server-errors", "failed-requests"}  # fmt: skip
    assert named - without_saving <= set(CAUSES) - {"us-or-them"}
    assert set(CAUSES) - {"us-or-them"} <= named


@pytest.mark.parametrize("cause", list(CAUSES))
def test_the_parts_of_an_attempt_add_up_to_its_time(cause: str) -> None:
    """The layout is a partition: for the attempts each cause makes (and their backoffs), the
    parts add up to the attempt's time, none below zero."""
    for call in workload([cause]):
        subjects: list[Attempt | Backoff] = [*call.attempts, *call.backoffs]
        for of in subjects:
            parts = layout(of)
            assert min(parts.values()) >= 0, parts
            assert sum(parts.values()) == pytest.approx(of.duration), parts


def test_a_claim_beyond_its_part_is_found() -> None:
    """The check can fail: two findings that claim most of one 400 ms queue each."""
    queued = Attempt(0, 0.5, (Phase("queue", 0.0, 0.4), Phase("wait", 0.4, 0.1)), status=200)
    assert layout(queued)[claims.QUEUE] == pytest.approx(0.4)
    evidence = Evidence.of("http.queue", [0.3], 0.6, 1)
    made = [
        Finding(
            "a", "", evidence, "", None, claims=claims.per_attempt(claims.QUEUE, [(queued, 0.3)])
        ),
        Finding(
            "b", "", evidence, "", None, claims=claims.per_attempt(claims.QUEUE, [(queued, 0.2)])
        ),
    ]
    (said,) = over_claimed(made)
    assert said.startswith("a + b claim 500 ms of queue (400 ms) of the attempt")
    assert over_claimed(made[:1]) == []
