"""The hierarchical mode (HierBatching): mega-batches of random partitions, read whole, sampled in RAM.

``HierarchicalMode`` sizes the static cache and the mega-batch (``memplan``), owns the feature
arena and the partition reader for the daemon's life, and starts the scheduler -> reader ->
assembler -> sampler stages of a training stream (``pipeline``). Evaluation batches are sampled
over the whole graph (they must see every neighbour) through checked preads of ``indices.npy`` and
``features.bin`` (``DiskGraph``, no neighbour cache), opened at startup and charged to the memory plan:
a memory map would serve a flipped byte unchecked and kill the daemon when the file shrinks.
"""

import logging
from dataclasses import replace

import numpy as np

from loader.daemon.config import LoaderConfig
from loader.daemon.disk_graph import DiskGraph, disk_eval, eval_graph_bytes
from loader.daemon.eval_stream import EvalAccess
from loader.daemon.hierarchical.arena import FeatureArena
from loader.daemon.hierarchical.assemble import group_static_lists
from loader.daemon.hierarchical.assembly_kernels import static_sources_by_prefix
from loader.daemon.hierarchical.coverage import QualityKnobs, expected_edge_coverage, static_cut_share
from loader.daemon.hierarchical.memplan import HierarchicalBudget, plan_memory, plan_with_static
from loader.daemon.hierarchical.pipeline import PipelineContext, start_train_pipeline
from loader.daemon.hierarchical.reader import PartitionReader
from loader.daemon.hierarchical.schedule import train_label_counts
from loader.daemon.hierarchical.swap_schedule import swap_refusal
from loader.daemon.link_serving import LINK_PASS_BATCHES, buffer_order_warning, check_buffer
from loader.daemon.mode import ModeSetup, TrainingMode
from loader.daemon.read_metrics import STARTUP
from loader.daemon.resident import ResidentData
from loader.daemon.stages import TrainPipeline
from loader.format.partition_count import auto_partitions
from loader.format.read_checks import load_read_checks
from loader.sampling.ranks import LocalRanks
from proto.errors import UserError

__all__ = ["HierarchicalMode"]

log = logging.getLogger("megabatch.hierarchical")


