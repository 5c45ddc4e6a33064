"""What a ``Welcome`` tells every client about the daemon: the dataset it serves and how it deals epochs."""

import dataclasses
import json

import xxhash

from loader.daemon.config import LoaderConfig
from loader.daemon.link_serving import LinkServing
from loader.daemon.resident import ResidentData
from loader.format.aggregates import dataset_cache
from loader.format.dataset import Dataset, manifest_checksum
from proto.messages import DatasetInfo

__all__ = ["dataset_info", "dealing_fingerprint"]


def dealing_fingerprint(dataset: Dataset, config: LoaderConfig, mode_summary: str) -> str:
    """What decides an epoch's batches (``Welcome.dealing``): the daemons of one job must agree on it, or
    their ranks would train different epochs or take different step counts (and hang in DDP)."""
    deciding = {"dataset": manifest_checksum(dataset.manifest.to_json()), "mode": config.loader.mode,
                "grouping": mode_summary, "sampler": dataclasses.asdict(config.sampler),
                "passes": config.hierarchy.passes, "schedule": config.hierarchy.schedule}
    return xxhash.xxh3_64(json.dumps(deciding, sort_keys=True, default=str).encode()).hexdigest()


def dataset_info(dataset: Dataset, resident: ResidentData, config: LoaderConfig, link: LinkServing | None = None,
                 link_order: str = "shuffled") -> DatasetInfo:
    """``Welcome.dataset``: the shapes a trainer builds its model and its loop from (with ``link``, a link dataset's
    task and pair counts, and ``link_order``, the order the mode trains its edges in)."""
    m, s = dataset.manifest, config.sampler
    cache = dataset_cache(dataset) if s.aggregation_cache else None
    positives = [] if link is None else [link.train_positives, link.held_out["val"].num_positives,
                                         link.held_out["test"].num_positives]
    return DatasetInfo(name=dataset.path.name, num_nodes=m.num_nodes, num_features=m.feat_dim,
                       feature_dtype=m.value_dtype.name, num_classes=m.num_classes, num_hops=len(s.fanouts),
                       fanouts=list(s.fanouts), eval_fanouts=list(s.eval_fanouts), batch_size=s.batch_size,
                       train_nodes=len(resident.split_ids["train"]), val_nodes=len(resident.split_ids["val"]),
                       test_nodes=len(resident.split_ids["test"]), mode=config.loader.mode,
                       aggregation="" if cache is None else cache.kind, eval_aggregation=s.eval_aggregated,
                       task="node" if link is None else "link", link_negatives=0 if link is None else link.negatives,
                       link_disjoint=link is not None and link.disjoint,
                       link_eval_negatives=0 if link is None else link.eval_negatives, link_positives=positives,
                       link_order=link_order)
