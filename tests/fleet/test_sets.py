"""Grouping files into capture sets: name patterns, pcapng metadata, time adjacency; the
cheap probe (first and last packet times) and the input expansion (folders, globs)."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import fleetcaps as fc
import jobs_capture as gen
import pytest

from netdiag.capture.reader import CaptureReader
from netdiag.capture.sources import open_capture
from netdiag.errors import NoCaptureError, UrlError
from netdiag.fleet import make_plan
from netdiag.fleet.inputs import expand_inputs
from netdiag.fleet.sets import CaptureFile, name_pattern, plan_sets, probe_file

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"
S = 1_000_000_000


@pytest.mark.parametrize(("name", "pattern"), [
    ("ring_00001_20261201093000.pcapng", "ring_*.pcapng"),  # dumpcap -b files:N
    ("ring_00002_20261201093100.pcapng.gz", "ring_*.pcapng"),  # compressed later
    ("1764425767.pcap", "*.pcap"),  # tcpdump -G 60 -w %s.pcap
    ("trace.pcap12", "trace.pcap*"),  # tcpdump -C
    ("b-00002.pcapng", "b-*.pcapng"),  # netdiag capture --rotate-*
    ("cap_2026-12-01_09-30-00.pcap", "cap_*.pcap"),
    ("cap-2026-12-01T09:30:00Z.pcap", "cap-*.pcap"),
    ("edge-20261201T093000Z.pcapng", "edge-*.pcapng"),
    ("trace.1.pcap", "trace.*.pcap"),
    ("trace_7.pcap", "trace_*.pcap"),
    ("web01_00001.pcap", "web01_*.pcap"),  # digits glued to a name are the name
    ("node-1.pcap", "node-1.pcap"),
    ("rack10-20.pcap", "rack10-20.pcap"),
    ("10.0.0.5_00001.pcap", "10.0.0.5_*.pcap"),
    ("antho.pcapng", "antho.pcapng"),
    ("dump", "dump"),
])
def test_name_patterns(name: str, pattern: str) -> None:
    assert name_pattern(name) == pattern


def _f(name: str, index: int, first: float | None, last: float | None, **meta: object
       ) -> CaptureFile:
    return CaptureFile(name=name, index=index,
                       first_ns=None if first is None else int(first * S),
                       last_ns=None if last is None else int(last * S), **meta)  # type: ignore[arg-type]


def test_rotated_files_of_one_host_are_one_set() -> None:
    files = [_f(f"caps/host-a/ring_0000{i}_2026120109{i}000.pcapng", i, 60 * i, 60 * i + 59.9)
             for i in range(1, 6)]
    plan = plan_sets(files)
    assert [(s.key, len(s.files)) for s in plan.sets] == [("ring_*.pcapng", 5)]


def test_hosts_by_folder_are_independent_sets() -> None:
    files = [_f(f"caps/host-{h}/ring_0000{i}_20261201.pcapng", 3 * k + i, 60 * i, 60 * i + 59)
             for k, h in enumerate("ba") for i in range(1, 3)]
    plan = plan_sets(files)
    assert [s.key for s in plan.sets] == ["host-a/ring_*.pcapng", "host-b/ring_*.pcapng"]
    assert all(len(s.files) == 2 for s in plan.sets)
    assert [f.index for f in plan.sets[1].files] == [1, 2]  # given order within a set


def test_a_gap_starts_a_new_set() -> None:
    files = [_f("ring_00001.pcap", 0, 0, 100), _f("ring_00002.pcap", 1, 100.5, 200),
             _f("ring_00003.pcap", 2, 200 + 301, 600)]
    plan = plan_sets(files)
    assert [(s.key, [f.index for f in s.files]) for s in plan.sets] == [
        ("ring_*.pcap #1", [0, 1]), ("ring_*.pcap #2", [2])]
    assert len(plan_sets(files, gap_ns=400 * S).sets) == 1
    # an unknown end (beyond the scan limit) continues into the next file
    files[1].last_ns = None
    assert len(plan_sets(files).sets) == 1


def test_overlapping_files_merge_and_empty_ones_stand_alone() -> None:
    files = [_f("two.0.pcap", 0, 0, 100), _f("two.1.pcap", 1, 0.5, 100.5),
             _f("two.2.pcap", 2, None, None)]
    plan = plan_sets(files)
    assert [[f.index for f in s.files] for s in plan.sets] == [[0, 1], [2]]


def test_pcapng_metadata_tells_sources_apart() -> None:
    def meta(if_name: str, hw: str = "x86") -> dict[str, object]:
        return {"section": {"shb_hardware": hw, "shb_os": "Linux 6.1",
                            "shb_userappl": "Dumpcap 4.2"},
                "interfaces": [{"if_name": if_name}]}

    files = [_f("ring_00001.pcapng", 0, 0, 10, **meta("eth0")),
             _f("ring_00001_x.pcapng", 9, 0, 10, **meta("eth0")),
             _f("ring_00002.pcapng", 1, 10, 20, **meta("eth0")),
             _f("ring_00003.pcapng", 2, 0, 10, **meta("eth1")),
             _f("ring_00004.pcapng", 3, 10, 20, **meta("eth1")),
             _f("ring_00005.pcapng", 4, 0, 10, **meta("eth0", hw="arm64"))]
    plan = plan_sets(files)
    got = sorted((s.key, tuple(f.index for f in s.files)) for s in plan.sets)
    assert got == [
        ("ring_*.pcapng [eth0; arm64; Linux 6.1; Dumpcap 4.2]", (4,)),
        ("ring_*.pcapng [eth0; x86; Linux 6.1; Dumpcap 4.2]", (0, 1)),
        ("ring_*.pcapng [eth1; x86; Linux 6.1; Dumpcap 4.2]", (2, 3)),
        ("ring_00001_x.pcapng", (9,))]


# -- the probe ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sets") / "mixed.pcap"
    gen.write_mixed(path, 300, seed=3)
    return path


def _times(path: Path) -> tuple[int, int]:
    pkts = fc.read_packets(path)
    return pkts[0][0], pkts[-1][0]


def test_probe_reads_the_last_time_from_the_end(mixed: Path, tmp_path: Path) -> None:
    first, last = _times(mixed)
    ng = tmp_path / "x.pcapng"
    ng.write_bytes(fc.pcapng_bytes(fc.read_packets(mixed), hardware="hw", os_name="os",
                                   if_name="eth9", if_description="uplink"))
    gz = tmp_path / "x.pcapng.gz"
    gz.write_bytes(gzip.compress(ng.read_bytes()))
    for path in (mixed, ng, gz):
        info = probe_file(str(path))
        assert (info.first_ns, info.last_ns, info.last_known) == (first, last, True), path
    for path in (mixed, ng):  # from the end alone: no scan allowed
        assert probe_file(str(path), scan_limit=0).last_ns == last
    info = probe_file(str(ng))
    assert info.section == {"shb_hardware": "hw", "shb_os": "os", "shb_userappl": "fleetcaps"}
    assert info.interfaces == [{"if_name": "eth9", "if_description": "uplink"}]
    assert probe_file(str(gz)).compressed
    # the scan bound: a compressed file's end is not looked for beyond it
    info = probe_file(str(gz), scan_limit=1000)
    assert info.last_ns is None and not info.last_known


def test_tail_time_of_pcap_and_pcapng(mixed: Path) -> None:
    data = mixed.read_bytes()
    first, last = _times(mixed)
    with CaptureReader(mixed) as r:
        assert r.tail_time_ns(data[-5000:], first) == last
        assert r.tail_time_ns(data[-5000:-3], first) is None  # cut: not to the end
        assert r.tail_time_ns(b"\0" * 100, first) is None
    ng = fc.pcapng_bytes(fc.read_packets(mixed))
    with CaptureReader("x.pcapng", fileobj=io.BytesIO(ng)) as r:
        next(iter(r.packets()))
        assert r.tail_time_ns(ng[-3000:], first) == last
        assert r.tail_time_ns(ng[-3000:-4], first) is None


def test_probe_of_a_damaged_end_scans(mixed: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(mixed.read_bytes()[:-7])
    info = probe_file(str(cut))
    assert info.last_ns == fc.read_packets(cut)[-1][0]


def test_reader_from_a_file_object_equals_the_path(mixed: Path) -> None:
    data = mixed.read_bytes()
    for raw in (data, gzip.compress(data), data[:-7]):
        path = mixed.with_name("copy.pcap")
        path.write_bytes(raw)
        with CaptureReader(path) as a, CaptureReader(str(path), fileobj=io.BytesIO(raw)) as b:
            assert list(a.packets()) == list(b.packets())
            assert a.warnings == b.warnings and a.truncated == b.truncated
            assert a.progress() == b.progress()

    class Failing(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            if self.tell() > 1000:
                raise RuntimeError("connection reset by the object store")
            return super().read(n)

    with CaptureReader("remote.pcap", fileobj=Failing(data)) as r:
        n = sum(1 for _ in r.packets())
    assert r.truncated and n < len(fc.read_packets(mixed))
    assert "RuntimeError: connection reset by the object store" in r.warnings[-1].message


# -- inputs ----------------------------------------------------------------------------------

def test_folders_recursively_skip_what_is_not_a_capture(mixed: Path, tmp_path: Path) -> None:
    caps = tmp_path / "caps"
    (caps / "host-a" / "deep").mkdir(parents=True)
    (caps / "host-b").mkdir()
    (caps / "host-a" / "deep" / "a.pcap").write_bytes(mixed.read_bytes())
    (caps / "host-b" / "b.pcap.gz").write_bytes(gzip.compress(mixed.read_bytes()))
    (caps / "host-b" / "notes.txt").write_text("not a capture")
    (caps / "README.gz").write_bytes(gzip.compress(b"text"))
    (caps / ".partial.pcap").write_bytes(mixed.read_bytes())  # hidden: skipped silently
    got = expand_inputs([str(caps)])
    assert got.files == [str(caps / "host-a" / "deep" / "a.pcap"),
                         str(caps / "host-b" / "b.pcap.gz")]
    assert len(got.notes) == 1 and "skipped 2 files" in got.notes[0]
    glob = expand_inputs([str(caps / "*" / "*.pcap*")])
    assert glob.files == [str(caps / "host-b" / "b.pcap.gz")]
    assert expand_inputs([str(caps / "**" / "*.pcap")]).files == [
        str(caps / "host-a" / "deep" / "a.pcap")]
    explicit = expand_inputs([str(mixed), str(mixed)])  # named twice: read twice
    assert explicit.files == [str(mixed)] * 2 and explicit.explicit == {str(mixed)}


def test_empty_folders_globs_and_bad_urls_are_input_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoCaptureError, match="no pcap or pcapng capture"):
        expand_inputs([str(tmp_path / "empty")])
    with pytest.raises(NoCaptureError, match="no file matches"):
        expand_inputs([str(tmp_path / "*.pcap")])
    with pytest.raises(UrlError, match="unknown URL scheme 'bogus'"):
        expand_inputs(["bogus://bucket/x.pcap"])
    missing = _a_missing_backend()
    with pytest.raises(UrlError, match=missing):
        open_capture(f"{missing}://bucket/x.pcap")


def _a_missing_backend() -> str:
    """A scheme fsspec knows whose backend is not installed here (no network tried)."""
    fsspec = pytest.importorskip("fsspec")
    from fsspec.registry import known_implementations

    for proto in sorted(known_implementations):
        if not proto.isalpha():
            continue
        try:
            fsspec.get_filesystem_class(proto)
        except ImportError:
            return str(proto)
        except Exception:  # anything else: not a clean candidate
            continue
    pytest.skip("every backend fsspec knows is installed")


def test_a_damaged_header_in_a_folder_is_reported_not_fatal(mixed: Path, tmp_path: Path) -> None:
    bad = tmp_path / "ring_00002.pcap"
    bad.write_bytes(mixed.read_bytes()[:20])  # magic, then the header cut
    good = tmp_path / "ring_00001.pcap"
    good.write_bytes(mixed.read_bytes())
    plan = make_plan([str(good), str(bad)])
    assert [f.name for f in plan.damaged] == [str(bad)]
    assert plan.sets[0].paths == [str(good)]
    from netdiag.errors import CaptureFormatError

    with pytest.raises(CaptureFormatError):
        make_plan([str(good), str(bad)], explicit={str(bad)})
