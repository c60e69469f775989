"""Tests of the passive Redis RESP analyzer (netdiag.protocols.resp).

Three kinds of input: hand-written byte strings fed with exact capture times (every
RESP2/RESP3 type, inline commands, pipelining, pub/sub, damaged streams), property
tests (any split gives the same commands and times; random and mutated bytes never
raise), and real traffic between redis-py and a real redis-server on loopback,
recorded by a TCP relay.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import socket
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netdiag.protocols.resp import MAX_ARG, MAX_LINE, RespAnalyzer, looks_like_resp
from netdiag.records import Request

T0 = 1_764_425_767_000_000_000
MS = 1_000_000


def t(ms: float) -> int:
    """Capture time ``ms`` milliseconds after T0."""
    return T0 + round(ms * MS)


def run(*events: Any, close: float | None = None) -> RespAnalyzer:
    """Feed events: ``(direction, ms, bytes)`` data, ``(direction, ms, int)`` a gap."""
    an = RespAnalyzer()
    for packet, (d, ms, data) in enumerate(events, 1):
        if isinstance(data, int):
            an.gap(d, t(ms), data)
        else:
            an.feed(d, t(ms), data, packet)
    if close is not None:
        an.close(t(close))
    return an


def cmd(*args: bytes | str) -> bytes:
    """A command as clients send it: an array of bulk strings."""
    parts = [a.encode() if isinstance(a, str) else a for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def bulk(p: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(p), p)


def summary(r: Request) -> tuple[Any, ...]:
    return (r.method, r.path, r.reset)


# ---------------------------------------------------------------------------------
# Hand-written streams
# ---------------------------------------------------------------------------------

def test_one_command_exact_times_and_sizes() -> None:
    c = cmd("GET", "user:1")
    s = bulk(b"alice")
    an = run((0, 0, c[:5]), (0, 1, c[5:]), (1, 3, s[:2]), (1, 7, s[2:]), close=10)
    (r,) = an.requests
    assert (r.method, r.path, r.protocol, r.estimated, r.status) == (
        "GET", "user:1", "resp", False, None)
    assert (r.ts_ns, r.end_ns, r.first_byte_ns, r.last_byte_ns) == (t(0), t(1), t(3), t(7))
    assert (r.request_bytes, r.response_bytes) == (len(c), len(s))
    assert an.warnings == []
    assert an.protocol == "resp" and an.http2 is None
    j = r.to_json()
    assert j["ttfb_ms"] == 3.0 and j["ttlb_ms"] == 7.0


def test_pipelined_commands_match_replies_in_order() -> None:
    c = cmd("SET", "a", "1") + cmd("INCR", "n") + cmd("HINCRBY", "h", "f", "2") + cmd("GET", "a")
    an = run((0, 0, c), (1, 2, b"+OK\r\n:1\r"), (1, 3, b"\n:2\r\n"), (1, 5, bulk(b"1")),
             close=9)
    assert [summary(r) for r in an.requests] == [
        ("SET", "a", None), ("INCR", "n", None), ("HINCRBY", "h", None), ("GET", "a", None)]
    assert all(r.ts_ns == t(0) and r.end_ns == t(0) for r in an.requests)
    assert [(r.first_byte_ns, r.last_byte_ns) for r in an.requests] == [
        (t(2), t(2)), (t(2), t(3)), (t(3), t(3)), (t(5), t(5))]
    assert [r.response_bytes for r in an.requests] == [5, 4, 4, 7]
    assert an.warnings == []


def test_every_resp3_reply_type() -> None:
    replies = [
        b"%2\r\n+server\r\n+redis\r\n+proto\r\n:3\r\n",             # HELLO: map
        b"~2\r\n$1\r\na\r\n$1\r\nb\r\n",                             # set
        b",3.14\r\n",                                                # double
        b",inf\r\n",                                                 # double
        b"#t\r\n",                                                   # boolean
        b"_\r\n",                                                    # null
        b"(3492890328409238509324850943850943825024385\r\n",        # big number
        b"=15\r\ntxt:Some string\r\n",                               # verbatim
        b"!21\r\nSYNTAX invalid syntax\r\n",                         # bulk error
        b"|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.19\r\n*1\r\n:1\r\n",  # attribute
        b"*3\r\n*1\r\n%1\r\n+k\r\n~1\r\n_\r\n$-1\r\n*-1\r\n",         # nested + RESP2 nulls
        b"$?\r\n;4\r\nHell\r\n;1\r\no\r\n;0\r\n",                     # streamed string
        b"*?\r\n:1\r\n%?\r\n+a\r\n:1\r\n.\r\n.\r\n",                  # streamed aggregates
        b"$0\r\n\r\n",                                               # empty bulk
        b"*0\r\n",                                                   # empty array
    ]
    names = ["HELLO", "SMEMBERS", "ZSCORE", "ZSCORE", "EXISTS", "GET", "INCRBY", "LATENCY DOCTOR",
             "XADD", "GET", "LRANGE", "GET", "HGETALL", "GET", "KEYS"]
    commands = [cmd("HELLO", "3"), cmd("SMEMBERS", "s"), cmd("ZSCORE", "z", "m"),
                cmd("ZSCORE", "z", "m"), cmd("EXISTS", "k"), cmd("GET", "nil"),
                cmd("INCRBY", "big", "1"), cmd("LATENCY", "DOCTOR"), cmd("XADD", "x", "?"),
                cmd("GET", "a"), cmd("LRANGE", "l", "0", "-1"), cmd("GET", "s"),
                cmd("HGETALL", "h"), cmd("GET", "e"), cmd("KEYS", "*")]
    push = b">3\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\na\r\n_\r\n"
    events: list[Any] = [(0, 0, b"".join(commands))]
    for k, r in enumerate(replies):
        if k == 5:
            events.append((1, 1 + 2 * k - 1, push))  # a push between replies is not a reply
        events.append((1, 1 + 2 * k, r))
    an = run(*events, close=99)
    assert an.warnings == []
    assert [r.method for r in an.requests] == names
    assert [r.first_byte_ns for r in an.requests] == [t(1 + 2 * k) for k in range(len(replies))]
    assert [r.response_bytes for r in an.requests] == [len(r) for r in replies]
    assert [r.reset for r in an.requests] == [None] * 8 + ["error:SYNTAX"] + [None] * 6
    assert an.pushes == 1


def test_attribute_and_push_split_byte_by_byte() -> None:
    c = cmd("GET", "a") + cmd("GET", "b")
    s = (b">2\r\n+invalidate\r\n*1\r\n+a\r\n|1\r\n+ttl\r\n:5\r\n$1\r\nx\r\n"
         b">2\r\n+invalidate\r\n_\r\n-ERR boom\r\n")
    events: list[Any] = [(0, 0, c)] + [(1, 10 + k, s[k:k + 1]) for k in range(len(s))]
    an = run(*events, close=999)
    first, second = an.requests
    attr_at = s.index(b"|1")
    assert first.first_byte_ns == t(10 + attr_at)  # the attribute is part of the reply
    assert first.last_byte_ns == t(10 + s.index(b"x\r\n") + 2)
    assert second.first_byte_ns == t(10 + s.index(b"-ERR"))
    assert second.reset == "error:ERR" and an.pushes == 2 and an.warnings == []


def test_inline_commands() -> None:
    c = b"PING\r\n\r\nSET  k   v\nhgetall h\r\n" + cmd("GET", "k")
    s = b"+PONG\r\n+OK\r\n*0\r\n$1\r\nv\r\n"
    an = run((0, 0, c[:3]), (0, 1, c[3:]), (1, 2, s), close=5)
    assert [summary(r) for r in an.requests] == [
        ("PING", None, None), ("SET", "k", None), ("HGETALL", "h", None), ("GET", "k", None)]
    assert an.requests[0].ts_ns == t(0) and an.requests[0].end_ns == t(1)
    assert an.requests[0].request_bytes == 6 and an.requests[1].request_bytes == 11
    assert an.warnings == []


def test_multi_exec_counts_each_command() -> None:
    c = cmd("MULTI") + cmd("SET", "a", "1") + cmd("INCR", "a") + cmd("EXEC")
    s = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n:2\r\n"
    an = run((0, 0, c), (1, 1, s[:5]), (1, 2, s[5:]), close=3)
    assert [r.method for r in an.requests] == ["MULTI", "SET", "INCR", "EXEC"]
    assert an.requests[3].response_bytes == len(b"*2\r\n+OK\r\n:2\r\n")
    assert all(r.last_byte_ns is not None for r in an.requests)


@pytest.mark.parametrize(("args", "method", "path"), [
    (["EVALSHA", "1a2b3c4d" * 5, "1", "tok:alice", "5"], "EVALSHA", "tok:alice"),
    (["evalsha", "1a2b3c4d" * 5, "0", "5"], "EVALSHA", None),
    (["EVAL", "return 1", "2", "k1", "k2"], "EVAL", "k1"),
    (["FCALL", "f", "1", "fk"], "FCALL", "fk"),
    (["ZUNION", "2", "z1", "z2"], "ZUNION", "z1"),
    (["BLMPOP", "0", "1", "l1", "LEFT"], "BLMPOP", "l1"),
    (["XREAD", "COUNT", "2", "STREAMS", "s1", "0"], "XREAD", "s1"),
    (["XREAD", "COUNT", "2"], "XREAD", None),
    (["SCRIPT", "load", "return 1"], "SCRIPT LOAD", None),
    (["client", "setname", "x"], "CLIENT SETNAME", None),
    (["OBJECT", "ENCODING", "k"], "OBJECT ENCODING", "k"),
    (["XINFO", "STREAM", "s"], "XINFO STREAM", "s"),
    (["BITOP", "AND", "dest", "a", "b"], "BITOP", "dest"),
    (["PUBLISH", "news", "hi"], "PUBLISH", "news"),
    (["PING"], "PING", None),
    (["ECHO", "x"], "ECHO", None),
    (["KEYS", "*"], "KEYS", None),
    (["MIGRATE", "h", "1", "k", "0", "5"], "MIGRATE", "k"),
    (["GET", "é\xff"], "GET", "é\xff"),
])
def test_method_and_first_key(args: list[str], method: str, path: str | None) -> None:
    an = run((0, 0, cmd(*args)), (1, 1, b"+OK\r\n"))
    (r,) = an.requests
    assert (r.method, r.path) == (method, path)


def test_non_utf8_key_and_long_arguments() -> None:
    an = run((0, 0, cmd(b"GET", b"k\xff")), (0, 1, cmd(b"SET", b"x" * 5000, b"v" * 100000)),
             (1, 2, b"$-1\r\n+OK\r\n"))
    assert an.requests[0].path == "k\\xff"
    assert an.requests[1].path == "x" * MAX_ARG
    assert an.requests[1].request_bytes == len(cmd(b"SET", b"x" * 5000, b"v" * 100000))


def test_named_ids_are_the_words_that_could_be_a_request_id() -> None:
    rid, uuid = "roc-0014", "7f3c9a2e-1b4d-4c8e-9f00-2a6b1c3d4e5f"
    script = cmd("EVALSHA", "f" * 40, "1", "budget:m", "1764425767123", "1.5", "8",
                 "0.25", "-1e5", rid)  # the id is the 10th argument
    many = cmd("SET", "k", "v", *[f"w{i:07d}" for i in range(20)])
    an = run((0, 0, script), (0, 1, cmd("SET", f"idem:{{{uuid}}}", "x" * 200)),
             (0, 2, cmd("GET", "short")), (0, 3, many), (0, 4, b"PING req-abcdef12\r\n"),
             (0, 5, cmd(b"GET", b"id-\xff-123456")),
             (1, 6, b":1\r\n+OK\r\n$-1\r\n+OK\r\n+PONG\r\n$-1\r\n"))
    assert [r.named_ids for r in an.requests] == [
        ("budget:m", rid),  # numbers, short words and the script's digest are not ids
        (f"idem:{{{uuid}}}", uuid),  # a key and its parts; 200 bytes is too long
        None,
        tuple(f"w{i:07d}" for i in range(8)),  # at most eight
        ("req-abcdef12",),
        ("id-\\xff-123456",),
    ]


def test_errors_go_to_reset() -> None:
    c = cmd("EVALSHA", "f" * 40, "0") + cmd("LPUSH", "s", "x") + cmd("EVAL", "x", "0")
    s = (b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
         b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
         b"-BUSY Redis is busy running a script.\r\n")
    an = run((0, 0, c), (1, 1, s), close=2)
    assert [r.reset for r in an.requests] == ["error:NOSCRIPT", "error:WRONGTYPE", "error:BUSY"]
    assert all(r.status is None for r in an.requests)


def test_resp2_subscribe_confirmations_and_messages() -> None:
    def arr(*items: bytes) -> bytes:
        return b"*%d\r\n" % len(items) + b"".join(items)

    c1 = cmd("SUBSCRIBE", "a", "b")
    s = (arr(bulk(b"subscribe"), bulk(b"a"), b":1\r\n")
         + arr(bulk(b"subscribe"), bulk(b"b"), b":2\r\n")
         + arr(bulk(b"message"), bulk(b"a"), bulk(b"hello")))
    c2 = cmd("PING")
    s2 = arr(bulk(b"pong"), bulk(b""))
    c3 = cmd("UNSUBSCRIBE")
    s3 = (arr(bulk(b"unsubscribe"), bulk(b"a"), b":1\r\n")
          + arr(bulk(b"unsubscribe"), bulk(b"b"), b":0\r\n"))
    c4 = cmd("LRANGE", "l", "0", "-1")
    s4 = arr(bulk(b"message"), bulk(b"x"))  # a reply after pub/sub mode ended
    an = run((0, 0, c1), (1, 1, s[:30]), (1, 2, s[30:]), (0, 3, c2), (1, 4, s2),
             (0, 5, c3), (1, 6, s3), (0, 7, c4), (1, 8, s4), close=9)
    sub, ping, unsub, lrange = an.requests
    assert sub.method == "SUBSCRIBE" and sub.path == "a"
    assert (sub.first_byte_ns, sub.last_byte_ns) == (t(1), t(2))
    n_confirm = len(s) - len(arr(bulk(b"message"), bulk(b"a"), bulk(b"hello")))
    assert sub.response_bytes == n_confirm
    assert ping.first_byte_ns == t(4)
    assert unsub.first_byte_ns == t(6) and unsub.response_bytes < len(s3)
    assert lrange.first_byte_ns == t(8)
    assert an.pushes == 2  # the message and the second unsubscribe confirmation
    assert an.warnings == []


def test_resp3_subscribe_confirmations_are_pushes() -> None:
    s = (b">3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n"
         b">3\r\n$7\r\nmessage\r\n$1\r\na\r\n$2\r\nhi\r\n")
    an = run((0, 0, cmd("SUBSCRIBE", "a")), (1, 1, s), (0, 2, cmd("GET", "k")),
             (1, 3, b"_\r\n"), close=4)
    sub, get = an.requests
    assert sub.first_byte_ns == t(1) and get.first_byte_ns == t(3)
    assert an.pushes == 1 and an.warnings == []


def test_client_reply_off_skip_on() -> None:
    c = (cmd("CLIENT", "REPLY", "SKIP") + cmd("SET", "a", "1") + cmd("GET", "a")
         + cmd("CLIENT", "REPLY", "OFF") + cmd("SET", "b", "1") + cmd("CLIENT", "REPLY", "ON")
         + cmd("GET", "b"))
    an = run((0, 0, c), (1, 1, bulk(b"1") + b"+OK\r\n" + bulk(b"1")), close=2)
    answered = [r.method for r in an.requests if r.first_byte_ns is not None]
    assert answered == ["GET", "CLIENT REPLY", "GET"]
    assert an.warnings == []


def test_monitor_feed_is_not_stray() -> None:
    s = b"+OK\r\n+1339518083.107412 [0 127.0.0.1:60866] \"keys\" \"*\"\r\n"
    an = run((0, 0, cmd("MONITOR")), (1, 1, s), close=2)
    assert an.requests[0].last_byte_ns == t(1) and an.pushes == 1 and an.warnings == []


def test_empty_commands_are_ignored() -> None:
    an = run((0, 0, b"*0\r\n*-1\r\n" + cmd("PING")), (1, 1, b"+PONG\r\n"), close=2)
    assert [r.method for r in an.requests] == ["PING"] and an.warnings == []


def test_large_bulk_strings_are_skipped_without_buffering() -> None:
    size = 50 << 20
    an = RespAnalyzer()
    an.feed(0, t(0), cmd("GET", "big"), 1)
    an.feed(1, t(1), b"$%d\r\n" % size, 2)
    piece = b"z" * (64 << 10)
    tracemalloc.start()
    try:
        for k in range(size // len(piece)):
            an.feed(1, t(2), piece, 3 + k)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    an.feed(1, t(3), b"\r\n+OK\r\n", 9999)
    an.close(t(4))
    assert peak < 1 << 20
    (r,) = an.requests
    assert r.last_byte_ns == t(3) and r.response_bytes == size + len(b"$%d\r\n" % size) + 2
    assert an.warnings == ["1 reply arrived with no command outstanding"]


def test_over_long_simple_string_is_skipped() -> None:
    s = b"+" + b"x" * (MAX_LINE * 2) + b"\r\n" + bulk(b"v")
    an = run((0, 0, cmd("ECHO", "x") + cmd("GET", "k")), (1, 1, s[:MAX_LINE + 10]),
             (1, 2, s[MAX_LINE + 10:]), close=3)
    echo, get = an.requests
    assert echo.last_byte_ns == t(2) and echo.response_bytes == len(s) - 7
    assert get.first_byte_ns == t(2) and an.warnings == []


def test_over_long_inline_command_stops_the_client_stream() -> None:
    an = run((0, 0, b"SET " + b"x" * (MAX_LINE + 5)), (0, 1, b"\r\n" + cmd("GET", "k")))
    assert an.requests == [] and len(an.warnings) == 1
    assert "over 65536 bytes in the client stream" in an.warnings[0]


def test_garbage_stops_only_that_direction() -> None:
    an = run((0, 0, cmd("GET", "a") + cmd("GET", "b")), (1, 1, b"$1\r\nx\r\n?what\r\n"),
             (1, 2, b"+OK\r\n"), (0, 3, cmd("GET", "c")), close=4)
    assert [r.path for r in an.requests] == ["a", "b", "c"]
    assert an.requests[0].first_byte_ns == t(1) and an.requests[1].first_byte_ns is None
    assert an.warnings == ["not a RESP type line in the server stream (packet 2, b'?what'); "
                           "stopped parsing it"]


def test_bad_bulk_terminator_is_garbage() -> None:
    an = run((0, 0, b"*1\r\n$4\r\nPINGxx"), (1, 1, b"+PONG\r\n"))
    assert an.requests == [] and "not followed by CRLF" in an.warnings[0]


def test_gap_inside_a_bulk_string_is_skipped() -> None:
    c = cmd("SET", "k", "v" * 1000) + cmd("GET", "k")
    body_at = c.index(b"vvv")
    s = bulk(b"v" * 1000)
    an = run((0, 0, c[:body_at + 10]), (0, 1, 500), (0, 2, c[body_at + 510:]),
             (1, 3, b"+OK\r\n"), (1, 4, s[:100]), (1, 5, len(s) - 100), close=6)
    set_, get = an.requests
    assert (set_.method, set_.path, set_.request_bytes, set_.end_ns) == ("SET", "k", len(c) - 20,
                                                                         t(2))
    assert get.first_byte_ns == t(4) and get.last_byte_ns == t(5)
    assert an.warnings == []


def test_gap_between_messages_stops_that_direction() -> None:
    an = run((0, 0, cmd("GET", "a") + cmd("GET", "b")), (1, 1, b"+A\r\n"), (1, 2, 40),
             (1, 3, b"+C\r\n"), close=4)
    a, b = an.requests
    assert a.first_byte_ns == t(1) and b.first_byte_ns is None
    assert an.warnings == ["40 bytes of the server stream were not captured (between "
                           "messages); stopped parsing it"]


def test_gap_in_the_client_stream_keeps_earlier_commands_matched() -> None:
    an = run((0, 0, cmd("GET", "a")), (0, 1, 30), (0, 2, cmd("GET", "c")),
             (1, 3, b"+A\r\n+B\r\n+C\r\n"), close=4)
    assert [r.path for r in an.requests] == ["a"]
    assert an.requests[0].first_byte_ns == t(3)
    assert an.warnings[0].startswith("30 bytes of the client stream were not captured")
    assert an.warnings[1] == "2 replies arrived with no command outstanding"


def test_close_inside_a_reply_and_unanswered_commands() -> None:
    an = run((0, 0, cmd("GET", "a") + cmd("GET", "b") + cmd("GET", "c")),
             (1, 5, b"$10\r\nabc"), close=9)
    a, _, _ = an.requests
    assert a.first_byte_ns == t(5) and a.last_byte_ns is None
    assert an.warnings == ["the connection ended inside the reply to GET a",
                           "2 commands got no reply before the connection ended (first: GET b)"]


def test_feed_after_close_and_empty_feeds_are_ignored() -> None:
    an = RespAnalyzer()
    an.feed(0, t(0), b"", 1)
    an.gap(0, t(0), 0)
    an.close(t(1))
    an.feed(0, t(2), cmd("PING"), 2)
    an.gap(1, t(2), 5)
    an.close(t(3))
    assert an.requests == [] and an.warnings == []


@pytest.mark.parametrize(("first", "expected"), [
    (cmd("PING"), True), (cmd("HELLO", "3"), True), (b"*12\r\n$3\r\n", True),
    (b"*0\r\n", False), (b"PING\r\n", False), (b"*3\r\n:1\r\n", False),
    (b"\x16\x03\x01", False), (b"GET / HTTP/1.1\r\n", False), (b"*", False),
])
def test_looks_like_resp(first: bytes, expected: bool) -> None:
    assert looks_like_resp(first) is expected


# ---------------------------------------------------------------------------------
# Property tests
# ---------------------------------------------------------------------------------

EXCHANGES: list[tuple[bytes, bytes, tuple[Any, ...]]] = [
    (cmd("GET", "k"), bulk(b"v"), ("GET", "k", None)),
    (cmd("SET", "k", "v" * 300), b"+OK\r\n", ("SET", "k", None)),
    (cmd("HINCRBY", "h", "f", "1"), b":7\r\n", ("HINCRBY", "h", None)),
    (cmd("EVALSHA", "a" * 40, "1", "tok"), b"-NOSCRIPT x\r\n",
     ("EVALSHA", "tok", "error:NOSCRIPT")),
    (b"PING\r\n", b"+PONG\r\n", ("PING", None, None)),
    (cmd("HGETALL", "h"), b"%1\r\n$1\r\nf\r\n:1\r\n", ("HGETALL", "h", None)),
    (cmd("GET", "n"), b"$-1\r\n", ("GET", "n", None)),
    (cmd("GET", "a"), b"|1\r\n+x\r\n+y\r\n$?\r\n;2\r\nab\r\n;0\r\n", ("GET", "a", None)),
    (cmd("LRANGE", "l", "0", "-1"), b"*?\r\n$1\r\na\r\n*1\r\n,1.5\r\n.\r\n",
     ("LRANGE", "l", None)),
    (cmd("SCRIPT", "LOAD", "return 1"), bulk(b"e" * 40), ("SCRIPT LOAD", None, None)),
    (cmd("X", "y"), b"!5\r\nERR x\r\n", ("X", "y", "error:ERR")),
    (cmd("EVALSHA", "b" * 40, "1", "k", "1", "2", "3", "4", "5", "6", "idem:roc-0042"),
     b":1\r\n", ("EVALSHA", "k", None)),
]
NAMED_IDS: list[tuple[str, ...] | None] = [
    None, None, None, None, None, None, None, None, None, ("return 1",), None,
    ("idem:roc-0042", "roc-0042")]
"""What :func:`test_any_split_gives_the_same_commands_and_exact_times` expects of
each exchange's ``named_ids``, whatever the split."""
PUSH = b">2\r\n+invalidate\r\n*1\r\n+k\r\n"