class HierarchicalMode(TrainingMode):
    """Two mega-batch buffers and the static cache in one arena, filled by whole-partition reads."""

    name = "hierarchical"
    measures_quality = True
    """Coverage and label skew per mega-batch and per epoch (``coverage.py``)."""

    @classmethod
    def open(cls, setup: ModeSetup) -> "HierarchicalMode":
        return cls(setup)

    @classmethod
    def plan_budget(cls, setup: ModeSetup) -> HierarchicalBudget:
        return _plan_budget(setup)[0]

    @classmethod
    def loads_static_cache(cls, config: LoaderConfig) -> bool:
        """The static cache is this mode's (``[hierarchy] static_cache``, all or "auto"'s share of it)."""
        return config.hierarchy.static_cache is not False

    def cross_machine_problem(self) -> str | None:
        if self._serving.config.hierarchy.passes is None:
            # every machine must deal the same number of steps, and passes = "auto" decides per machine
            return ("set [hierarchy] passes to a number on every daemon (\"auto\" decides per machine, and the "
                    "machines' step counts would differ)")
        return None

    def __init__(self, setup: ModeSetup) -> None:
        serving, dataset = setup.serving, setup.dataset
        cfg, m = serving.config, dataset.manifest
        plan, resident = _plan_budget(setup)
        self.budget_plan: HierarchicalBudget = plan
        self._serving = serving
        parts, train = resident.partitions, resident.split_ids["train"]
        held = serving.aggregates
        # the static nodes' aggregate rows are read once, by id, beside their features
        fill = None if held is None else held.for_purpose(STARTUP).fill
        arena = FeatureArena(resident.static, m.row_bytes, plan.buffer, np.dtype(m.index_dtype.value), fill)
        # the arena holds the static rows now; keep only the (0, D) shape of the loaded copy, and the lists grouped
        # for the assembler
        static_rows = resident.static.num_nodes
        resident = replace(resident, static=replace(group_static_lists(resident.static),
                                                    features=resident.static.features[:0]))
        try:
            # the block tables are the evaluation reader's: training reads whole partitions, checked per partition
            checks = load_read_checks(dataset, blocks=True) if cfg.io.check_reads else None
            reader = PartitionReader(dataset, arena, parts, serving.metrics, direct_io=cfg.io.direct_io,
                                     threads=cfg.io.read_threads, read_block=cfg.io.read_block, checks=checks,
                                     aggregates=held)
        except BaseException:
            arena.close()
            raise
        try:
            # no neighbour cache: the budget goes to the mega-batches, and evaluation runs once an epoch
            self.eval_graph = DiskGraph(dataset, cfg.io, serving.metrics, checks=checks, count_cache=False)
        except BaseException:
            reader.close()
            arena.close()
            raise
        knobs = QualityKnobs(schedule_balanced=cfg.hierarchy.schedule == "balanced",
                             fraction_auto=cfg.hierarchy.megabatch_fraction is None,
                             whole_graph=plan.buffer.partitions >= len(parts),
                             static_cache_off=cfg.hierarchy.static_cache is False, partitions=len(parts),
                             advised_partitions=auto_partitions(m.num_nodes, m.num_nodes * m.row_bytes),
                             float32_features=m.feat_dtype.value == "float32")
        self.context = PipelineContext(cfg, resident, arena, reader, serving.metrics, serving.cpu_pool,
                                       plan.buffer.partitions, train_label_counts(parts, train, resident.labels),
                                       knobs, link=serving.link, codec=serving.codec)
        serving.metrics.static_nodes.set(static_rows)
        serving.metrics.static_bytes.set(arena.static_bytes)

    def link_order(self) -> str:
        """``[link] order`` where the buffer holds fewer than every partition; a buffer of all trains the shuffled
        order."""
        link, per = self.context.link, self.budget_plan.buffer.partitions
        if link is None or per >= len(self.context.resident.partitions):
            return "shuffled"
        return link.order

    def summary(self) -> str:
        per, total = self.budget_plan.buffer.partitions, len(self.context.resident.partitions)
        order = self.link_order()
        if order != "shuffled":
            return f"link prediction in {order} order, a buffer of {per} of {total} partitions"
        if self.context.config.hierarchy.formation == "comet" and per < total:
            return f"{total} partitions, a buffer of {per} swapping one logical partition at a time"
        return f"{total} partitions, {per} per mega-batch"

    def start_pipeline(self, start_epoch: int, local: LocalRanks) -> TrainPipeline:
        return start_train_pipeline(self.context, start_epoch, local)

    def eval_access(self) -> EvalAccess:
        return disk_eval(self.eval_graph, self._serving)

    def close(self) -> None:
        self.eval_graph.close()
        self.context.reader.close()
        self.context.arena.close()


