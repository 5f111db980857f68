"""The public API's contract: one error base, the named errors under it, each keeping its old base."""

from __future__ import annotations

import inspect

import pytest

import killpoint
from killpoint import errors


def _named_errors() -> list[type[BaseException]]:
    return [obj for name, obj in vars(errors).items()
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj is not errors.KillpointError]


def test_every_named_error_derives_from_the_one_base_exported_as_killpoint_killpoint_error():
    assert killpoint.KillpointError is errors.KillpointError
    named = _named_errors()
    assert len(named) >= 8, named
    for cls in named:
        assert issubclass(cls, killpoint.KillpointError), cls
        assert cls.__name__ in errors.__all__, cls


@pytest.mark.parametrize("cls, builtin", [
    (errors.InvalidAction, ValueError),
    (errors.InvalidSchedule, ValueError),
    (errors.InvalidTarget, ValueError),
    (errors.InvalidStore, ValueError),
    (errors.UnknownScenario, KeyError),
    (errors.StoreError, RuntimeError),
    (errors.StoreUnavailable, RuntimeError),
    (errors.OutcomeUnknown, errors.StoreUnavailable),
    (errors.KillpointUnavailable, RuntimeError),
])
def test_each_named_error_keeps_the_builtin_base_callers_already_catch(cls, builtin):
    assert issubclass(cls, builtin)


def test_the_modules_that_raise_an_error_re_export_the_same_class():
    from killpoint import chaos, scenarios
    from killpoint.chaos import actions, schedule
    from killpoint.harness import store, targets
    from killpoint.harness.commands import options
    from killpoint.harness.store import base

    assert chaos.InvalidAction is actions.InvalidAction is errors.InvalidAction
    assert chaos.InvalidSchedule is schedule.InvalidSchedule is errors.InvalidSchedule
    assert targets.InvalidTarget is errors.InvalidTarget
    assert store.InvalidStore is errors.InvalidStore
    assert store.StoreUnavailable is base.StoreUnavailable is errors.StoreUnavailable
    assert store.OutcomeUnknown is base.OutcomeUnknown is errors.OutcomeUnknown
    assert store.StoreError is base.StoreError is errors.StoreError
    assert scenarios.UnknownScenario is errors.UnknownScenario
    assert options.BadInput is errors.BadInput
    from killpoint import plugin
    from killpoint.harness import downstream

    assert downstream.LostResponse is errors.LostResponse
    assert plugin.KillpointUnavailable is errors.KillpointUnavailable


def test_bad_input_to_the_library_raises_a_killpoint_error_naming_the_value():
    from killpoint.harness.store import check_store
    from killpoint.harness.targets import resolve
    from killpoint.scenarios import get

    cases = [
        (lambda: killpoint.parse_schedule("A@nowhere.at_all:kill"), errors.InvalidSchedule, "nowhere"),
        (lambda: killpoint.parse_schedule("A@charge.after_call:explode"), errors.InvalidSchedule, "explode"),
        (lambda: resolve("mutant:no_such_mutant"), errors.InvalidTarget, "no_such_mutant"),
        (lambda: check_store("mysql://db"), errors.InvalidStore, "mysql://db"),
        (lambda: get("no_such_story"), errors.UnknownScenario, "no_such_story"),
    ]
    for call, cls, named in cases:
        with pytest.raises(killpoint.KillpointError) as info:
            call()
        assert isinstance(info.value, cls), info.value
        assert named in str(info.value)