def split(data: bytes, cuts: list[int]) -> list[tuple[int, bytes]]:
    """(offset, piece) of ``data`` cut at ``cuts``."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [(a, data[a:b]) for a, b in itertools.pairwise(points) if b > a]


def time_of(pieces: list[tuple[int, bytes]], offset: int, base: int) -> int:
    """Capture time of the piece carrying byte ``offset`` (piece k is at base + k ms)."""
    for k, (a, piece) in enumerate(pieces):
        if a <= offset < a + len(piece):
            return base + k * MS
    raise AssertionError(offset)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(range(len(EXCHANGES))), min_size=1, max_size=8),
       st.lists(st.booleans(), min_size=8, max_size=8),
       st.lists(st.integers(0, 10_000), max_size=40),
       st.lists(st.integers(0, 10_000), max_size=40))
def test_any_split_gives_the_same_commands_and_exact_times(
        picks: list[int], pushes: list[bool], ccuts: list[int], scuts: list[int]) -> None:
    exchanges = [EXCHANGES[i] for i in picks]
    client = b"".join(x[0] for x in exchanges)
    server = b"".join((PUSH if push else b"") + x[1]
                      for x, push in zip(exchanges, pushes, strict=False))
    cpieces, spieces = split(client, ccuts), split(server, scuts)
    an = RespAnalyzer()
    for k, (_, piece) in enumerate(cpieces):
        an.feed(0, T0 + k * MS, piece, k)
    for k, (_, piece) in enumerate(spieces):
        an.feed(1, T0 + 10**9 + k * MS, piece, 1000 + k)
    an.close(T0 + 10**10)
    assert an.warnings == []
    assert [summary(r) for r in an.requests] == [x[2] for x in exchanges]
    assert [r.named_ids for r in an.requests] == [NAMED_IDS[i] for i in picks]
    assert an.pushes == sum(pushes[:len(exchanges)])
    coff = soff = 0
    for (c, s, _), push, r in zip(exchanges, pushes, an.requests, strict=False):
        soff += len(PUSH) if push else 0
        assert r.ts_ns == time_of(cpieces, coff, T0)
        assert r.end_ns == time_of(cpieces, coff + len(c) - 1, T0)
        assert r.first_byte_ns == time_of(spieces, soff, T0 + 10**9)
        assert r.last_byte_ns == time_of(spieces, soff + len(s) - 1, T0 + 10**9)
        assert (r.request_bytes, r.response_bytes) == (len(c), len(s))
        coff += len(c)
        soff += len(s)


EVENT = st.one_of(
    st.tuples(st.integers(0, 1), st.binary(max_size=200)),
    st.tuples(st.integers(0, 1), st.integers(1, 1 << 20)),
)


def drive(an: RespAnalyzer, events: list[tuple[int, Any]], close: bool) -> None:
    for k, (d, data) in enumerate(events):
        if isinstance(data, int):
            an.gap(d, T0 + k, data)
        else:
            an.feed(d, T0 + k, data, k)
    if close:
        an.close(T0 + 10**9)
    assert all(isinstance(w, str) for w in an.warnings)
    assert all(isinstance(r, Request) for r in an.requests)
    assert not any(w.startswith("internal error") for w in an.warnings), an.warnings
    _ = (an.protocol, an.http2)


@settings(max_examples=500, deadline=None)
@given(st.lists(EVENT, max_size=30), st.booleans())
def test_random_bytes_never_raise(events: list[tuple[int, Any]], close: bool) -> None:
    drive(RespAnalyzer(), events, close)


TOKENS = [b"*", b"$", b"%", b"~", b">", b"|", b"!", b"=", b"+", b"-", b":", b"_", b",", b"#",
          b"(", b";", b".", b"?", b"-1", b"0", b"1", b"2", b"3", b"99999999999", b"\r\n", b"\n",
          b"abc", b"PING", b"\r", b" ", b"2" * 30]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 1), st.lists(st.sampled_from(TOKENS), max_size=20)),
                max_size=20), st.booleans())
def test_token_soup_never_raises(events: list[tuple[int, list[bytes]]], close: bool) -> None:
    drive(RespAnalyzer(), [(d, b"".join(parts)) for d, parts in events], close)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(range(len(EXCHANGES))), min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255), st.integers(0, 3)),
                max_size=12),
       st.lists(st.integers(0, 10_000), max_size=20), st.randoms(use_true_random=False))
def test_mutated_exchanges_never_raise(picks: list[int], mutations: list[tuple[int, int, int]],
                                       cuts: list[int], rnd: Any) -> None:
    streams = [bytearray(b"".join(EXCHANGES[i][0] for i in picks)),
               bytearray(b"".join(EXCHANGES[i][1] for i in picks))]
    for pos, value, kind in mutations:
        s = streams[pos % 2]
        i = pos % (len(s) + 1)
        if kind == 0 and i < len(s):
            s[i] = value
        elif kind == 1:
            s.insert(i, value)
        elif kind == 2 and i < len(s):
            del s[i]
        else:
            s[i:i] = b"\r\n"
    events: list[tuple[int, Any]] = []
    pieces = [split(bytes(s), cuts) for s in streams]
    while pieces[0] or pieces[1]:
        d = rnd.choice([x for x in (0, 1) if pieces[x]])
        events.append((d, pieces[d].pop(0)[1]))
        if rnd.random() < 0.05:
            events.append((d, rnd.randrange(1, 100)))
    drive(RespAnalyzer(), events, rnd.random() < 0.8)


def test_many_small_commands_are_fast() -> None:
    n = 20_000
    client = (cmd("HINCRBY", "budget:alice", "tokens", "-1") + cmd("GET", "k")) * n
    server = (b":41\r\n" + bulk(b"value")) * n
    an = RespAnalyzer()
    start = time.process_time()  # CPU time, steady on a busy machine
    for i in range(0, len(client), 1448):
        an.feed(0, T0 + i, client[i:i + 1448], i)
    for i in range(0, len(server), 1448):
        an.feed(1, T0 + 10**9 + i, server[i:i + 1448], i)
    an.close(T0 + 10**10)
    elapsed = time.process_time() - start
    assert len(an.requests) == 2 * n and an.warnings == []
    assert all(r.last_byte_ns is not None for r in an.requests)
    assert elapsed < 5.0, f"{2 * n / elapsed:.0f} commands/s"


# ---------------------------------------------------------------------------------
# Real traffic: redis-py <-> loopback relay <-> redis-server
# ---------------------------------------------------------------------------------

REDIS_SERVER = shutil.which("redis-server")
try:
    import redis
except ImportError:  # pragma: no cover - the test extra installs it
    redis = None


class Relay:
    """Forwards one TCP connection on loopback, recording (direction, time, bytes) per recv."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.records: list[tuple[int, int, bytes]] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(self.target)
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pumps = [threading.Thread(target=self._pump, args=(client, server, 0), daemon=True),
                 threading.Thread(target=self._pump, args=(server, client, 1), daemon=True)]
        for p in pumps:
            p.start()
        for p in pumps:
            p.join(30)
        client.close()
        server.close()
        self.listener.close()
        self.done.set()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: int) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            with self.lock:
                self.records.append((direction, time.monotonic_ns(), data))
            try:
                dst.sendall(data)
            except OSError:
                return

    def analyze(self, bytewise: bool = False) -> RespAnalyzer:
        assert self.done.wait(30)
        an = RespAnalyzer()
        for k, (d, ts, data) in enumerate(self.records, 1):
            if bytewise:
                for i in range(len(data)):
                    an.feed(d, ts, data[i:i + 1], k)
            else:
                an.feed(d, ts, data, k)
        an.close(self.records[-1][1] + 1)
        return an


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    if REDIS_SERVER is None or redis is None:
        pytest.skip("redis-server or redis-py is not installed")
    workdir: Path = tmp_path_factory.mktemp("redis")
    for _ in range(5):
        port = _free_port()
        args = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(workdir), "--enable-debug-command", "yes"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if redis.Redis(host="127.0.0.1", port=port).ping():
                    break
            except redis.ConnectionError:
                time.sleep(0.05)
        if proc.poll() is None:
            break
    else:
        pytest.skip("redis-server did not start")
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _client(port: int, **kw: Any) -> Any:
    """A client that uses one connection (the relay forwards one), pipelines included."""
    return redis.Redis(host="127.0.0.1", port=port, max_connections=1, socket_timeout=10, **kw)