def _plan_budget(setup: ModeSetup) -> tuple[HierarchicalBudget, ResidentData]:
    """The memory plan, and the resident data with the static cache it keeps (``static_cache = "auto"``
    keeps a prefix of the prepared static nodes by in-degree)."""
    cfg, m, resident = setup.serving.config, setup.dataset.manifest, setup.resident
    index_itemsize = np.dtype(m.index_dtype.value).itemsize
    # a pass's batches are bounded by full-graph batches (a mega-batch only has fewer neighbours)
    batch = setup.pilot.train_or_zero
    evaluation = setup.pilot.eval
    eval_bytes = eval_graph_bytes(setup.dataset, cfg.io, 0 if evaluation is None else evaluation.nodes,
                                  cfg.sampler.sampled_eval_fanouts)
    parts = resident.partitions
    train_counts = parts.count_in(resident.split_ids["train"])

    def plan_for(static_nodes: int, static_edges: int, static_sources: int) -> HierarchicalBudget:
        return plan_memory(budget=cfg.memory.budget, num_nodes=m.num_nodes, partitions=parts,
                           fraction=cfg.hierarchy.megabatch_fraction, static_nodes=static_nodes,
                           # with the aggregation cache a static node holds its aggregate row beside its features
                           static_row_bytes=m.row_bytes * (2 if cfg.sampler.aggregation_cache else 1),
                           static_edges=static_edges, static_sources=static_sources,
                           index_itemsize=index_itemsize, sessions=setup.sessions, train_counts=train_counts,
                           batch_size=cfg.sampler.batch_size, batch_bytes=8 * batch.nodes + 16 * batch.edges,
                           eval_bytes=eval_bytes, aggregated=cfg.sampler.aggregation_cache, fixed=setup.fixed,
                           # a link state's batches are sampled and published in passes of at most this many
                           pass_batches=None if setup.serving.link is None else LINK_PASS_BATCHES)

    cut, cut_edges = m.edge_cut.fraction, m.edge_cut.edges
    static = resident.static
    if setup.serving.link is not None:
        # a link dataset's buffer states are defined on the subgraph their partitions induce: no static node joins
        static = static.select(np.zeros(0, dtype=np.int64))
        resident = replace(resident, static=static)
    static_cut = static.cut_in_degree(parts)
    if setup.serving.link is not None:
        plan = plan_for(0, 0, 0)
        problem = check_buffer(setup.serving.link, m.num_partitions, plan.buffer.partitions)
        if problem is not None:
            raise UserError(problem)
        warning = buffer_order_warning(setup.serving.link, m.num_partitions, plan.buffer.partitions)
        if warning is not None:
            log.warning("%s", warning)
    elif cfg.hierarchy.static_cache is None:
        ranked = static.by_degree()
        rank = np.empty(static.num_nodes, dtype=np.int64)
        rank[ranked] = np.arange(static.num_nodes)
        plan = plan_with_static(plan_for, static_degrees=np.diff(static.indptr)[ranked],
                                static_cut_edges=static_cut[ranked],
                                static_sources=static_sources_by_prefix(static.indptr, static.indices, static.nodes,
                                                                        rank),
                                cut_edges=cut_edges, edge_cut=cut, num_partitions=m.num_partitions)
        log.info("static cache \"auto\": %s of %s prepared static nodes", f"{plan.static_nodes:,}",
                 f"{static.num_nodes:,}")
        kept = np.sort(ranked[:plan.static_nodes])  # select keeps ascending ids, so its rows in this order
        static, static_cut = static.select(kept), static_cut[kept]
        resident = replace(resident, static=static)
    else:
        every = np.zeros(static.num_nodes, dtype=np.int64)  # the whole cache: one prefix, ranks all below it
        plan = plan_for(static.num_nodes, len(static.indices),
                        int(static_sources_by_prefix(static.indptr, static.indices, static.nodes, every)[-1]))
    if setup.serving.link is None and cfg.hierarchy.formation == "comet":
        problem = swap_refusal(m.num_partitions, plan.buffer.partitions)
        if problem is not None:
            raise UserError(problem)
    static_share = static_cut_share(int(static_cut.sum()), cut_edges)
    expected = expected_edge_coverage(cut, m.num_partitions, plan.buffer.partitions, static_share)
    # an estimate, not a verdict: slot coverage (measured per epoch, and warned about) is higher where degrees
    # exceed the fanouts, so this line informs and never warns
    log.info("mega-batches of %d of %d partitions, %.1f%% of edges cut, %.1f%% of those leaving static nodes: "
             "about %.3f of in-edges kept", plan.buffer.partitions, m.num_partitions, 100 * cut,
             100 * static_share, expected)
    return plan, resident