@pytest.mark.parametrize("fields, named", [
    ({"workers": 0}, "workers=0"),
    ({"workers": 27}, "workers=27"),
    ({"seed": "7"}, "seed='7'"),
    ({"bound_s": -1}, "bound_s=-1"),
    ({"bound_s": float("inf")}, "bound_s=inf"),
    ({"same_identity": 1.5}, "same_identity=1.5"),
    ({"timing": {"lease_ttl_ms": 200}}, "timing={'lease_ttl_ms': 200}"),
    ({"schedule": "A@charge.after_call:kill"}, "schedule='A@charge.after_call:kill'"),
    ({"workload": 3}, "workload=3"),
    ({"workload_spec": "single"}, "workload_spec='single'"),
])
def test_a_run_config_no_run_can_have_is_refused_naming_the_field(fields, named):
    # Before, RunConfig(workers=0) went as far as a run and came back unknown with "infrastructure
    # failure ... IndexError": bad input reported as the harness breaking.
    with pytest.raises(killpoint.InvalidConfig) as info:
        killpoint.RunConfig(**fields)
    assert isinstance(info.value, errors.BadInput) and isinstance(info.value, ValueError)
    assert named in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("field", ["lease_ttl_ms", "heartbeat_ms", "stuck_bound_ms", "poll_ms"])
@pytest.mark.parametrize("value", [0, -5, float("inf"), float("nan"), 1e308, 31_536_000_001, "50", True])
def test_a_timing_no_run_can_have_is_refused_naming_the_field_and_value(field, value):
    # An infinite poll period ran and came out unknown (a checker's OverflowError); a year is the most.
    with pytest.raises(killpoint.InvalidConfig, match=f"Timing\\({field}="):
        killpoint.Timing(**{field: value})
    assert killpoint.Timing(**{field: 31_536_000_000}).__dict__[field] == 31_536_000_000
    assert killpoint.Timing(**{field: 0.5}).__dict__[field] == 0.5


def test_a_session_refuses_a_bad_config_before_starting_any_process():
    with killpoint.Session() as session:
        with pytest.raises(killpoint.InvalidConfig, match="workers=0"):
            session.run(killpoint.RunConfig(schedule=killpoint.parse_schedule("A@charge.after_call:kill"),
                                            workers=0))
        # the session is still usable
        result = session.run(killpoint.RunConfig(schedule=killpoint.parse_schedule("A@charge.after_call:kill"),
                                                 workload="single"))
        assert result.valid is True


def test_a_run_config_takes_a_workload_built_in_code_as_the_fixture_does():
    # Before, RunConfig(workload=Workload(...)) got as far as a run and raised a bare
    # "TypeError: unhashable type: 'dict'" from the workload cache.
    jobs = killpoint.Workload("jobs", (killpoint.InstanceSpec("job-1", (
        killpoint.StepSpec("charge", resource="payment", params={"amount": 100}),)),),
        resources={"payment": {"legacy": False, "fencing": True}})
    config = killpoint.RunConfig(schedule=killpoint.parse_schedule("A@charge.after_call:kill"), workload=jobs)
    assert (config.workload, config.workload_spec, config.workload_name) == ("jobs", jobs, "jobs")
    with killpoint.Session() as session:
        result = session.run(config)
    assert result.valid is True
    assert {e.data["instance"] for e in result.history.events if e.kind == "claimed"} == {"job-1"}


def test_unknown_scenario_reads_as_a_sentence_not_a_quoted_key():
    from killpoint.scenarios import get

    with pytest.raises(KeyError) as info:
        get("nope")
    assert str(info.value).startswith("unknown scenario 'nope'")


def test_every_exported_name_resolves_and_every_lazy_name_is_exported():
    for name in killpoint.__all__:
        assert getattr(killpoint, name) is not None, name
    assert set(killpoint._LAZY) <= set(killpoint.__all__)
    errors_exported = {n for n in killpoint.__all__ if n in errors.__all__}
    assert errors_exported == set(errors.__all__) - {"BadInput"}  # the CLI's own error stays inside


def test_type_checkers_see_every_lazy_name_imported_from_where_it_lives():
    """killpoint imports the heavy names on first use, which a type checker cannot follow; an
    ``if TYPE_CHECKING:`` block imports them for it. Both must name the same objects."""
    import ast

    tree = ast.parse(inspect.getsource(killpoint))
    (block,) = [node for node in tree.body if isinstance(node, ast.If)
                and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"]
    seen = {(alias.asname or alias.name): (node.module, alias.name)
            for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert seen == dict(killpoint._LAZY)