def _ours(an: RespAnalyzer, first: str) -> list[Request]:
    """The requests from the first ``first`` on (after redis-py's connection setup)."""
    methods = [r.method for r in an.requests]
    return an.requests[methods.index(first):]


def _check_times(an: RespAnalyzer, relay: Relay) -> None:
    """Every time is a recv time of the right direction, in order, and every reply seen."""
    client_times = {ts for d, ts, _ in relay.records if d == 0}
    server_times = {ts for d, ts, _ in relay.records if d == 1}
    for r in an.requests:
        assert r.ts_ns in client_times and r.end_ns in client_times
        assert r.first_byte_ns in server_times and r.last_byte_ns in server_times
        assert r.ts_ns <= r.end_ns <= r.first_byte_ns <= r.last_byte_ns
        assert r.estimated is False and r.protocol == "resp"
    wire = [sum(len(x) for d, _, x in relay.records if d == k) for k in (0, 1)]
    assert sum(r.request_bytes or 0 for r in an.requests) == wire[0]
    assert sum(r.response_bytes or 0 for r in an.requests) + an.pushes * 0 <= wire[1]


@pytest.mark.slow
def test_real_redis_resp2_commands(redis_port: int) -> None:
    relay = Relay(("127.0.0.1", redis_port))
    r = _client(relay.port)
    sha = r.script_load("redis.call('HINCRBY', KEYS[1], 'used', ARGV[1]); "
                        "return redis.call('HGET', KEYS[1], 'used')")
    assert int(r.evalsha(sha, 1, "budget:alice", 5)) == 5
    r.set("user:1", "alice")
    assert r.get("user:1") == b"alice"
    assert r.hincrby("budget:bob", "used", 3) == 3
    pipe = r.pipeline(transaction=False)
    for i in range(10):
        pipe.set(f"p:{i}", i)
    assert pipe.execute() == [True] * 10
    tx = r.pipeline(transaction=True)
    tx.set("tx", 1).incr("tx")
    assert tx.execute() == [True, 2]
    with pytest.raises(redis.exceptions.NoScriptError):
        r.evalsha("0" * 40, 1, "budget:carol", 1)
    start = time.monotonic_ns()
    r.execute_command("DEBUG", "SLEEP", "0.05")
    wall = time.monotonic_ns() - start
    r.set("big", b"x" * 300_000)
    assert len(r.get("big")) == 300_000
    r.close()

    an = relay.analyze()
    assert an.warnings == []
    ours = _ours(an, "SCRIPT LOAD")
    assert [(q.method, q.path) for q in ours] == (
        [("SCRIPT LOAD", None), ("EVALSHA", "budget:alice"), ("SET", "user:1"),
         ("GET", "user:1"), ("HINCRBY", "budget:bob")]
        + [("SET", f"p:{i}") for i in range(10)]
        + [("MULTI", None), ("SET", "tx"), ("INCRBY", "tx"), ("EXEC", None),
           ("EVALSHA", "budget:carol"), ("DEBUG SLEEP", None), ("SET", "big"), ("GET", "big")])
    assert [q.reset for q in ours if q.reset] == ["error:NOSCRIPT"]
    _check_times(an, relay)
    pipelined = ours[5:15]
    assert len({q.ts_ns for q in pipelined}) == 1  # one write, one recv
    sleep = ours[20]
    assert 50 * MS <= sleep.first_byte_ns - sleep.ts_ns <= wall
    assert ours[-1].response_bytes == len(bulk(b"x" * 300_000))
    assert ours[-2].request_bytes == len(cmd("SET", "big", b"x" * 300_000))

    bytewise = relay.analyze(bytewise=True)
    assert [q.to_json() for q in bytewise.requests] == [q.to_json() for q in an.requests]


