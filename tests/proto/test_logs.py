"""``proto.logs``: a stamped line carries its time and level outside journald; journald keeps its ``<N>``."""

import datetime
import logging
import re

from proto.logs import JournalFormatter

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"


def record(level: int, message: str, created: float | None = None) -> logging.LogRecord:
    rec = logging.LogRecord("megabatch", level, __file__, 1, message, None, None)
    if created is not None:
        rec.created, rec.msecs = created, (created % 1) * 1000
    return rec


def test_stamped_lines_start_with_time_and_level_every_line_of_a_record():
    stamped = JournalFormatter(journal=False, stamped=True)
    text = stamped.format(record(logging.WARNING, "two\nlines"))
    assert re.fullmatch(f"{STAMP} WARNING megabatch: two\n{STAMP} WARNING lines", text), text
    assert re.fullmatch(f"{STAMP} INFO megabatch: x", stamped.format(record(logging.INFO, "x")))


def test_the_stamp_is_the_records_own_time_with_its_offset():
    created = datetime.datetime(2026, 3, 1, 12, 34, 56, 789000, tzinfo=datetime.UTC).timestamp()
    stamp = JournalFormatter(journal=False, stamped=True).format(record(logging.ERROR, "x", created)).split()[0]
    assert datetime.datetime.fromisoformat(stamp).timestamp() == created


def test_journald_gets_priorities_not_stamps_and_unstamped_stays_as_it_was():
    assert JournalFormatter(journal=True, stamped=True).format(record(logging.ERROR, "x")) == "<3>megabatch: x"
    assert JournalFormatter(journal=False).format(record(logging.ERROR, "x")) == "megabatch: x"


def test_the_handler_writes_to_stderr_as_it_is_when_a_record_is_emitted(monkeypatch):
    """A handler bound to the stderr of its setup wrote a traceback per record once that stream was closed (a
    test's capture, replaced by the next test's): the records must follow sys.stderr."""
    import io
    import logging
    import sys

    from proto.logs import configure_logging

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging(logging.INFO)
    try:
        first.close()
        monkeypatch.setattr(sys, "stderr", second)
        logging.getLogger("megabatch.test").info("after the swap")
        assert second.getvalue().strip().endswith("after the swap"), second.getvalue()
        assert "Logging error" not in second.getvalue()
    finally:
        logging.basicConfig(handlers=[logging.NullHandler()], force=True)
