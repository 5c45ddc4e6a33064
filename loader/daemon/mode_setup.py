"""The first half of the daemon's startup: from a config to the ``ModeSetup`` its mode opens with.

Open the dataset (manifest, file sizes), load the node arrays (their read checks with them), check
``indptr.npy`` whole, take one pilot sample and size the clients' slots, and open the aggregation cache's
reader where ``[sampler] aggregation_cache`` asks for it (``ServingContext.close`` closes it). It holds no
socket, no port and no shared memory, so ``serve`` (``Daemon.startup``) and ``serve --check`` (``check.py``) run the
same steps and refuse the same datasets with the same lines.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from loader.daemon.aggregate_rows import AggregateRows, AggregationEstimate, require_cache
from loader.daemon.config import LoaderConfig
from loader.daemon.link_serving import link_problem, load_link_serving
from loader.daemon.metrics import DaemonMetrics
from loader.daemon.mode import ModeSetup
from loader.daemon.modes import mode_class
from loader.daemon.resident import load_resident
from loader.daemon.serving import ServingContext
from loader.daemon.slot_sizing import estimate_slot_bytes, pilot_batch_sizes, size_sessions
from loader.format.aggregates import dataset_cache
from loader.format.dataset import check_file_sizes, open_dataset
from proto.errors import UserError

__all__ = ["prepare_setup"]


def prepare_setup(config: LoaderConfig, metrics: DaemonMetrics, cpu_pool: ThreadPoolExecutor) -> ModeSetup:
    """What ``config``'s mode is opened (or planned) with; UserError naming the file or key that is unusable."""
    dataset = open_dataset(config.dataset.path)
    check_file_sizes(dataset)
    m = dataset.manifest
    problem = link_problem(dataset, config)
    if problem is not None:
        raise UserError(problem)
    resident = load_resident(dataset, with_static=mode_class(config.loader.mode).loads_static_cache(config))
    dataset.check_whole("indptr")  # the pilot below maps it, and every mode's sampler trusts it
    cache = require_cache(dataset) if config.sampler.aggregation_cache else dataset_cache(dataset)
    link = load_link_serving(dataset, config)
    if link is not None:
        cache = None  # a link model reads no x_agg: no cost model to price
    # one pilot sample sizes the slots and every memory plan (and, with a cache, prices it)
    pilot = pilot_batch_sizes(dataset, resident, config.sampler, full_hops=cache is not None, link=link)
    if config.publisher.slot_bytes is not None:
        slot_bytes = config.publisher.slot_bytes
    else:
        slot_bytes = estimate_slot_bytes(dataset, pilot, config.sampler,
                                         class_weights=config.hierarchy.label_prior_loss)
    sessions = size_sessions(config.memory.budget, slot_bytes, config.publisher.slots, config.server.max_clients)
    estimate = None
    if cache is not None and pilot.full_nodes_per_hop is not None:
        estimate = AggregationEstimate(cache.kind, pilot.full_nodes_per_hop, m.row_bytes)
    aggregates = None
    if cache is not None and config.sampler.aggregation_cache:
        aggregates = AggregateRows(dataset, cache, config.io, metrics)
    serving = ServingContext(config, metrics, cpu_pool, resident.labels, resident.split_ids, m.feat_dim,
                             np.dtype(m.feat_dtype.value), aggregates, estimate, link, dataset.feature_codec())
    return ModeSetup(dataset, resident, sessions, pilot, serving)
