"""What a command writes besides its result, and how it ends: progress on stderr, the HTML reports
and JUnit XML, the ``--stats`` table, the verdict printed (text or JSON) and the exit code.

A report or a file that cannot be written never hides the verdict: the command says so on stderr
and exits with the code its runs earned.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Mapping, Sequence

from killpoint import vocab
from killpoint.errors import BadInput, shown
from killpoint.harness.colour import Colour
from killpoint.harness.commands.summary import Summary, replay_command
from killpoint.harness.run import RunResult
from killpoint.harness.stats import total as total_stats


class Progress:
    """The commands' progress (:class:`harness.progress.Progress`, on stderr), fed by ``step``:
    called with a label as a run starts, and with its result when it ended."""

    def __init__(self, total: int | None, enabled: bool = True, *, title: str = "killpoint") -> None:
        from killpoint.harness.progress import Progress as Display

        self.display = Display(total, title=title, quiet=not enabled)

    def step(self, label: str, result: RunResult | None = None) -> None:
        if result is None:
            self.display.started(label)
        else:
            self.display.finished(result, label)

    def close(self) -> None:
        self.display.close()


def progress_for(args: argparse.Namespace, total: int | None, title: str) -> Progress:
    """Progress of a command's runs, on stderr whatever stdout is; off with ``--quiet``. Called as
    the runs start, so it also readies ``--report-dir`` (:func:`prepare_report_dir`)."""
    prepare_report_dir(args)
    return Progress(total, not getattr(args, "quiet", False), title=title)


def write_reports(args: argparse.Namespace, summary: Summary, title: str) -> None:
    """Write the HTML index and run reports when asked, then the JUnit XML when asked."""
    write_html(args, summary, title)
    write_junit(args, summary, title)


def write_junit(args: argparse.Namespace, summary: Summary, title: str) -> None:
    """``--junit-xml PATH``: one test case per run, linking each run's report when one was written."""
    path = getattr(args, "junit_xml", None)
    if not path:
        return
    from killpoint.reports import page_names

    reports = None
    if summary.report and summary.report_pages:
        where = os.path.dirname(summary.report)
        reports = [os.path.join(where, name) for name in page_names([r.run_id for r in summary.results])]
    summary.junit_error = write_junit_file(path, summary.results, suite=title, reproduce=replay_command,
                                           reports=reports)


def write_junit_file(path: str, results: Sequence[RunResult], **kwargs: Any) -> str | None:
    """Write the JUnit XML after the runs; a file that cannot be written (the path was checked at
    the start, by :func:`check_junit_xml`, but the disk filled or the folder went meanwhile) is a
    warning on stderr, never an error that hides the verdict the runs earned: returns why, or None."""
    from killpoint.reports import junit

    try:
        junit.write(path, results, **kwargs)
    except OSError as exc:
        why = f"--junit-xml {shown(path)}: cannot write it there ({exc.strerror or exc})"
        print(f"killpoint: warning: {why}; the verdict stands", file=sys.stderr)
        return why
    return None


def check_junit_xml(args: argparse.Namespace) -> None:
    """Before the first run, as ``--report-dir`` is checked: refuse a ``--junit-xml`` path that no
    file can be written to (:func:`killpoint.reports.files.check_file_path`), rather than find out
    after every run has been made."""
    path = getattr(args, "junit_xml", None)
    if path is not None and not path.strip():  # before: no file, and no word of it
        raise BadInput(f"--junit-xml {shown(path)}: name the file to write, or leave --junit-xml out")
    if path:
        from killpoint.reports.files import check_file_path

        check_file_path(path, "--junit-xml")


def print_stats(summary: Summary) -> None:
    """``--stats``: the points that fired in each run, then the table over all of them."""
    from killpoint.harness.stats import brief

    stats = summary.point_stats()
    print("\ncrash points fired, per run:")
    for n, (r, s) in enumerate(zip(summary.results, stats), start=1):
        print(f"  {n:>4}. {r.config.schedule or 'no faults'}: {brief(s)}")
    both = total_stats(stats)
    print(f"\ncrash points over {both.runs} run(s), {both.total_fired} fired:")
    for line in both.lines():
        print(f"  {line}")


def report_hint(args: argparse.Namespace, summary: Summary) -> str | None:
    """What to say when a run failed and no report was written: how to get one."""
    if summary.valid is True or summary.report or getattr(args, "report", None) == "never":
        return None
    if getattr(args, "report_dir", None):  # given, and the reports could not be written there: said already
        return None
    return "no HTML report written: add --report-dir DIR to get one for each failing run"


