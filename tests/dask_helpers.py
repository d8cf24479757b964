"""A real ``dask.distributed`` cluster for the ``test_dask_*`` files: worker processes on
the loopback address, bounded in time, shut down at the end."""

import contextlib
import os
import sys

import cloudpickle
import dask


@contextlib.contextmanager
def local_client(module_name: str, n_workers: int = 2, config: dict | None = None,
                 **cluster_kwargs):
    """A client of a ``LocalCluster`` of ``n_workers`` processes with one thread each.

    The functions of the test module ``module_name`` travel by value: the
    worker processes cannot import a test file. ``config`` adds Dask settings
    (the nannies hand them to their workers).
    """
    from distributed import Client, LocalCluster

    cloudpickle.register_pickle_by_value(sys.modules[module_name])
    # each nanny sets its workers' environment (OMP_NUM_THREADS=1, ...) in this process's
    # os.environ before spawning them: the tests that follow must not inherit it
    environ = dict(os.environ)
    # a dead worker fails the test instead of being retried; no call waits forever
    settings = {"distributed.scheduler.allowed-failures": 0,
                "distributed.comm.timeouts.connect": "30s",
                "distributed.comm.timeouts.tcp": "60s", **(config or {})}
    with dask.config.set(settings):
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address=None, **cluster_kwargs)
        try:
            client = Client(cluster, timeout=60)
            try:
                yield client
            finally:
                client.close(timeout=30)
        finally:
            cluster.close(timeout=30)
            cloudpickle.unregister_pickle_by_value(sys.modules[module_name])
            os.environ.clear()
            os.environ.update(environ)
