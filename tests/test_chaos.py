"""The failpoint grammar and the schedule text form: parse, print back, and name what is wrong."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from killpoint import chaos
from killpoint.chaos.actions import InvalidAction, parse as parse_actions
from killpoint.chaos.points import ORDERED_POINTS, POINTS


@pytest.mark.parametrize("text", [
    "kill", "pause", "hang", "off", "sleep(25)", "2*off->kill", "50%kill", "25%3*sleep(5)->hang",
    "1*pause", "3*off->2*sleep(1)->kill", "terminate", "1*terminate", "2*off->terminate",
])
def test_action_chains_print_back_exactly_as_written(text):
    assert str(parse_actions(text)) == text


def test_count_chain_moves_on_after_its_hits():
    chain = parse_actions("2*off->kill")
    assert [chain.term_for(n).action for n in (1, 2, 3, 4)] == ["off", "off", "kill", "kill"]
    assert parse_actions("1*pause").term_for(2) is None  # past the chain: nothing happens


@pytest.mark.parametrize("text, named", [
    ("explode", "explode"), ("sleep(x)", "sleep(x)"), ("kill->off", "kill"), ("0*kill", "0*kill"),
    ("150%kill", "150%kill"), ("kill(3)", "kill"), ("", "empty"),
    # Digits of other scripts: before, sleep(\u00b2) passed the check and ended the command as an
    # "infrastructure failure: ValueError" (exit 3); \u0663*kill ran as 3*kill.
    ("sleep(\u00b2)", "sleep(\u00b2)"), ("\u0663*kill", "\u0663*kill"), ("sleep(\uff15)", "sleep(\uff15)"),
    # A sleep no clock can count: before, it ran and came out unknown, blaming the target for an
    # OverflowError. A year is the most (below).
    ("sleep(31536000001)", "sleep(31536000001)"), ("sleep(99999999999999999999)", "99999999999999999999"),
])
def test_bad_action_text_is_named_in_the_error(text, named):
    with pytest.raises(InvalidAction) as err:
        parse_actions(text)
    assert named in str(err.value)
    assert "\n" not in str(err.value)


def test_the_longest_sleep_is_a_year():
    assert parse_actions("sleep(31536000000)").terms[0].arg == 31_536_000_000


def test_two_faults_at_the_same_worker_step_point_and_hit_are_refused_naming_both():
    # Only the first could ever fire: before, the run came out unknown ("never fired") as if the
    # worker had not reached the point.
    with pytest.raises(chaos.InvalidSchedule) as err:
        chaos.parse("A@charge.after_call:kill,B@charge.after_call:kill,A@charge.after_call#1:pause")
    assert "'A@charge.after_call:pause'" in str(err.value) and "'A@charge.after_call:kill'" in str(err.value)
    # another hit, another worker, another step, or a fault for any step are other places
    for text in ("A@charge.after_call:kill,A@charge.after_call#2:kill",
                 "A@charge.after_call:kill,B@charge.after_call:kill",
                 "A@charge.after_call:kill,A@reserve.after_call:kill",
                 "A@after_call:kill,A@charge.after_call:kill"):
        assert str(chaos.parse(text)) == text


def test_schedule_example_from_the_design_round_trips():
    text = "A@charge.after_call:kill,B@charge.before_commit#2:pause"
    schedule = chaos.parse(text)
    assert str(schedule) == text
    a, b = schedule.faults
    assert (a.worker, a.step, a.point, a.hit) == ("A", "charge", "after_call", 1)
    assert (b.worker, b.step, b.point, b.hit) == ("B", "charge", "before_commit", 2)


@pytest.mark.parametrize("text", ["A@charge.before_commit:terminate", "A@charge.in_db_commit#3:1*terminate",
                                  "B@before_db_commit:2*off->terminate"])
def test_terminate_and_the_db_points_round_trip(text):
    """Protects: the connection-fault grammar reads and prints back like every other fault."""
    assert str(chaos.parse(text)) == text


def test_a_fault_without_a_step_applies_at_any_step():
    fault = chaos.parse("A@after_call:kill").faults[0]
    assert fault.step is None and fault.matches("after_call", "notify") and not fault.matches("in_call", None)


@pytest.mark.parametrize("text, named", [
    ("A@charge.nonsense:kill", "nonsense"),
    ("A@charge.after_call:explode", "explode"),
    ("A@charge.after_call", "A@charge.after_call"),
    ("A@charge.after_call:kill,,", "''"),
    ("A@charge.after_call#\uff11:kill", "\uff11"),  # a fullwidth 1 was read as hit 1
])
def test_bad_schedule_text_points_at_the_bad_part(text, named):
    with pytest.raises(chaos.InvalidSchedule) as err:
        chaos.parse(text)
    assert named in str(err.value)


def test_unknown_point_error_lists_the_valid_names():
    with pytest.raises(chaos.InvalidSchedule) as err:
        chaos.parse("A@bogus:kill")
    assert all(p in str(err.value) for p in POINTS)


def test_a_target_may_declare_its_own_points():
    schedule = chaos.parse("A@ship.before_label:kill", points=POINTS | {"before_label"})
    assert schedule.faults[0].point == "before_label"


names = st.sampled_from(["A", "B", "C", "W1"])
steps = st.one_of(st.none(), st.sampled_from(["charge", "reserve", "notify"]))
terms = st.tuples(st.one_of(st.none(), st.integers(1, 99)), st.one_of(st.none(), st.integers(1, 5)),
                  st.sampled_from(["kill", "pause", "terminate", "hang", "off", "sleep(3)"]))


def _term(p, n, action):
    return (f"{p}%" if p else "") + (f"{n}*" if n else "") + action


@given(st.lists(st.tuples(names, steps, st.sampled_from(ORDERED_POINTS), st.integers(1, 4),
                          st.lists(terms, min_size=1, max_size=3)), min_size=1, max_size=4,
                unique_by=lambda f: f[:4]))  # one fault per worker, step, point and hit (above)
def test_any_schedule_text_round_trips(faults):
    parts = []
    for worker, step, point, hit, chain in faults:
        # every term but the last needs a count (else nothing after it could run)
        chain = [(p, n or 1, a) for p, n, a in chain[:-1]] + [chain[-1]]
        where = f"{step}.{point}" if step else point
        parts.append(f"{worker}@{where}{'#%d' % hit if hit != 1 else ''}:"
                     + "->".join(_term(*t) for t in chain))
    text = ",".join(parts)
    assert str(chaos.parse(text)) == text


def test_point_outside_a_harness_does_nothing():
    chaos.point("after_call")  # no failpoints installed: returns at once
    with chaos.at("order-1", "charge"):
        chaos.point("before_commit")