def print_json_hint(args: argparse.Namespace, summary: Summary) -> None:
    """With ``--json``, :func:`report_hint` goes to stderr, as progress and warnings do: standard
    output carries the JSON object alone. ``--quiet`` silences it there, as it silences the closing
    line."""
    hint = None if getattr(args, "quiet", False) else report_hint(args, summary)
    if hint:
        print(f"killpoint: {hint}", file=sys.stderr)


def _report_dir(args: argparse.Namespace) -> str | None:
    where = getattr(args, "report_dir", None)
    return None if where is None or getattr(args, "report", "on-failure") == "never" else where


def check_report_dir(args: argparse.Namespace) -> None:
    """Before the command reads anything else: refuse a ``--report-dir`` that cannot take its
    reports (bad input) -- a file, a place that cannot be written, or a directory holding an
    ``index.html`` that killpoint did not write (a user's own page is never replaced). Changes
    nothing: a command refused for another bad value leaves an earlier command's reports alone."""
    where = _report_dir(args)
    if where is not None:
        from killpoint.reports.files import check_report_path

        check_report_path(where)


def prepare_report_dir(args: argparse.Namespace) -> None:
    """As the command's first run starts (its other values read and accepted): make
    ``--report-dir``, and clear the pages an earlier command left there, so the directory shows
    this command's runs only. Once per command; refused as :func:`check_report_dir` refuses."""
    where = _report_dir(args)
    if where is None or getattr(args, "_report_dir_ready", False):
        return
    args._report_dir_ready = True
    check_report_dir(args)
    from killpoint.reports.files import claim_report_dir, clear_earlier_pages

    try:
        clear_earlier_pages(where)  # a pytest session's pages too (gw0-run-0001.html under xdist)
        claim_report_dir(where)
    except OSError as exc:
        raise BadInput(f"--report-dir {shown(where)}: cannot write reports there "
                       f"({exc.strerror or exc})") from None


def stream_pages(args: argparse.Namespace, summary: Summary, title: str, *, many: bool = True) -> None:
    """Have ``summary`` write each run's report page as the run is added (when ``--report-dir`` and
    ``--report`` ask for pages), rather than keep every run's history for :func:`write_html` at the
    end. Called once the report directory is ready (:func:`progress_for`)."""
    where = _report_dir(args)
    if where is None:
        return
    from killpoint.reports import PagesAsTheyCome

    summary.pages = PagesAsTheyCome(where, title=title, always=args.report == "always", many=many)


def write_html(args: argparse.Namespace, summary: Summary, title: str) -> None:
    """The HTML index and run reports, when ``--report-dir`` and ``--report`` ask for them (the
    pages not written yet, when the runs' pages were written as they came: see
    :func:`stream_pages`).

    A report that cannot be written never hides the verdict: the command says so on stderr and
    goes on to print its verdict and exit with its code."""
    if args.report == "never" or args.report_dir is None:
        return
    # Every run valid and pages only on failure: the index alone, which says what ran and how each
    # verdict came out (a folder holding only a marker said nothing).
    pages = not (args.report == "on-failure" and summary.valid is True)
    from killpoint.reports import write_reports as write

    streamed = summary.pages
    left = len(streamed.held) if streamed is not None else len(summary.results)
    progress = _PageProgress(left if pages else 0, args.report_dir, quiet=bool(getattr(args, "quiet", False)),
                             before=streamed.written if streamed is not None else 0)
    try:
        prepare_report_dir(args)  # done already where the command's runs started
        if streamed is not None:
            summary.report = streamed.finish(summary.results, pages=pages, on_page=progress.page)
        else:
            summary.report = write(summary.results, args.report_dir, title=title, pages=pages,
                                   on_page=progress.page)
        summary.report_pages = pages
        progress.done()
    except BadInput as exc:  # the directory went away or bad since the command started
        summary.report_error = str(exc)
        print(f"killpoint: warning: {summary.report_error}; the verdict stands", file=sys.stderr)
    except OSError as exc:
        summary.report_error = (f"cannot write reports to {shown(args.report_dir)} "
                                f"({exc.strerror or exc})")
        print(f"killpoint: warning: {summary.report_error}; the verdict stands", file=sys.stderr)


