"""What can go wrong and how it is made to happen: crash points, failpoint actions, schedules."""

from chaos.actions import Chain, InvalidAction, Term
from chaos.points import DB_POINTS, DEFAULT_POINTS, ORDERED_POINTS, POINTS, PROTOCOL_POINTS, at, point
from chaos.schedule import Fault, InvalidSchedule, Schedule, parse

__all__ = ["Chain", "DB_POINTS", "DEFAULT_POINTS", "Fault", "InvalidAction", "InvalidSchedule",
           "ORDERED_POINTS", "POINTS", "PROTOCOL_POINTS", "Schedule", "Term", "at", "parse", "point"]
