"""Held-out prompts for the `newcode` workload: function specs written for localspec, in no benchmark.

Speculation pays where text repeats; these measure it where nothing does. Each is a raw completion
(a signature and a docstring, as in HumanEval) on a task that is not a HumanEval problem, not an
edit of the prompt and not a common textbook exercise, so neither Max-Gram nor a trained drafter
has seen the answer. Nothing here was used to tune a constant: keep it that way (tune on
humaneval/edit/chat, check here).
"""
from __future__ import annotations

PROMPTS: tuple[tuple[str, str], ...] = (
    ("newcode/0", '''def merge_calendar_slots(busy: list[tuple[int, int]], day_start: int, day_end: int,
                         min_gap: int) -> list[tuple[int, int]]:
    """Return the free slots of a day, in minutes since midnight.

    busy holds possibly overlapping (start, end) meetings in any order. A free slot is kept only
    when it lasts at least min_gap minutes. Slots are clipped to [day_start, day_end).

    >>> merge_calendar_slots([(540, 600), (570, 660), (720, 750)], 480, 1020, 30)
    [(480, 540), (660, 720), (750, 1020)]
    """
'''),
    ("newcode/1", '''def parse_duration(text: str) -> int:
    """Parse a human duration such as "1h 30m", "45s", "2d4h" or "90m" into seconds.

    Units: d (days), h (hours), m (minutes), s (seconds); spaces between parts are optional; a unit
    may appear once. Raise ValueError on anything else, including an empty string.

    >>> parse_duration("1h 30m")
    5400
    >>> parse_duration("2d4h")
    187200
    """
'''),
    ("newcode/2", '''def rle_bits(data: bytes) -> list[tuple[int, int]]:
    """Run-length encode the bits of data, most significant bit of each byte first.

    Returns a list of (bit, run_length) pairs covering every bit in order.

    >>> rle_bits(bytes([0b11110000]))
    [(1, 4), (0, 4)]
    >>> rle_bits(bytes([0xFF, 0x00]))
    [(1, 8), (0, 8)]
    """
'''),
    ("newcode/3", '''def shelf_layout(widths: list[int], shelf_width: int) -> list[list[int]]:
    """Place books (by width, in the given order) on shelves of shelf_width, first fit in order:
    a book goes on the current shelf if it fits, else a new shelf is started. Return the indices
    of the books on each shelf. Raise ValueError if a single book is wider than a shelf.

    >>> shelf_layout([3, 4, 2, 5, 1], 7)
    [[0, 1], [2, 3], [4]]
    """
'''),
    ("newcode/4", '''def tally_votes(ballots: list[list[str]]) -> str:
    """Instant-runoff election. Each ballot ranks candidates, most preferred first. In each round
    count each ballot for its highest-ranked candidate still in the race; a candidate with more
    than half of the counted ballots wins; otherwise drop the candidate with the fewest votes
    (ties broken by dropping the alphabetically last) and repeat. Exhausted ballots are not
    counted. Return the winner's name.

    >>> tally_votes([["ann", "bob"], ["bob", "ann"], ["cid", "bob"]])
    'bob'
    """
'''),
    ("newcode/5", '''def wrap_preserving_words(text: str, width: int, indent: str = "") -> list[str]:
    """Wrap text to lines of at most width characters, each line starting with indent.

    Words are separated by runs of whitespace; a word longer than the room on an empty line is
    split across lines. Blank lines in text (two or more newlines) are kept as empty strings.
    """
'''),
    ("newcode/6", '''class RateLimiter:
    """A token bucket: capacity tokens, refilled at rate tokens per second.

    allow(now) takes one token if one is available at time now (seconds, non-decreasing between
    calls) and returns True, else returns False. The bucket starts full.

    >>> r = RateLimiter(capacity=2, rate=1.0)
    >>> [r.allow(0.0), r.allow(0.1), r.allow(0.2), r.allow(1.3)]
    [True, True, False, True]
    """

    def __init__(self, capacity: int, rate: float) -> None:
'''),
    ("newcode/7", '''def diff_lines(old: list[str], new: list[str]) -> list[str]:
    """A minimal line diff: lines of both inputs in order, each prefixed with "  " (in both),
    "- " (only in old) or "+ " (only in new), using a longest common subsequence of lines.
    Where both a deletion and an insertion sit at the same place, deletions come first.

    >>> diff_lines(["a", "b", "c"], ["a", "c", "d"])
    ['  a', '- b', '  c', '+ d']
    """
'''),
    ("newcode/8", '''def roman_to_int_strict(numeral: str) -> int:
    """Convert a Roman numeral to an integer, refusing non-canonical forms.

    Only the subtractive pairs IV, IX, XL, XC, CD, CM are allowed, a symbol repeats at most three
    times in a row (V, L and D never repeat), and the value must be 1..3999. Raise ValueError
    with a message naming the first offending position otherwise.
    """
'''),
    ("newcode/9", '''def bucket_latencies(samples_ms: list[float], edges: list[float]) -> dict[str, int]:
    """Histogram of latency samples over the bucket edges (ascending). Keys read "<e0",
    "e0-e1", ..., ">=eN" with edges printed without trailing zeros; a sample equal to an edge goes
    to the bucket that starts there. Empty buckets are included with count 0.

    >>> bucket_latencies([1, 5, 10, 12.5, 40], [5, 10, 20])
    {'<5': 1, '5-10': 1, '10-20': 2, '>=20': 1}
    """
'''),
    ("newcode/10", '''def topo_layers(deps: dict[str, set[str]]) -> list[list[str]]:
    """Group build targets into layers: a target's dependencies all lie in earlier layers.
    deps maps a target to the targets it depends on (which may be missing from the keys: they
    have no dependencies). Each layer is sorted. Raise ValueError naming one cycle if there is one.

    >>> topo_layers({"app": {"lib", "cfg"}, "lib": {"cfg"}})
    [['cfg'], ['lib'], ['app']]
    """
'''),
    ("newcode/11", '''def mask_secrets(line: str) -> str:
    """Mask secrets in a log line: the value after "password=", "token=" or "api_key=" (case
    insensitive, up to the next whitespace, comma or ampersand) becomes "***", and any run of 13
    to 19 digits (optionally separated by single spaces or dashes) keeps only its last four digits,
    the rest replaced by "*" with the separators kept.
    """
'''),
    ("newcode/12", '''def knight_distance(start: str, goal: str) -> int:
    """Fewest knight moves between two squares of a chess board given in algebraic notation
    ("a1" .. "h8"). Raise ValueError for a square off the board.

    >>> knight_distance("a1", "b3")
    1
    >>> knight_distance("a1", "h8")
    6
    """
'''),
    ("newcode/13", '''def split_invoice(total_cents: int, weights: list[int]) -> list[int]:
    """Split an amount between payers in proportion to their weights, in whole cents, so that the
    parts add up exactly to total_cents. Leftover cents go one each to the payers with the largest
    fractional remainders (earlier payer first on ties).

    >>> split_invoice(1000, [1, 1, 1])
    [334, 333, 333]
    """
'''),
    ("newcode/14", '''def compress_path(path: str) -> str:
    """Normalise a POSIX path without touching the file system: collapse repeated slashes,
    drop "." segments, resolve ".." against the previous segment (a ".." at the start of a
    relative path is kept, at the root it is dropped), and remove a trailing slash except for "/".
    An empty path becomes ".".
    """
'''),
    ("newcode/15", '''def sparkline(values: list[float]) -> str:
    """Render values as a sparkline of the eight block characters "▁▂▃▄▅▆▇█", scaling linearly
    between the minimum and the maximum; if all values are equal use "▄" for each. NaN values
    render as a space.
    """
'''),
    ("newcode/16", '''def next_business_day(date_iso: str, holidays: set[str], days: int = 1) -> str:
    """The date that is `days` business days after date_iso (YYYY-MM-DD), skipping Saturdays,
    Sundays and the given holidays (ISO strings). days may be negative to go back; days == 0
    returns the date itself if it is a business day, else the next business day.
    """
'''),
    ("newcode/17", '''def column_widths(rows: list[list[str]], max_total: int, min_width: int = 3) -> list[int]:
    """Column widths for printing a table within max_total characters including one space
    between columns. Start from each column's longest cell; while the total is too wide, shrink
    the currently widest column by one (leftmost on ties), never below min_width. Raise ValueError
    if even min_width columns cannot fit.
    """
'''),
    ("newcode/18", '''def group_anagram_runs(words: list[str]) -> list[list[str]]:
    """Split words into maximal runs of consecutive words that are anagrams of each other
    (ignoring case and non-letters). Order is preserved.

    >>> group_anagram_runs(["listen", "Silent", "enlist", "cat", "act", "dog"])
    [['listen', 'Silent', 'enlist'], ['cat', 'act'], ['dog']]
    """
'''),
    ("newcode/19", '''class LRUCacheWithTTL:
    """A least-recently-used cache of at most maxsize entries where each entry also expires ttl
    seconds after it was last written. get(key, now) returns the value or None (an expired entry
    is removed); put(key, value, now) stores it, evicting the least recently used live entry when
    full (expired entries are evicted first).
    """

    def __init__(self, maxsize: int, ttl: float) -> None:
'''),
    ("newcode/20", '''def elevation_gain(profile: list[float], threshold: float = 2.0) -> float:
    """Total climb of a hike's elevation profile, ignoring noise: a rise counts only once the
    elevation has gone up by at least threshold metres from the last counted low point, and a
    fall of at least threshold metres from the last high point starts a new low point.

    >>> elevation_gain([100, 101, 100, 105, 103, 110])
    10.0
    """
'''),
    ("newcode/21", '''def sql_in_clause(column: str, values: list, max_per_clause: int = 1000) -> tuple[str, list]:
    """Build "column IN (?, ?, ...)" for parameterised SQL, splitting into several IN clauses
    joined by " OR " (wrapped in parentheses) when there are more than max_per_clause values.
    Duplicate values are removed, keeping the first occurrence. An empty list gives "1 = 0".
    Return the SQL text and the parameter list.
    """
'''),
    ("newcode/22", '''def overlap_area(rects: list[tuple[int, int, int, int]]) -> int:
    """Area covered by at least two of the axis-aligned rectangles (x0, y0, x1, y1), x0 < x1 and
    y0 < y1, integer coordinates.

    >>> overlap_area([(0, 0, 2, 2), (1, 1, 3, 3)])
    1
    """
'''),
    ("newcode/23", '''def semver_sort(versions: list[str]) -> list[str]:
    """Sort semantic versions ("1.2.3", "1.2.3-rc.1", "1.2.3+build5") by semver precedence: numeric
    major, minor, patch; a pre-release sorts before its release, pre-release identifiers compare
    numerically when both are numbers and as text otherwise, numbers before text; build metadata
    is ignored (keep input order for equal precedence).
    """
'''),
)
