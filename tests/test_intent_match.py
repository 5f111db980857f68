"""``effects_match_intent``: every applied effect carries its step's declared parameters.

On small hand-written histories (no processes), then end to end: the re-pricing mutant caught on
the default workload, the reference valid, and a user target's own ``intent`` hook honoured.
"""

from __future__ import annotations

from typing import Any

import pytest

from killpoint.harness.checkers import ALL, check_all
from killpoint.harness.checkers.intent_match import effects_match_intent
from killpoint.harness.history import StepConfig, build

MS = 1_000_000
PARAMS = {"amount": 25747, "currency": "EUR", "card": "4242"}
CHARGE = StepConfig("order-1", "charge", "payment", "k1", params=PARAMS)
RESERVE = StepConfig("order-1", "reserve", "inventory", "r1", params={"sku": "A-1", "qty": 2},
                     compensation_key="r1-undo",
                     compensation_params={"undo": "r1", "sku": "A-1", "qty": 2})


def applied(t: float, params: Any, *, inst: str = "order-1", step: str = "charge", key: str | None = "k1",
            resource: str = "payment", outcome: str = "applied", direction: str = "forward",
            attempt: int = 1, worker: str = "A") -> tuple[int, str, str, str, dict[str, Any]]:
    return (int(t * MS), "downstream", "request", "event", {
        "resource": resource, "key": key, "params": params, "intent_hash": "h",
        "outcome": outcome, "applied": outcome in ("applied", "dropped"), "status": 200,
        "meta": {"instance": inst, "step": step, "worker": worker, "attempt": attempt,
                 "direction": direction}})


def test_an_effect_with_the_declared_parameters_holds():
    result = effects_match_intent(build([applied(1, dict(PARAMS))], steps=(CHARGE,)))
    assert (result.valid, result.checked, result.violations) == (True, True, ())


def test_a_repriced_effect_is_a_violation_naming_the_effect_the_expected_and_the_applied_amount():
    history = build([applied(1, {**PARAMS, "amount": 26776}, attempt=2, worker="B")], steps=(CHARGE,))
    result = effects_match_intent(history)
    assert result.valid is False and result.checked
    (v,) = result.violations
    assert (v.invariant, v.instance, v.step, v.events) == ("effects_match_intent", "order-1", "charge", (0,))
    assert "'k1'" in v.detail and "attempt 2" in v.detail and "worker B" in v.detail
    assert "amount: expected 25747, applied 26776" in v.detail


def test_a_missing_or_extra_parameter_is_named_too():
    extra = {k: v for k, v in PARAMS.items() if k != "card"} | {"tip": 5}
    (v,) = effects_match_intent(build([applied(1, extra)], steps=(CHARGE,))).violations
    assert "card: expected \"4242\", applied nothing" in v.detail and "tip: expected nothing, applied 5" in v.detail


def test_effects_that_were_not_applied_are_not_judged():
    """A 422 for a reused key with another intent is intent_conflict's business: nothing happened."""
    result = effects_match_intent(build([applied(1, {**PARAMS, "amount": 1}, outcome="conflict")],
                                        steps=(CHARGE,)))
    assert (result.valid, result.checked) == (True, False)


def test_a_dropped_answer_is_an_applied_effect_and_is_judged():
    result = effects_match_intent(build([applied(1, {**PARAMS, "amount": 1}, outcome="dropped")],
                                        steps=(CHARGE,)))
    assert result.valid is False


def test_a_compensation_is_judged_against_the_step_plus_the_key_it_undoes():
    ok = applied(1, {"undo": "r1", "sku": "A-1", "qty": 2}, step="reserve", key="r1-undo",
                 resource="inventory-release", direction="compensation")
    assert effects_match_intent(build([ok], steps=(RESERVE,))).valid is True
    wrong = applied(1, {"undo": "r1", "sku": "A-1", "qty": 3}, step="reserve", key="r1-undo",
                    resource="inventory-release", direction="compensation")
    (v,) = effects_match_intent(build([wrong], steps=(RESERVE,))).violations
    assert "compensation effect" in v.detail and "qty: expected 2, applied 3" in v.detail