@pytest.mark.slow
def test_real_redis_resp3_types_and_push(redis_port: int) -> None:
    relay = Relay(("127.0.0.1", redis_port))
    # one connection held by the client, not taken from a pool each command: a pool
    # (redis-py 8.2 on) drops a connection with unread data, here the invalidation push,
    # and dials again, which the relay of one connection refuses; a held connection
    # reads the push before the next answer, as a client that tracks keys does
    r = _client(relay.port, protocol=3, single_connection_client=True)
    other = redis.Redis(host="127.0.0.1", port=redis_port)
    r.hset("h3", mapping={"a": 1, "b": 2})
    assert r.hgetall("h3") == {b"a": b"1", b"b": b"2"}
    r.zadd("z3", {"m": 1.5})
    assert r.zscore("z3", "m") == 1.5
    r.sadd("s3", "x")
    assert r.smembers("s3") == {b"x"}
    r.execute_command("CLIENT", "TRACKING", "ON")
    r.get("tracked")
    other.set("tracked", "changed")  # the server pushes an invalidation to r
    time.sleep(0.1)
    assert r.ping()
    r.close()
    other.close()

    an = relay.analyze()
    assert an.warnings == []
    assert an.pushes >= 1
    methods = [q.method for q in an.requests]
    assert "HELLO" in methods
    ours = _ours(an, "HSET")
    assert [q.method for q in ours] == ["HSET", "HGETALL", "ZADD", "ZSCORE", "SADD", "SMEMBERS",
                                        "CLIENT TRACKING", "GET", "PING"]
    _check_times(an, relay)
    assert all(q.last_byte_ns is not None for q in an.requests)
    bytewise = relay.analyze(bytewise=True)
    assert [q.to_json() for q in bytewise.requests] == [q.to_json() for q in an.requests]
    assert bytewise.pushes == an.pushes


@pytest.mark.slow
def test_real_redis_pubsub(redis_port: int) -> None:
    relay = Relay(("127.0.0.1", redis_port))
    r = redis.Redis(host="127.0.0.1", port=relay.port, socket_timeout=10)
    publisher = redis.Redis(host="127.0.0.1", port=redis_port)
    ps = r.pubsub()  # the only connection r makes
    ps.subscribe("ch1", "ch2")
    for _ in range(2):
        assert ps.get_message(timeout=5)["type"] == "subscribe"
    publisher.publish("ch1", "hello")
    msg = ps.get_message(timeout=5)
    assert msg is not None and msg["data"] == b"hello"
    ps.unsubscribe()
    for _ in range(2):
        assert ps.get_message(timeout=5)["type"] == "unsubscribe"
    ps.close()
    r.close()
    publisher.close()

    an = relay.analyze()
    assert an.warnings == []
    ours = _ours(an, "SUBSCRIBE")
    assert [(q.method, q.path) for q in ours] == [("SUBSCRIBE", "ch1"), ("UNSUBSCRIBE", None)]
    assert all(q.first_byte_ns is not None for q in ours)
    assert an.pushes == 2  # the message and the second unsubscribe confirmation
