"""What can go wrong and how it is made to happen: crash points, failpoint actions, schedules."""

from killpoint.chaos.actions import Chain, InvalidAction, Term
from killpoint.chaos.points import DB_POINTS, DEFAULT_POINTS, ORDERED_POINTS, POINTS, PROTOCOL_POINTS, at, point
from killpoint.chaos.schedule import Fault, InvalidSchedule, Schedule, parse

__all__ = ["Chain", "DB_POINTS", "DEFAULT_POINTS", "Fault", "InvalidAction", "InvalidSchedule",
           "ORDERED_POINTS", "POINTS", "PROTOCOL_POINTS", "Schedule", "Term", "at", "parse", "point"]
