"""What a schedule is: its cron (validated the way Vertex AI and KFP read it), times and limits,
and what listing one shows; shared by the ``schedule`` command and the backends."""

from __future__ import annotations

import datetime
import re
import zoneinfo
from dataclasses import dataclass

from components.errors import GnnflowError

# (name, lowest, highest, names for values) of the five unix-cron fields
_CRON_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")),
    ("day of week", 0, 6, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
)
_CRON_ITEM = re.compile(r"^(?:(?P<star>\*)|(?P<low>\w+)(?:-(?P<high>\w+))?)(?:/(?P<step>\d+))?$")


def validate_cron(cron: str) -> str:
    """A five-field unix cron expression (minute hour day-of-month month day-of-week), normalized."""
    fields = cron.split()
    if cron.strip().upper().startswith(("TZ=", "CRON_TZ=")):
        raise GnnflowError(f"cron {cron!r}: give the time zone with --time-zone, not in the expression")
    if len(fields) != 5:
        raise GnnflowError(f"cron {cron!r} has {len(fields)} fields; expected 5: minute hour day-of-month month day-of-week")
    for text, (name, low, high, names) in zip(fields, _CRON_FIELDS):
        for item in text.split(","):
            match = _CRON_ITEM.match(item.upper())
            if not match or (match["step"] is not None and int(match["step"]) == 0):
                raise GnnflowError(f"cron {cron!r}: {name} field {text!r} is not *, N, N-M, */S or N-M/S")
            if match["step"] and not match["star"] and not match["high"]:
                raise GnnflowError(f"cron {cron!r}: {name} field {text!r}: a step needs * or a range")
            bounds = [_cron_value(v, name, low, high, names, cron) for v in (match["low"], match["high"]) if v]
            if len(bounds) == 2 and bounds[0] > bounds[1]:
                raise GnnflowError(f"cron {cron!r}: {name} range {item!r} runs backwards")
    return " ".join(fields)


def _cron_value(text: str, name: str, low: int, high: int, names: tuple[str, ...], cron: str) -> int:
    value = names.index(text) + (low if name == "month" else 0) if text in names else int(text) if text.isdigit() else None
    if value is None or not low <= value <= high:
        raise GnnflowError(f"cron {cron!r}: {name} value {text!r} is outside {low}-{high}")
    return value


@dataclass(frozen=True)
class ScheduleOptions:
    """When scheduled runs start. Naive start and end times are taken in ``time_zone``."""

    cron: str
    time_zone: str = "UTC"
    display_name: str | None = None
    max_concurrent_runs: int = 1
    start_time: datetime.datetime | None = None
    end_time: datetime.datetime | None = None
    max_run_count: int | None = None
    allow_queueing: bool = False
    catch_up: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "cron", validate_cron(self.cron))
        try:
            zone = zoneinfo.ZoneInfo(self.time_zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise GnnflowError(f"--time-zone {self.time_zone!r} is not an IANA time zone (e.g. Europe/Berlin)") from exc
        if self.max_concurrent_runs < 1:
            raise GnnflowError(f"--max-concurrent-runs must be at least 1, got {self.max_concurrent_runs}")
        if self.max_run_count is not None and self.max_run_count < 1:
            raise GnnflowError(f"--max-run-count must be at least 1, got {self.max_run_count}")
        for name in ("start_time", "end_time"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                object.__setattr__(self, name, value.replace(tzinfo=zone))
        if self.start_time and self.end_time and self.end_time <= self.start_time:
            raise GnnflowError(f"--end-time {self.end_time.isoformat()} is not after --start-time {self.start_time.isoformat()}")


@dataclass(frozen=True)
class ScheduleInfo:
    name: str  # Vertex AI: the schedule's resource name; KFP: the recurring run id
    display_name: str
    state: str
    cron: str