class _PageProgress:
    """Progress of the report pages on stderr, as the runs' progress: a line when writing starts (when
    there is more than one page), then every 3 s, then one saying what was written (with the
    ``before`` pages written as the runs came); off with --quiet."""

    def __init__(self, total: int, where: str, *, quiet: bool, before: int = 0) -> None:
        self.total, self.where, self.quiet, self.before = total, where, quiet, before
        self.started = time.monotonic()
        self.last = self.started
        if not quiet and total > 1:
            print(f"killpoint: writing {total} report pages and the index to {where}", file=sys.stderr)

    def page(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.quiet and now - self.last >= 3.0 and done < total:
            print(f"killpoint: {done}/{total} report pages written, {now - self.started:.1f} s", file=sys.stderr)
            self.last = now

    def done(self) -> None:
        if self.quiet:
            return
        took = time.monotonic() - self.started
        if self.before and not self.total:
            print(f"killpoint: wrote {self.before} report page(s) as the runs came, and the index, to {self.where}",
                  file=sys.stderr)
            return
        if self.before:
            print(f"killpoint: wrote {self.before + self.total} report page(s) ({self.before} as the runs came, "
                  f"{self.total} after them) and the index to {self.where} in {took:.1f} s", file=sys.stderr)
            return
        what = (f"{self.total} report page(s) and the index" if self.total else
                "the index only (every run valid; --report always writes a page for each run)")
        print(f"killpoint: wrote {what} to {self.where} in {took:.1f} s", file=sys.stderr)


def print_judgement(summary: Summary, results: Sequence[RunResult], *, reproduce: bool = True) -> None:
    """The invariants table, then each violation (with its replay line) and each unknown reason."""
    paint = Colour.for_stream(sys.stdout)
    print()
    table = summary.invariants()
    na_column = any(c["not_applicable"] for c in table.values())
    print(f"{'invariant':<24} {'checked':>8} {'violated':>9}" + (f" {'n/a':>5}" if na_column else ""))
    for name, c in table.items():
        print(f"{name:<24} {c['checked']:>8} {c['violated']:>9}"
              + (f" {c['not_applicable']:>5}" if na_column else ""))
    if na_column:
        print("n/a: runs in which the invariant was not applicable (the target owns its state and "
              "gave it nothing to judge)")
    for r in results:
        where = r.config.schedule or "no faults"
        for v in r.verdict.violations:
            print(f"\n{paint.verdict('VIOLATED')} {v.invariant} at {v.instance}:{v.step} under {where}")
            print(f"  {v.detail}")
            if reproduce:
                print(f"  reproduce: {replay_command(r)}")
        if r.valid is None:
            for reason in r.verdict.unknown_reasons:
                print(f"\n{paint.verdict('UNKNOWN')} {where}: {reason}")
    for reason in summary.reasons():
        print(f"\n{paint.verdict('UNKNOWN')} all runs: {reason}")


def say_stopped(made: int, planned: int, cause: str) -> None:
    """The line a command prints when it stopped at an infrastructure failure, on stderr."""
    print(f"killpoint: stopped after run {made} of {planned}: {cause}; the other {planned - made} runs were "
          f"not made", file=sys.stderr)


def finish(args: argparse.Namespace, summary: Summary, title: str, lines: Sequence[str] = (),
           extra_json: Mapping[str, Any] | None = None) -> int:
    """Print the outcome (text or JSON, with ``extra_json``'s fields added) and return the exit code."""
    write_reports(args, summary, title)
    if summary.not_run:
        say_stopped(len(summary.results), summary.planned or 0, summary.infrastructure or "")
    if args.json:
        print(json.dumps({**summary.to_json(), **(extra_json or {})}, indent=2))
        print_json_hint(args, summary)
        return summary.exit_code()
    for line in lines:
        print(line)
    print_judgement(summary, summary.results)
    if getattr(args, "stats", False):
        print_stats(summary)
    hint = report_hint(args, summary)
    if hint:
        print(f"\n{hint}")
    paint = Colour.for_stream(sys.stdout)
    verdict = paint.verdict(vocab.VERDICT_WORDS[summary.valid])
    fired = sum(1 for r in summary.results for n in r.fired.values() if n)
    scheduled = sum(len(r.fired) for r in summary.results)
    judged, total = summary.judged()
    for error, n in summary.target_errors():
        print(f"\n{paint.verdict('TARGET ERROR')} in {n} of {len(summary.results)} runs: {error}")
    tally = summary.exercise()
    if tally.line():
        print(f"\nexercised: {tally.line()}")
    brief = tally.brief()
    hits = ""
    if summary.exploration is not None:
        h = summary.hits()
        hits = (f", {h['explored']} later hits explored ({h['mode']}; {h['left']} left"
                + (f", {h['never_fired']} never fired" if h["never_fired"] else "")
                + ("; --hits all kills every hit reached" if h["mode"] == "paths" else "") + ")")
    print(f"\n{len(summary.results)} runs, {fired}/{scheduled} scheduled faults fired"
          + (f" ({brief})" if brief else "") + hits
          + f", {judged} of {total} invariants judged: {verdict}"
          + (f"; report: {summary.report}" if summary.report else ""))
    return summary.exit_code()
