"""HTML reports: the data they are made from, their escaping, and one real report in a browser.

Most tests read the report *model* (``reports.model``: lanes, timeline items, rows), not HTML. The
HTML is read only where the page itself is the thing protected: escaping of hostile strings, loading
nothing from outside, and what a real browser shows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from typing import Any

import pytest

from killpoint import chaos
from killpoint.chaos.schedule import Schedule
from killpoint.harness.checkers.base import Result, Verdict, Violation
from killpoint.harness.cli import main
from killpoint.harness.history import History, build
from killpoint.harness.mutants import BlindCommits
from killpoint.harness.run import RunConfig, RunResult, Session
from killpoint.harness.worker import ReferenceWorker
from killpoint.reports import PagesAsTheyCome, page_names, write_reports, write_run_report
from killpoint.reports.index import build_index
from killpoint.reports.layout import LABEL_CHARS, MAX_GAP, ROW_H, WIDTH, layout, time_axis
from killpoint.reports.model import build_run
from killpoint.reports.render import ASSETS, CSP, unpacked
from killpoint.reports.timeline import build_timeline
from hang import HANG_S

MS = 1_000_000
TAKEOVER = "A@charge.after_call:1*pause"
# Would change the page if it ever ran: the browser test looks for these marks.
HOSTILE_SCRIPT = ("</script><script>document.title='PWNED'</script>"
                  "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">")
HOSTILE = ("\"'><b>quoted</b>", HOSTILE_SCRIPT, "</script><script>alert(1)</script>",
           "<svg onload=alert(1)>" + "x" * 10_000 + "</svg>")


# -- targets ----------------------------------------------------------------------------------------
class _StaleCommitter(ReferenceWorker):
    """Commits without any compare-and-set: neither the fence nor the state version is checked.

    Dropping the fence alone is not enough for a stale commit to land: the state-version check
    still refuses it, because the new lease holder's claim moved the version on.
    """

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.store = BlindCommits(self.store)


def stale_committer(ctx) -> None:
    """The violating target: journals a hostile note (as a user's worker might log exception text)."""
    ctx.journal.write("note", message=HOSTILE_SCRIPT)
    _StaleCommitter(ctx).run()


# -- hand-written histories -------------------------------------------------------------------------
def ev(t: float, process: str, kind: str, type: str = "event", **data: Any):
    return (int(t * MS), process, kind, type, data)


def takeover_history(inst: str = "order-1", worker: str = "A", params: Any = None,
                     error: str | None = None) -> History:
    """A dies inside its call (the effect applied, the answer lost); B takes over with fence 2;
    A comes back as A.2. Names are parameters so hostile ones can be put anywhere."""
    w2 = f"{worker}.2"
    return build([
        ev(0, "store", "created", instance=inst, step="charge", to_state="pending", state_version=1),
        ev(1, "harness", "spawn", worker=worker, identity=worker, pid=101),
        ev(2, worker, "start", pid=101, worker=worker),
        ev(3, worker, "claim", "invoke", op=1, instance=inst, step="charge", state_version=1),
        ev(4, "store", "claimed", instance=inst, step="charge", worker=worker, from_state="pending",
           to_state="running", state_version=2, fence=1, lease_version=1, attempt=1),
        ev(5, worker, "claim", "ok", op=1, instance=inst, step="charge", fence=1, state_version=2),
        ev(6, worker, "call", "invoke", op=2, instance=inst, step="charge", resource="payment",
           key=f"{inst}:charge:payment-v1", intent_hash="abc123", fence=1, attempt=1),
        ev(7, "downstream", "request", seq=1, resource="payment", key=f"{inst}:charge:payment-v1",
           scope=f"{inst}:charge", fence=1, intent_hash="abc123", params=params or {"amount": 100},
           meta={"instance": inst, "step": "charge", "worker": worker, "attempt": 1},
           status=200, outcome="applied", applied=True),
        ev(8, worker, "point", point="in_call", instance=inst, step="charge", hit=1, action="kill"),
        ev(9, "harness", "exit", worker=worker, pid=101, code=-9, signal="SIGKILL"),
        ev(9, worker, "call", "info", op=2, instance=inst, step="charge", resource="payment",
           fence=1, indeterminate=True),
        ev(10, "harness", "spawn", worker="B", identity="B", pid=102),
        ev(11, "B", "claim", "invoke", op=1, instance=inst, step="charge", state_version=2),
        ev(12, "store", "claimed", instance=inst, step="charge", worker="B", from_state="running",
           to_state="running", state_version=3, fence=2, lease_version=2, attempt=2),
        ev(13, "B", "claim", "ok", op=1, instance=inst, step="charge", fence=2, state_version=3),
        ev(14, "B", "call", "invoke", op=2, instance=inst, step="charge", resource="payment",
           key=f"{inst}:charge:payment-v1", intent_hash="abc123", fence=2, attempt=2),
        ev(15, "downstream", "request", seq=2, resource="payment", key=f"{inst}:charge:payment-v1",
           scope=f"{inst}:charge", fence=2, intent_hash="abc123", params=params or {"amount": 100},
           meta={"instance": inst, "step": "charge", "worker": "B", "attempt": 2},
           status=200, outcome="replay", applied=False),
        ev(16, "B", "call", "fail" if error else "ok", op=2, instance=inst, step="charge", status=200,
           error=error),
        ev(17, "B", "commit", "invoke", op=3, instance=inst, step="charge", to_state="succeeded",
           fence=2, expected_state_version=3),
        ev(18, "store", "committed", instance=inst, step="charge", worker="B", from_state="running",
           to_state="succeeded", state_version=4, fence=2, lease_version=2, attempt=2),
        ev(19, "B", "commit", "ok", op=3, instance=inst, step="charge", to_state="succeeded", fence=2),
        ev(20, "harness", "spawn", worker=w2, identity=worker, pid=103),
        ev(21, "harness", "exit", worker="B", pid=102, code=0, signal=None),
        ev(22, "harness", "exit", worker=w2, pid=103, code=0, signal=None),
    ], schedule=TAKEOVER)


@dataclasses.dataclass(frozen=True)
class TextSchedule(Schedule):
    """A schedule that reads as any text: how a hostile string reaches a report's schedule field
    (RunConfig takes only a Schedule, and the parser would refuse the text)."""

    text: str = ""

    def __str__(self) -> str:
        return self.text


def make_result(history: History, *, valid: bool | None = True, violations: tuple[Violation, ...] = (),
                schedule: Any = None, target: str = "reference", run_id: str = "run0001-s0",
                invariant: str = "stale_writes_rejected", store: str = "sqlite") -> RunResult:
    verdict = Verdict(valid, (Result(invariant, valid, True, violations, "detail"),),
                      () if valid is not None else ("a scheduled fault never fired",))
    if isinstance(schedule, str):
        schedule = TextSchedule(text=schedule)
    config = RunConfig(schedule=chaos.parse(TAKEOVER) if schedule is None else schedule, target=target,
                       store=store)
    return RunResult(config, run_id, history, verdict, {TAKEOVER: 1}, (), 3, 0.05, "")


# -- reading pages (only where the page itself is what is protected) -------------------------------
class Page(HTMLParser):
    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._in_script: dict[str, str | None] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = dict(attrs)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = None

    def handle_data(self, data):
        if self._in_script is not None:
            self.scripts.append((self._in_script, data))
        else:
            self.text.append(data)

    @property
    def all_text(self) -> str:
        return "".join(self.text)


def data_of(text: str) -> Any:
    """The verdict a page embeds for tools (plain JSON)."""
    (body,) = [body for attrs, body in Page(text).scripts if attrs.get("id") == "killpoint-data"]
    return json.loads(body)


def view_of(text: str) -> Any:
    """What a run's page gives its script to draw: the timeline, the invariants and the tables."""
    (body,) = [body for attrs, body in Page(text).scripts if attrs.get("id") == "killpoint-view"]
    return unpacked(body)


def pages(directory: str) -> dict[str, str]:
    return {name: open(os.path.join(directory, name), encoding="utf-8").read()
            for name in sorted(os.listdir(directory)) if name.endswith(".html")}


# -- the timeline model ----------------------------------------------------------------------------
def test_timeline_has_one_lane_per_worker_incarnation_then_downstream_store_harness():
    t = build_timeline(takeover_history())
    assert [lane.name for lane in t.lanes] == ["A", "B", "A.2", "downstream", "store", "harness"]
    assert t.lane("A").ended == "SIGKILL" and t.lane("B").ended == "exit 0"
    assert t.lane("A.2").identity == "A"  # the same worker id, a new process


def test_claims_are_labelled_with_their_fence_in_worker_and_store_lanes():
    t = build_timeline(takeover_history())
    (claim,) = [i for i in t.in_lane("B") if i.kind == "claim"]
    assert claim.fence == 2 and "fence 2" in claim.label and claim.status == "ok" and claim.span
    store_claims = {i.fence: i for i in t.in_lane("store") if i.kind == "claimed"}
    assert set(store_claims) == {1, 2}
    assert "B claimed" in store_claims[2].label and "fence 2" in store_claims[2].label


def test_kill_is_shown_where_it_fired_and_where_the_harness_saw_the_process_die():
    t = build_timeline(takeover_history())
    (fired,) = [i for i in t.in_lane("A") if i.kind == "point"]
    assert fired.label == "hit charge.in_call -> kill" and fired.status == "fail"
    (death,) = [i for i in t.in_lane("harness") if i.kind == "exit" and i.label.startswith("worker A ")]
    assert death.label.endswith("killed by SIGKILL")
    assert death.status == "fail" and not death.span


def test_indeterminate_operation_is_drawn_to_the_end_of_the_run():
    h = takeover_history()
    t = build_timeline(h)
    (call,) = [i for i in t.in_lane("A") if i.kind == "call"]
    assert call.indeterminate and call.status == "info" and call.span
    assert call.end == t.duration == h.events[-1].time - h.events[0].time
    assert h.events[call.end_index].type == "info"
    # a completed call ends at its completion, not at the end of the run
    (b_call,) = [i for i in t.in_lane("B") if i.kind == "call"]
    assert not b_call.indeterminate and b_call.end < t.duration


def test_pause_is_drawn_until_the_harness_resumes_the_worker():
    h = build([ev(0, "A", "point", point="after_call", instance="o", step="s", action="pause"),
               ev(1, "harness", "stop", worker="A", signal="SIGSTOP"),
               ev(5, "harness", "cont", worker="A", signal="SIGCONT"),
               ev(9, "harness", "exit", worker="A", code=0)])
    (pause,) = build_timeline(h).in_lane("A")
    assert pause.span and pause.status == "info" and (pause.start, pause.end) == (0, 5 * MS)
    # the harness notes "cont" after the signal: the worker's own next event may come first
    h = build([ev(0, "A", "point", point="after_call", instance="o", step="s", action="pause"),
               ev(4, "A", "point", point="before_receipt", instance="o", step="s", action=None),
               ev(5, "harness", "cont", worker="A", signal="SIGCONT")])
    (pause,) = build_timeline(h).in_lane("A")
    assert (pause.start, pause.end, pause.end_index) == (0, 4 * MS, 1)


def test_lease_of_a_killed_holder_is_held_until_its_death_then_runs_out_until_the_takeover():
    t = build_timeline(takeover_history())  # A claims fence 1 at 4 ms, dies at 9, B claims at 12
    a, b = sorted(t.leases, key=lambda lease: lease.fence)
    assert (a.lane, a.fence, a.start, a.held_until) == ("A", 1, 4 * MS, 9 * MS)
    assert a.how == "expired" and a.expiry == a.end == 12 * MS and not a.estimated  # the next claim bounds it
    assert (b.lane, b.fence, b.how, b.end) == ("B", 2, "released", 18 * MS) and b.expiry is None
    # with the lease's time to live, the expiry is bounded by the holder's death plus the ttl
    (a, _) = sorted(build_timeline(takeover_history(), lease_ttl_ms=1.0).leases, key=lambda x: x.fence)
    assert a.expiry == a.end == 10 * MS and a.estimated and "at most 1 ms" in a.label


def test_a_lease_renewed_before_its_holder_froze_runs_out_its_ttl_after_the_last_renewal():
    """Protects: the expiry was drawn at the freeze plus the time to live (an upper bound, said as
    "at most"), though the store recorded every renewal: A claims at 4 ms, renews at 6, is frozen at
    7; with a 10 ms lease it runs out at 16, not 17 (B claims at 30)."""
    h = build([ev(0, "store", "created", instance="o", step="s", to_state="pending", state_version=1),
               ev(4, "store", "claimed", instance="o", step="s", worker="A", fence=1, lease_version=1),
               ev(5, "A", "claim", "ok", op=1, instance="o", step="s", fence=1),
               ev(6, "store", "renewed", instance="o", step="s", worker="A", fence=1, lease_version=1),
               ev(7, "harness", "stop", worker="A", signal="SIGSTOP"),
               ev(30, "store", "claimed", instance="o", step="s", worker="B", fence=2, lease_version=2)])
    a = next(lease for lease in build_timeline(h, lease_ttl_ms=10.0).leases if lease.fence == 1)
    assert (a.held_until, a.expiry, a.end, a.estimated) == (7 * MS, 16 * MS, 16 * MS, False)
    assert "10 ms after its last renewal, by +" in a.label and "at most" not in a.label


def test_frozen_holder_resumed_before_its_lease_could_run_out_keeps_holding_it():
    h = build([ev(0, "store", "claimed", instance="o", step="s", worker="A", fence=1),
               ev(0, "A", "claim", "ok", op=1, instance="o", step="s", fence=1),
               ev(1, "harness", "stop", worker="A", signal="SIGSTOP"),
               ev(2, "harness", "cont", worker="A", signal="SIGCONT"),
               ev(5, "store", "committed", instance="o", step="s", worker="A", fence=1)])
    (lease,) = build_timeline(h, lease_ttl_ms=100.0).leases
    assert (lease.held_until, lease.end, lease.how, lease.expiry) == (5 * MS, 5 * MS, "released", None)


def test_time_axis_is_elapsed_time_with_long_gaps_drawn_short_and_marked():
    at, breaks, _ = time_axis([0, 1_000, 10 * MS, 11 * MS, 1000 * MS])
    assert at[1_000] - at[0] == ROW_H  # a burst: one row each
    assert at[10 * MS] - at[1_000] > at[11 * MS] - at[10 * MS]  # a 10 ms gap is taller than 1 ms
    assert at[1000 * MS] - at[11 * MS] == ROW_H + MAX_GAP and breaks == [(breaks[0][0], "+989.0 ms")]
    # a gap the virtual clock skipped (a 30 s lease) is drawn no taller, its length in seconds
    at, breaks, _ = time_axis([0, MS, 30_001 * MS, 30_002 * MS])
    assert at[30_001 * MS] - at[MS] == ROW_H + MAX_GAP and [b for _, b in breaks] == ["+30.0 s"]


def test_a_lease_that_ran_out_inside_a_skipped_wait_is_drawn_expiring_between_the_breaks():
    """A dies 9 ms in; its 30 s lease runs out at 30.009 s; B claims only at 30.5 s. The expiry gets
    a row of its own: after the "+30.0 s" break, before the "+491.0 ms" one, at the end of the bar."""
    h = build([ev(0, "harness", "spawn", worker="A", identity="A", pid=1),
               ev(4, "store", "claimed", instance="o", step="s", worker="A", fence=1),
               ev(5, "A", "claim", "ok", op=1, instance="o", step="s", fence=1),
               ev(9, "harness", "exit", worker="A", pid=1, code=-9, signal="SIGKILL"),
               ev(30_500, "store", "claimed", instance="o", step="s", worker="B", fence=2),
               ev(30_501, "harness", "exit", worker="B", pid=2, code=0, signal=None)])
    t = build_timeline(h, lease_ttl_ms=30_000.0)
    a = next(lease for lease in t.leases if lease.fence == 1)
    assert (a.held_until, a.expiry, a.end, a.estimated) == (9 * MS, 30_009 * MS, 30_009 * MS, True)
    drawn = layout(t)
    (first, second) = drawn.breaks
    assert (first[1], second[1]) == ("+30.0 s", "+491.0 ms")
    (bar,) = [b for b in drawn.leases if b.lease.fence == 1]
    assert bar.y + bar.held_h < first[0] < bar.expiry_y < second[0]
    assert bar.expiry_y == bar.y + bar.held_h + bar.out_h  # the hatched part ends where it expired
    assert "+30.009000 s" in {label for _, label in drawn.rows}


def test_timeline_fits_the_design_width_and_scales_down_when_there_are_many_lanes():
    assert layout(build_timeline(takeover_history())).width <= WIDTH
    many = build([ev(n, f"W{n}", "recover", instance="o", step="s", action="retry") for n in range(20)])
    wide = layout(build_timeline(many))
    assert wide.width > WIDTH and all(len(m.text) <= LABEL_CHARS for m in wide.marks)
    # a narrow lane's heading drops what does not fit rather than running into the next lane
    boxes = layout(build_timeline(takeover_history())).lanes
    assert [b.head for b in boxes][:2] == ["A \u00b7 pid 101 \u00b7 SIGKILL", "B \u00b7 pid 102 \u00b7 exit 0"]
    assert all(len(b.head) * 7.4 <= wide.lane_w for b in layout(build_timeline(many)).lanes)


def test_every_timeline_item_and_proof_links_to_a_row_of_the_event_table():
    h = takeover_history()
    proof = Violation("stale_writes_rejected", "order-1", "charge", "stale", events=(4, 12, 18))
    report = build_run(make_result(h, valid=False, violations=(proof,)))
    rows = {row.link for row in report.events}
    assert report.timeline.items and all(item.link in rows for item in report.timeline.items)
    (view,) = report.violations
    assert [ref.link for ref in view.events] == ["e4", "e12", "e18"]
    assert all(ref.link in rows for ref in view.events)
    assert {i.index for i in report.timeline.items if i.proof} >= {4, 12, 18}
    assert view.reproduce.startswith("killpoint replay ") and TAKEOVER in view.reproduce


def test_ledger_rows_carry_key_intent_hash_fence_and_outcome():
    report = build_run(make_result(takeover_history()))
    assert [(r.key, r.intent_hash, r.fence, r.outcome, r.applied) for r in report.ledger] == [
        ("order-1:charge:payment-v1", "abc123", 1, "applied", True),
        ("order-1:charge:payment-v1", "abc123", 2, "replay", False)]


def test_cap_renders_the_first_events_plus_every_proof_and_says_showing_n_of_m(tmp_path):
    h = build([ev(n, "store", "created", instance=f"o{n}", step="s") for n in range(60)])
    proof = Violation("terminates", "o55", "s", "never finished", events=(55,))
    result = make_result(h, valid=False, violations=(proof,), invariant="terminates")
    report = build_run(result, max_events=10)
    assert [row.index for row in report.events] == list(range(10)) + [55]
    assert (report.shown, report.total) == (11, 60) and report.cap_note == "showing 11 of 60 events"
    # the timeline follows the instance the violation names; the table keeps the cap's events
    assert report.timeline.focus == ("o55",) and {i.index for i in report.timeline.items} == {55}
    path = write_run_report(result, str(tmp_path / "run.html"), max_events=10)
    assert "showing 11 of 60 events" in Page(open(path, encoding="utf-8").read()).all_text


def test_index_puts_violated_runs_first_and_offers_a_filter_per_violated_invariant():
    h = takeover_history()
    ok = make_result(h, run_id="ok")
    bad = make_result(h, valid=False, run_id="bad",
                      violations=(Violation("stale_writes_rejected", "order-1", "charge", "stale"),))
    unknown = make_result(h, valid=None, run_id="unknown")
    index = build_index([ok, unknown, bad], ["1.html", "2.html", "3.html"], title="t")
    assert [r.run_id for r in index.rows] == ["bad", "unknown", "ok"]
    assert index.verdict == "violated"
    assert [(f.invariant, f.runs) for f in index.filters] == [("stale_writes_rejected", 1)]
    assert index.rows[0].slots == (index.filters[0].slot,) and index.rows[2].slots == ()
    assert index.rows[0].href == "3.html" and "killpoint replay" in index.rows[0].reproduce


def test_pages_as_they_come_hold_valid_runs_until_one_fails_then_write_each_as_its_run_ends(tmp_path):
    """A matrix writes each page as its run ends instead of keeping every history to its end (they
    grew the process by 60 MiB, which every forked worker paid for). With --report on-failure the
    valid runs are held until one is not valid: then their pages are written, and each later one
    as it comes; the index links them all."""
    h = takeover_history()
    bad = Violation("stale_writes_rejected", "order-1", "charge", "stale", events=(4, 12))
    runs = [make_result(h, run_id="run0001-s0-00000001"), make_result(h, run_id="run0002-s0-00000002"),
            make_result(h, valid=False, violations=(bad,), run_id="run0003-s0-00000003"),
            make_result(h, run_id="run0004-s0-00000004")]
    pages = PagesAsTheyCome(str(tmp_path), title="t", always=False)
    written = lambda: sorted(p for p in os.listdir(tmp_path) if p.startswith("run"))  # noqa: E731
    pages.add(runs[0])
    pages.add(runs[1])
    assert written() == [] and len(pages.held) == 2  # not known to be wanted yet
    pages.add(runs[2])
    assert written() == [f"run000{n}-s0-0000000{n}.html" for n in (1, 2, 3)] and pages.held == []
    pages.add(runs[3])  # wanted now: written as it comes
    assert len(written()) == 4 and pages.written == 4
    index = pages.finish(runs, pages=True)
    assert [row.href for row in build_index(runs, pages.hrefs, title="t").rows] == [
        "run0003-s0-00000003.html", "run0001-s0-00000001.html", "run0002-s0-00000002.html",
        "run0004-s0-00000004.html"]
    assert all(f'href="{name}"' in open(index, encoding="utf-8").read() for name in written())


def test_pages_as_they_come_write_the_index_alone_when_every_run_stays_valid(tmp_path):
    h = takeover_history()
    runs = [make_result(h, run_id=f"run000{n}-s0-0000000{n}") for n in (1, 2)]
    pages = PagesAsTheyCome(str(tmp_path), title="t", always=False)
    for run in runs:
        pages.add(run)
    pages.finish(runs, pages=False)
    assert sorted(os.listdir(tmp_path)) == ["index.html", "killpoint.css", "killpoint.js"] and pages.held == []
    # --report always: each page as its run is added
    always = PagesAsTheyCome(str(tmp_path / "always"), title="t", always=True)
    always.add(runs[0])
    assert os.listdir(tmp_path / "always") != [] and always.written == 1


def test_store_password_never_reaches_a_report_artefact(tmp_path):
    result = make_result(takeover_history(), store="postgresql://kp:s3cret@db.example/test")
    report = build_run(result)
    assert "s3cret" not in report.banner.store and "s3cret" not in report.banner.reproduce
    assert "postgresql://kp:***@db.example/test" in report.banner.reproduce
    index = write_reports([result], str(tmp_path), title="t")
    assert all("s3cret" not in text for text in pages(os.path.dirname(index)).values())


# -- escaping and self-containment -----------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory) -> str:
    """Reports of runs whose every run-controlled string is hostile."""
    out = str(tmp_path_factory.mktemp("hostile"))
    results = []
    for bad in HOSTILE:
        h = takeover_history(inst=bad, worker=bad, params={"name": bad, bad: 1}, error=bad)
        v = Violation(bad, bad, bad, bad, events=(4, 12))
        results.append(make_result(h, valid=False, violations=(v,), schedule=bad, target=bad,
                                   run_id=bad, invariant=bad))
    write_reports(results, out, title=HOSTILE_SCRIPT)
    return out


def test_hostile_strings_from_a_run_come_out_as_text_never_as_markup(hostile_dir):
    files = pages(hostile_dir)
    # a run id that is no plain file name gets a page named by its position
    assert set(files) == {"index.html"} | set(page_names(list(HOSTILE))) == \
        {"index.html"} | {f"run-000{n}.html" for n in range(1, len(HOSTILE) + 1)}
    allowed_meta = {"charset", "http-equiv", "name"}
    for name, text in files.items():
        page = Page(text)
        for tag, attrs in page.tags:
            assert tag not in ("img", "iframe", "object", "embed", "base", "form", "b"), (name, tag)
            assert not any(a.startswith("on") for a in attrs), (name, tag, attrs)
            if tag == "meta":
                assert set(attrs) & allowed_meta, attrs
            if tag == "script":  # inert data blocks, and the folder's own script
                assert attrs in ({"type": "application/json", "id": "killpoint-data"},
                                 {"type": "application/gzip", "id": "killpoint-view"},
                                 {"src": "killpoint.js", "defer": None}), attrs
            if tag == "link":
                assert attrs == {"rel": "stylesheet", "href": "killpoint.css"}, attrs
        # each run's hostile string is in its page, as text (the index has the title)
        expected = HOSTILE_SCRIPT if name == "index.html" else HOSTILE[int(name[4:8]) - 1]
        assert expected in page.all_text, name
        assert "<script>alert" not in text and "<img src=x" not in text and "<svg onload" not in text
        for attrs, body in page.scripts:  # the view is base64, which nothing reads as markup
            if attrs.get("id") == "killpoint-view":
                assert re.fullmatch(r"[A-Za-z0-9+/=]+", body), name


def test_embedded_json_escapes_angle_brackets_and_ampersands_and_round_trips(hostile_dir):
    for name, text in pages(hostile_dir).items():
        (body,) = [body for attrs, body in Page(text).scripts if attrs.get("id") == "killpoint-data"]
        assert "<" not in body and ">" not in body and "&" not in body
        data = json.loads(body)
        if name == "run-0002.html":
            assert data["schedule"] == HOSTILE_SCRIPT
            assert data["violations"][0]["instance"] == HOSTILE_SCRIPT
            # the view keeps the hostile strings whole, as data the script sets as text
            view = view_of(text)
            assert HOSTILE_SCRIPT[:59] + "\u2026" in view["words"]  # the instance column, clipped
            assert any("</script><script>document.title='PWNED'" in row[8] for row in view["events"])
        if name == "index.html":
            assert data["title"] == HOSTILE_SCRIPT


def test_ten_kilobyte_names_are_clipped_on_the_timeline_but_kept_whole_in_the_data(hostile_dir):
    long_name = HOSTILE[3]
    report = build_run(make_result(takeover_history(inst=long_name, worker=long_name)))
    assert any(long_name in item.label for item in report.timeline.items)  # the model keeps it whole
    marks = layout(report.timeline).marks
    assert marks and all(len(m.text) <= LABEL_CHARS for m in marks)
    text = pages(hostile_dir)["run-0004.html"]
    assert len(text) < 2_000_000
    assert data_of(text)["violations"][0]["instance"] == long_name


def _external(value: str) -> bool:
    return bool(re.match(r"^\s*([a-z][a-z0-9+.-]*:|//)", value, re.I))


def test_reports_load_and_link_nothing_outside_themselves(hostile_dir, violated_reports):
    # The policy: the folder's own stylesheet and script, no inline script, nothing from outside.
    policy = dict(part.strip().split(" ", 1) for part in CSP.split(";"))
    assert policy["default-src"] == "'none'" and policy["script-src"] == "'self'"
    assert "http" not in CSP and "*" not in CSP and "data:" not in CSP
    for directory in (hostile_dir, violated_reports["dir"]):
        assert set(ASSETS) <= set(os.listdir(directory))
        script = open(os.path.join(directory, "killpoint.js"), encoding="utf-8").read()
        css = open(os.path.join(directory, "killpoint.css"), encoding="utf-8").read()
        # The script writes text and attributes only: nothing it draws is parsed as markup, and it
        # reaches nothing outside the page. Its one address is the SVG namespace's name.
        for word in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(",
                     "fetch(", "XMLHttpRequest", "import(", "WebSocket", "setAttribute(\"on", "javascript:"):
            assert word not in script, word
        assert re.findall(r"https?://[^\s\"']*", script) == ["http://www.w3.org/2000/svg"]
        assert "url(" not in css and "@import" not in css and "http" not in css
        for name, text in pages(directory).items():
            page = Page(text)
            assert "http://" not in text and "https://" not in text, name
            for tag, attrs in page.tags:
                for attr in ("src", "href", "xlink:href", "action", "srcset", "data"):
                    value = attrs.get(attr)
                    assert value is None or not _external(value), (name, tag, attr, value)
            metas = [a for t, a in page.tags if t == "meta" and a.get("http-equiv")]
            assert metas == [{"http-equiv": "Content-Security-Policy", "content": CSP}]
            assert "url(" not in text and "@import" not in text


# -- end to end: a real violating run ----------------------------------------------------------------
@pytest.fixture(scope="module")
def violated_reports(tmp_path_factory) -> dict[str, Any]:
    out = str(tmp_path_factory.mktemp("violated"))
    with Session() as session:
        result = session.run(RunConfig(target=stale_committer, schedule=chaos.parse(TAKEOVER)))
    index = write_reports([result], out, title="killpoint test")
    return {"dir": out, "index": index, "result": result}


def test_violating_run_gives_an_index_and_run_report_naming_the_invariant(violated_reports):
    result = violated_reports["result"]
    assert result.valid is False
    assert violated_reports["index"] == os.path.join(violated_reports["dir"], "index.html")
    report = build_run(result)
    assert report.banner.verdict == "violated"
    assert "stale_writes_rejected" in report.banner.violated
    (stale,) = [v for v in report.violations if v.invariant == "stale_writes_rejected"]
    assert stale.instance == "order-1" and stale.step == "charge" and stale.events
    assert {lane.name for lane in report.timeline.lanes} >= {"A", "B", "downstream", "store", "harness"}
    files = pages(violated_reports["dir"])
    (page,) = page_names([result.run_id])
    assert page == f"{result.run_id}.html"  # the page is named after its run
    for name in ("index.html", page):
        assert "stale_writes_rejected" in Page(files[name]).all_text, name
    assert f'href="{page}"' in files["index.html"] and result.run_id in Page(files["index.html"]).all_text


def test_reports_of_many_runs_keep_the_focus_instances_and_stay_small(violated_reports, tmp_path):
    result = violated_reports["result"]
    whole = build_run(result)
    focused = build_run(result, focus_table=True)
    assert whole.shown == whole.total and focused.focus == ("order-1",)
    assert focused.shown < focused.total and "showing" in focused.cap_note
    assert all(row.instance in ("", "order-1") for row in focused.events)
    index = write_reports([result] * 4, str(tmp_path), title="t")
    names = page_names([result.run_id] * 4)
    assert len(set(names)) == 4  # one id four times still gives four pages
    sizes = [os.path.getsize(os.path.join(tmp_path, name)) for name in names]
    # 68 runs must fit in 2 MB with their index and the shared files: well under 25 kB a run
    assert max(sizes) < 25_000, sizes
    page = Page(open(os.path.join(tmp_path, names[0]), encoding="utf-8").read()).all_text
    assert "--report-dir DIR" in page and os.path.getsize(index) < 20_000


def test_a_virtual_time_run_breaks_its_axis_at_the_skipped_lease_and_keeps_every_event_in_order(
        violated_reports):
    """On the virtual clock a pause past the 30 s lease is 30 s of run time in no wall time: the
    timeline draws it as one broken gap labelled with that run time, every event keeps its order
    across the break, A's lease runs out across it, and the page says the times are the run's."""
    result = violated_reports["result"]
    assert result.config.virtual_time and result.config.timing.lease_ttl_ms == 30_000
    report = build_run(result)
    drawn = layout(report.timeline)
    long = [(y, label) for y, label in drawn.breaks if label.endswith(" s")]
    assert len(long) == 1, drawn.breaks  # the lease is the one long wait of this run
    y_break, label = long[0]
    assert re.fullmatch(r"\+\d+\.\d s", label) and 20 <= float(label[1:-2]) <= 31, label
    assert result.duration_s < float(label[1:-2])  # ... and it cost far less wall time than that
    # Every mark in the order of its event: down the page as the run's time goes on, and the marks
    # above the break are exactly those before the skipped wait.
    marks = sorted(drawn.marks, key=lambda m: (m.item.start, m.item.index))
    assert [m.y for m in marks] == sorted(m.y for m in marks)
    before = [m.item.start for m in drawn.marks if m.y < y_break]
    after = [m.item.start for m in drawn.marks if m.y > y_break]
    assert before and after and min(after) - max(before) >= 20 * 1000 * MS
    # A's lease (fence 1) is held, then runs out across the break; its expiry is drawn after it.
    (a,) = [b for b in drawn.leases
            if (b.lease.instance, b.lease.step, b.lease.fence) == ("order-1", "charge", 1)]
    assert a.lease.how == "expired" and a.y < y_break < a.y + a.held_h + a.out_h
    assert a.expiry_y is not None and y_break < a.expiry_y <= a.y + a.held_h + a.out_h
    assert any(label.endswith(" s") for _, label in drawn.rows)  # rows past 10 s read in seconds
    # The page says what the times are, and draws the break with its label.
    assert report.banner.virtual and report.banner.run_time.endswith(" s")
    text = open(os.path.join(violated_reports["dir"], f"{result.run_id}.html"), encoding="utf-8").read()
    assert [y_break, label] in view_of(text)["timeline"]["breaks"]  # what the page's script draws
    page = Page(text)
    assert "of run time on the virtual clock" in page.all_text and "cost no wall time" in page.all_text


def test_report_command_runs_one_schedule_writes_its_report_and_exits_1(tmp_path, capsys):
    out = str(tmp_path / "rep")
    code = main(["report", "--schedule", TAKEOVER, "--target", f"{__name__}:stale_committer",
                 "--report-dir", out, "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["valid"] is False
    assert data["report"] == os.path.join(out, "index.html") and os.path.exists(data["report"])
    assert "stale_writes_rejected" in {v["invariant"] for v in data["violations"]}
    (page,) = [name for name in os.listdir(out) if name.startswith("run0")]
    assert data["results"][0]["run_id"] + ".html" == page
    assert "stale_writes_rejected" in Page(open(os.path.join(out, page), encoding="utf-8").read()).all_text


def test_report_command_refuses_a_bad_schedule_with_one_line_naming_it(capsys):
    code = main(["report", "--schedule", "A@@nonsense"])
    err = capsys.readouterr().err
    assert code == 2 and "A@@nonsense" in err and len(err.strip().splitlines()) == 1


# -- a real browser ----------------------------------------------------------------------------------
def _chromium() -> str:
    """The browser: $KILLPOINT_CHROMIUM, else Debian's ``chromium``; a skip (a failure where required)."""
    found = (os.environ.get("KILLPOINT_CHROMIUM") or shutil.which("chromium")
             or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None))
    if found is None:
        reason = "no chromium found (Debian: apt-get install -y chromium; or set KILLPOINT_CHROMIUM)"
        if os.environ.get("KILLPOINT_REQUIRE_BROWSER") == "1":
            pytest.fail(f"KILLPOINT_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return found


def dump_dom(chromium: str, path: str, profile: str) -> str:
    """The page's document once it has loaded and its script has drawn (the budget lets the
    script's asynchronous unpacking of its data finish before the dump)."""
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--virtual-time-budget=10000", "--dump-dom", "file://" + os.path.abspath(path)],
        capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_real_report_in_headless_chromium_shows_the_violation_and_runs_no_hostile_script(
        violated_reports, tmp_path):
    chromium = _chromium()
    result = violated_reports["result"]
    dom = dump_dom(chromium, os.path.join(violated_reports["dir"], f"{result.run_id}.html"),
                   str(tmp_path / "profile"))
    assert "stale_writes_rejected" in dom and 'class="violation"' in dom
    # the shared script drew the timeline, the invariants and the tables from the page's data
    assert re.search(r'<html[^>]* data-drawn="1"', dom) and "needs-js" not in dom
    (stale,) = [v for v in build_run(result).violations if v.invariant == "stale_writes_rejected"]
    for ref in stale.events:  # each proof has its row in the event table, and its mark
        assert f'<tr class="proof" id="e{ref.index}">' in dom, ref
    assert 'class="mk ' in dom and "proof" in dom and "\u22ee +" in dom  # marks, a proof, an axis break
    assert "<code>stale_writes_rejected</code>" in dom  # the invariants table
    assert "No requests." not in dom and '<a href="#e' in dom  # the ledger links its events
    title = re.search(r"<head>.*?<title>(.*?)</title>", dom, re.S).group(1)  # the document's own
    assert "PWNED" not in title and title.startswith("killpoint violated")
    (body,) = re.findall(r"<body[^>]*>", dom)
    assert "data-pwned" not in body
    # the hostile note the worker journaled is on the page, as inert text (the event table's data)
    assert "&lt;/script&gt;&lt;script&gt;document.title='PWNED'" in dom
    assert "<script>document.title" not in dom and "<img" not in dom


def _probed(tmp_path, probe: str, page: str) -> str:
    """Load ``page`` (in ``tmp_path``) in headless Chromium through ``probe`` (a page that frames it
    at 1280 px and writes what it measured into ``<pre id="out">``); that text."""
    chromium = _chromium()
    (tmp_path / "probe.html").write_text(probe.replace("REPORT", page), encoding="utf-8")
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--allow-file-access-from-files", "--virtual-time-budget=10000", "--window-size=1300,900",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", (tmp_path / "probe.html").as_uri()],
        capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return re.search(r'<pre id="out">(.*?)</pre>', proc.stdout, re.S).group(1)


# A run's page draws its timeline and tables once its script has unpacked its data: the probes wait
# for that (data-drawn on its root) before they measure.
WHEN_DRAWN = """
var f = document.getElementById('f');
function drawn(then) {
  var d = f.contentDocument;
  if (d && d.getElementById('killpoint-view') && !d.documentElement.getAttribute('data-drawn')) {
    setTimeout(function () { drawn(then); }, 20);
  } else {
    then.call(f);
  }
}
"""

PROBE = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="REPORT" style="width:1280px;height:800px;border:0"></iframe><pre id="out">pending</pre>
<script>""" + WHEN_DRAWN + """
f.addEventListener('load', function () { drawn(function () {
  var d = this.contentDocument, de = d.documentElement, box = d.querySelector('.tl-scroll');
  var proof = d.querySelector('svg.tl a.proof[id]'), r = box.getBoundingClientRect();
  var p = proof ? proof.getBoundingClientRect() : null;
  document.getElementById('out').textContent = JSON.stringify({
    page: [de.scrollWidth, de.clientWidth], timeline: [box.scrollWidth, box.clientWidth],
    top: d.getElementById('timeline').getBoundingClientRect().top, height: this.contentWindow.innerHeight,
    proof: p && [p.top, p.bottom], box: [r.top, r.bottom],
    expiries: d.querySelectorAll('svg.tl .lease path.expiry').length,
    leases: d.querySelectorAll('svg.tl .lease rect.held').length});
}); });
</script></body></html>"""


def test_report_at_1280_px_has_no_sideways_scroll_draws_lease_expiry_and_opens_at_the_violation(
        violated_reports, tmp_path):
    """Measured by a real browser: a probe page loads the report in a 1280-pixel frame and reads its
    layout (the page is copied with the folder's shared files, as a report folder is copied whole)."""
    shutil.copy(os.path.join(violated_reports["dir"], f"{violated_reports['result'].run_id}.html"),
                tmp_path / "run.html")
    for name in ASSETS:
        shutil.copy(os.path.join(violated_reports["dir"], name), tmp_path / name)
    m = json.loads(_probed(tmp_path, PROBE, "run.html").replace("&quot;", '"'))
    assert m["page"][0] <= m["page"][1], m  # no horizontal scroll of the page
    assert m["timeline"][0] <= m["timeline"][1], m  # nor inside the timeline: every lane is in view
    assert m["leases"] >= 2 and m["expiries"] >= 1, m  # A's lease ran out, B took over
    assert m["top"] < m["height"], m  # the timeline starts on the first screen
    assert m["proof"] and m["box"][0] <= m["proof"][0] < min(m["box"][1], m["height"]), m


TARGET_PROBE = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="REPORT" style="width:1280px;height:800px;border:0"></iframe><pre id="out">pending</pre>
<script>""" + WHEN_DRAWN + """
f.addEventListener('load', function () { drawn(function () { setTimeout(function () {
  var d = f.contentDocument, row = d.querySelector('tr:target'), r = row && row.getBoundingClientRect();
  document.getElementById('out').textContent = JSON.stringify({target: row && row.id, top: r && r.top,
    height: f.contentWindow.innerHeight});
}, 50); }); });
</script></body></html>"""


def test_a_link_to_an_event_opens_the_page_at_its_row_though_the_script_draws_the_table(
        violated_reports, tmp_path):
    """The index links each violation's events as page#eN; the rows are drawn by the page's script
    after the browser looked for the target, so the script follows the link again: the row is in
    view and is the :target the style marks."""
    result = violated_reports["result"]
    for name in (f"{result.run_id}.html", *ASSETS):
        shutil.copy(os.path.join(violated_reports["dir"], name), tmp_path / name)
    (stale,) = [v for v in build_run(result).violations if v.invariant == "stale_writes_rejected"]
    link = stale.events[-1].link
    m = json.loads(_probed(tmp_path, TARGET_PROBE, f"{result.run_id}.html#{link}").replace("&quot;", '"'))
    assert m["target"] == link and 0 <= m["top"] < m["height"], m


INDEX_PROBE = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="REPORT" style="width:1280px;height:800px;border:0"></iframe><pre id="out">pending</pre>
<script>""" + WHEN_DRAWN + """
f.addEventListener('load', function () { drawn(function () {
  var de = this.contentDocument.documentElement;
  document.getElementById('out').textContent = JSON.stringify([de.scrollWidth, de.clientWidth]);
}); });
</script></body></html>"""


def test_a_pytest_sessions_index_at_1280_px_has_no_sideways_scroll(violated_reports, tmp_path):
    """The index of a pytest session has a column of test ids; with ids as long as a real suite's
    (a class, a parametrized id), the runs table was wider than a 1280-pixel window (its cells
    wrapped only at spaces, and a node id, a schedule or a target has none), so the page scrolled
    sideways. Measured by a real browser, as the run report is above."""
    result = violated_reports["result"]
    tests = ["tests/integration/payments/test_checkout_recovery.py::TestCheckoutRecovery::"
             f"test_every_crash_point_is_recovered_without_a_second_charge[charge.{point}-pause]"
             for point in ("after_call", "before_commit")]
    write_reports([result, result], str(tmp_path), title="killpoint: pytest session", tests=tests)
    scroll, client = json.loads(_probed(tmp_path, INDEX_PROBE, "index.html"))
    assert scroll <= client, (scroll, client)


def test_a_run_report_with_long_unbroken_names_at_1280_px_has_no_sideways_scroll(tmp_path):
    """An instance name with no space in it (a user's workload names them) reached the downstream
    ledger's key column whole: the table, and the page, were 1965 px wide in a 1280-pixel window."""
    result = make_result(takeover_history(inst="order-" + "x" * 180), valid=False, violations=(
        Violation("stale_writes_rejected", "order-" + "x" * 180, "charge", "stale"),))
    write_run_report(result, str(tmp_path / "run.html"))
    scroll, client = json.loads(_probed(tmp_path, INDEX_PROBE, "run.html"))
    assert scroll <= client, (scroll, client)
