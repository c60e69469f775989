"""Fleets of captures: many files, many hosts, more than one machine (``docs/scale.md``).

* :mod:`netdiag.fleet.inputs`: files, folders, globs and URLs -> capture files;
* :mod:`netdiag.fleet.sets`: capture files -> capture sets (one source, continuous in time);
* :mod:`netdiag.fleet.engine`: the sets analyzed (serial, local pool, Dask) and merged;
* :mod:`netdiag.fleet.tasks`: the unit of work a worker runs;
* :mod:`netdiag.fleet.dask_executor`: the Dask scheduler, tasks, retries, cancellation;
* :mod:`netdiag.fleet.sketch`: mergeable percentiles (DDSketch) for records that do
  not fit;
* :mod:`netdiag.fleet.render`: the groups in the terminal and in CSV.
"""

from __future__ import annotations

from netdiag.errors import CaptureFormatError
from netdiag.fleet.sets import DEFAULT_GAP_NS, CaptureFile, CaptureSet, Plan, plan_sets, probe_files

ONE_SET_KEY = "all"
"""The key of the one set of ``--one-set``."""


def make_plan(files: list[str], explicit: set[str] | frozenset[str] = frozenset(),
              gap_ns: int = DEFAULT_GAP_NS, probe: bool = True, one_set: bool = False) -> Plan:
    """The capture sets of ``files``. ``probe=False`` with one file, or with ``one_set``:
    one set of them all (in the order given), without reading them here. A file named in
    ``explicit`` whose header cannot be read is an input error (as for a single capture);
    one found in a folder is reported damaged."""
    if not probe and (one_set or len(files) == 1):
        key = ONE_SET_KEY if len(files) > 1 else files[0]
        return Plan(sets=[CaptureSet(key=key, host=key, files=[
            CaptureFile(name=n, index=i) for i, n in enumerate(files)])])
    infos = probe_files(files)
    for info in infos:
        if info.error is not None and (info.name in explicit or len(infos) == 1):
            raise CaptureFormatError(info.error)
    if one_set:
        good = [f for f in infos if f.error is None]
        key = ONE_SET_KEY if len(files) > 1 else files[0]
        return Plan(sets=[CaptureSet(key=key, host=key, files=good)] if good else [],
                    damaged=[f for f in infos if f.error is not None])
    return plan_sets(infos, gap_ns)


__all__ = ["CaptureFile", "CaptureSet", "Plan", "make_plan"]
