"""The data plane: a logical sample order that is a pure function of (dataset ID, algorithm
version, seed, epoch, position), never of worker count, arrival order or world size.

See ``hpcrun/data/README.md`` for the composition and its invariants.
"""

from __future__ import annotations

from hpcrun.data.batches import LEDGER_DTYPE, DocStream, GlobalOrder, replica_for_rank, replica_rows
from hpcrun.data.build import BuildOptions, build_manifest
from hpcrun.data.cursor import CURSOR_KIND, DATA_ALGORITHM_VERSION, DataCursor, ResumeContract
from hpcrun.data.dataset import Dataset, Verify
from hpcrun.data.loader import LoaderMetrics, OrderedReader, RateCheck
from hpcrun.data.manifest import DatasetManifest
from hpcrun.data.mixture import Exhaustion, MixMode, MixState, Mixture, MixUnit
from hpcrun.data.packing import PackingPolicy, PackState, pack
from hpcrun.data.permutation import PERMUTATION_VERSION, Permutation
from hpcrun.data.pipeline import DataPipeline, MixtureSpec, sample_rng
from hpcrun.data.stream import ShuffleBufferStream
from hpcrun.data.synthetic import write_token_shards

GlobalBatches = DataPipeline
"""Alias: the pipeline yields this replica's slice of global batch k."""

__all__ = [
    "CURSOR_KIND", "DATA_ALGORITHM_VERSION", "LEDGER_DTYPE", "PERMUTATION_VERSION",
    "BuildOptions", "DataCursor", "DataPipeline", "Dataset", "DatasetManifest", "DocStream",
    "Exhaustion", "GlobalBatches", "GlobalOrder", "LoaderMetrics", "MixMode", "MixState",
    "MixUnit", "Mixture", "MixtureSpec", "OrderedReader", "PackState", "PackingPolicy",
    "Permutation", "RateCheck", "ResumeContract", "ShuffleBufferStream", "Verify",
    "build_manifest", "pack", "replica_for_rank", "replica_rows", "sample_rng",
    "write_token_shards",
]