def test_lists_and_tuples_compare_as_the_downstream_keeps_them():
    step = StepConfig("order-1", "charge", "payment", "k1", params={"items": ("a", "b")})
    assert effects_match_intent(build([applied(1, {"items": ["a", "b"]})], steps=(step,))).valid is True


def test_a_legacy_effect_is_judged_and_named_by_its_resource():
    notify = StepConfig("order-1", "notify", "notify", None, legacy=True,
                        params={"email": "a@b.c", "template": "order-confirmed"})
    event = applied(1, {"email": "x@y.z", "template": "order-confirmed"}, step="notify", key=None,
                    resource="notify")
    (v,) = effects_match_intent(build([event], steps=(notify,))).violations
    assert "legacy resource 'notify'" in v.detail and 'email: expected "a@b.c", applied "x@y.z"' in v.detail


def test_a_step_that_declares_no_parameters_is_passed_over():
    bare = StepConfig("order-1", "charge", "payment", "k1")  # beside a step that declares some
    result = effects_match_intent(build([applied(1, {"anything": 1})], steps=(bare, RESERVE)))
    assert (result.valid, result.checked, result.applicable) == (True, False, True)


def test_not_applicable_when_the_workload_declares_no_parameters():
    result = effects_match_intent(build([applied(1, {"amount": 1})],
                                        steps=(StepConfig("order-1", "charge", "payment", "k1"),)))
    assert (result.valid, result.applicable, result.judged) == (True, False, False)
    assert "declares no parameters" in result.detail


def test_registered_with_the_others_and_its_violation_makes_the_verdict_false():
    assert ALL["effects_match_intent"] is effects_match_intent
    verdict = check_all(build([applied(1, {**PARAMS, "amount": 2})], steps=(CHARGE,)))
    assert verdict.valid is False
    assert [v.invariant for v in verdict.violations] == ["effects_match_intent"]


# ---------------------------------------------------------------------------------------------
# end to end


@pytest.fixture(scope="module")
def session():
    from killpoint.harness.run import Session

    with Session() as s:
        yield s


def test_the_repricing_mutant_is_caught_and_the_reference_is_not_under_the_same_kill(session):
    from killpoint import chaos
    from killpoint.harness.run import RunConfig

    schedule = chaos.parse("A@charge.before_call:kill")
    mutant = session.run(RunConfig(schedule=schedule, target="mutant:reprice-on-recovery"))
    assert mutant.valid is False
    assert {v.invariant for v in mutant.verdict.violations} == {"effects_match_intent"}
    assert "amount: expected" in mutant.verdict.violations[0].detail
    reference = session.run(RunConfig(schedule=schedule))
    assert reference.valid is True
    (judged,) = [r for r in reference.verdict.results if r.invariant == "effects_match_intent"]
    assert judged.judged and "match their declared intent" in judged.detail


def _cents_worker(ctx):
    """A plain target that sends the amount in cents: what its own intent hook declares."""
    from killpoint.harness.intent import idempotency_key

    for inst in ctx.workload.instances:
        for spec in inst.steps:
            params = dict(spec.params)
            if "amount" in params:
                params["amount"] = params["amount"] * 100
            ctx.downstream.call(spec.resource, key=idempotency_key(inst.id, spec.name, spec.resource, spec.version),
                                params=params, meta={"instance": inst.id, "step": spec.name})


def _in_cents(instance, step):
    params = dict(step.params)
    if "amount" in params:
        params["amount"] = params["amount"] * 100
    return params


@pytest.mark.parametrize("hooked", [False, True])
def test_a_targets_own_intent_hook_is_what_its_effects_are_judged_against(session, hooked):
    import killpoint
    from killpoint.harness.run import RunConfig

    target = killpoint.target(points=("before_call",), owns_state=True,
                              intent=_in_cents if hooked else None)(_cents_worker)
    result = session.run(RunConfig(target=target, workload="plain"))
    (res,) = [r for r in result.verdict.results if r.invariant == "effects_match_intent"]
    if hooked:
        assert res.valid is True and res.judged
    else:  # a target that owns its state declares its intent through the hook, or not at all
        assert res.valid is True and not res.judged and not res.violations
