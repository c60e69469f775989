"""``--executor dask``: one task per (capture set, flow shard) on a dask.distributed cluster.

The scheduler is ``--scheduler`` (an address such as ``tcp://10.0.0.5:8786``, or the
JSON file ``dask scheduler --scheduler-file F`` writes), else
``$NETDIAG_DASK_SCHEDULER``, else a ``LocalCluster`` started here (one single-threaded
worker process per CPU, or ``--workers``) and closed at the end.

Each task (:func:`netdiag.fleet.tasks.run_task`) opens its files itself (local paths
where the workers see the same files, URLs through fsspec anywhere) and returns its
records packed. A task whose worker dies is run again elsewhere by the scheduler; a
task that raises is retried ``retries`` times. Results are taken as they complete
(the progress bar follows them) and handed to the merge set by set in key order, so
that the report does not depend on which worker finished first. Ctrl-C cancels every
task and closes the client (and the local cluster).
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import uuid
from collections.abc import Iterator
from typing import Any

from netdiag.errors import SchedulerError
from netdiag.fleet.engine import Feed, FleetOptions, Progress
from netdiag.fleet.sets import Plan
from netdiag.fleet.tasks import (
    PLAIN,
    SEQUENTIAL,
    SHARD,
    SetTask,
    feed_plain,
    prepare_shards,
    replay_prepared,
    run_task,
    task_options,
)
from netdiag.pipeline import Options

SCHEDULER_ENV = "NETDIAG_DASK_SCHEDULER"
CONNECT_TIMEOUT_S = 10.0
"""How long to try to reach a scheduler before saying it cannot be reached
(``$NETDIAG_DASK_CONNECT_TIMEOUT`` seconds, when set)."""
TIMEOUT_ENV = "NETDIAG_DASK_CONNECT_TIMEOUT"
AUTO_SHARD_MIN_BYTES = 64 << 20
"""Sets smaller than this (as stored) are one task each unless ``--jobs`` says otherwise."""


def connect(scheduler: str | None, workers: int | None) -> tuple[Any, Any]:
    """``(client, cluster or None)``: to the scheduler named, or to a new local cluster."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise SchedulerError("--executor dask needs dask.distributed: "
                             "pip install 'netdiag[scale]'") from None
    address = scheduler or os.environ.get(SCHEDULER_ENV) or None
    if address is None:
        from netdiag.shard import available_cpus

        cluster = LocalCluster(n_workers=workers or available_cpus(), threads_per_worker=1,
                               processes=True, dashboard_address=None,
                               silence_logs=logging.ERROR)
        try:
            return Client(cluster, set_as_default=False), cluster
        except BaseException:
            cluster.close()
            raise
    kwargs: dict[str, Any]
    if "://" not in address and os.path.isfile(address):
        kwargs = {"scheduler_file": address}
    elif "://" not in address and address.endswith(".json"):
        raise SchedulerError(f"Dask scheduler file {address} does not exist")
    else:
        kwargs = {"address": address}
    try:
        client = Client(**kwargs, timeout=_connect_timeout(), set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise SchedulerError(f"cannot reach the Dask scheduler at {address}: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                             ) from None
    return client, None


def _connect_timeout() -> float:
    try:
        return max(0.1, float(os.environ.get(TIMEOUT_ENV, CONNECT_TIMEOUT_S)))
    except ValueError:
        return CONNECT_TIMEOUT_S


def shards_for(size: int, jobs: int | None, threads: int, sets: int) -> int:
    """Flow shards of one set: ``--jobs`` when given; else enough to keep every worker
    thread busy when there are fewer sets than threads, 1 for small sets."""
    if jobs:
        return jobs
    if size < AUTO_SHARD_MIN_BYTES or sets >= threads:
        return 1
    return max(1, min(threads, -(-threads // sets)))


def dask_feeds(plan: Plan, options: Options, fleet: FleetOptions,
               render: bool) -> Iterator[tuple[int, Feed]]:
    """The sets' results in key order, as their tasks complete on the cluster."""
    from distributed import as_completed

    client, cluster = connect(fleet.scheduler, fleet.workers)
    futures: list[Any] = []
    try:
        threads = sum(client.nthreads().values()) or 1
        plain, keylog = task_options(options)
        token = uuid.uuid4().hex[:8]
        sets = plan.sets
        n_of = [shards_for(s.size, fleet.jobs, threads, len(sets)) for s in sets]
        sizes = [s.size for s in sets]
        total = sum(sizes)

        def submit(i: int, k: int, n: int) -> Any:
            task = SetTask(set_index=i, paths=sets[i].paths, options=plain, keylog=keylog,
                           shard=k, shards=n, render=render)
            fut = client.submit(run_task, task, key=f"netdiag-{token}-set{i}-{k}of{n}",
                                retries=fleet.retries, pure=False, priority=len(sets) - i)
            futures.append(fut)
            return fut

        for i in range(len(sets)):
            for k in range(n_of[i]):
                submit(i, k, n_of[i])
        finished = [0] * len(sets)
        """Tasks of each set's current run that have completed."""
        got: dict[int, list[tuple[Any, ...]]] = {}
        ready: dict[int, Feed] = {}
        following = 0
        queue = as_completed(list(futures), loop=client.loop)
        for fut in queue:
            data = fut.result()
            fut.release()
            collecting = gc.isenabled()
            gc.disable()  # unpickling makes many objects and no garbage
            try:
                payload = pickle.loads(data)
            finally:
                if collecting:
                    gc.enable()
            del data
            kind, i = payload[0], payload[1]
            if kind == SEQUENTIAL:
                # only one process can be exact: the set again, as one task
                n_of[i] = 1
                finished[i] = 0
                got.pop(i, None)
                queue.add(submit(i, 0, 1))
                continue
            if kind == PLAIN and n_of[i] == 1:
                ready[i] = _plain_feed(payload, options)
            elif kind == SHARD and n_of[i] > 1:
                got.setdefault(i, []).append(payload)
                if len(got[i]) == n_of[i]:
                    prepared = prepare_shards(got.pop(i))
                    if prepared is None:
                        n_of[i] = 1
                        finished[i] = -1  # counted again from the rerun's end
                        queue.add(submit(i, 0, 1))
                    else:
                        ready[i] = _shard_feed(prepared, options)
            else:
                continue  # a result of a run since superseded
            finished[i] += 1
            if fleet.progress is not None:
                done = sum(size * max(0, min(f, n)) // n
                           for size, f, n in zip(sizes, finished, n_of, strict=True))
                fleet.progress(Progress(sum(f >= n for f, n in zip(finished, n_of, strict=True)),
                                        len(sets), done, total))
            while following in ready:
                yield following, ready.pop(following)
                following += 1
    except BaseException:
        if futures:
            client.cancel(futures, force=True)
        raise
    finally:
        futures.clear()
        client.close()
        if cluster is not None:
            cluster.close()


def _plain_feed(payload: tuple[Any, ...], options: Options) -> Feed:
    def feed(sink: Any) -> Any:
        return feed_plain(payload, sink, options)

    return feed


def _shard_feed(prepared: Any, options: Options) -> Feed:
    def feed(sink: Any) -> Any:
        return replay_prepared(prepared, sink, options)

    return feed
