"""The data cursor: a compact, versioned position in the global order.

A cursor names the next global batch not yet delivered to the training loop, the packer
residual (draw and offset of the residual document), the mixture's realized counts, active set
and segment, each source's epoch, the algorithm version and the dataset ID, plus the layout it
assumes (seed, global batch, sequence length, packing, mixture configuration). It travels inside
a :class:`hpcrun.protocols.CursorEnvelope` and is saved and restored inside the checkpoint
commit. A restore checks dataset ID and algorithm version first and prints both sides on a
mismatch; a layout mismatch is refused the same way. The number of replicas is deliberately
*not* part of the layout: a restore on another world size continues the same global sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcrun.data.batches import OrderState
from hpcrun.data.mixture import MIXTURE_VERSION
from hpcrun.data.permutation import PERMUTATION_VERSION
from hpcrun.errors import DataError
from hpcrun.protocols import CursorEnvelope
from hpcrun.vocab import ResumeContract

__all__ = ["CURSOR_KIND", "DATA_ALGORITHM_VERSION", "DataCursor", "ResumeContract"]

CURSOR_KIND = "hpcrun.data.cursor"
"""``kind`` of every cursor envelope this module writes."""

DATA_ALGORITHM_VERSION = 1
"""Version of the whole order (permutation, mixture, packer, batch slicing). Bump it whenever
any of them changes an output; golden tests pin each part."""

assert PERMUTATION_VERSION == 1 and MIXTURE_VERSION == 1, "bump DATA_ALGORITHM_VERSION too"


@dataclass(frozen=True, kw_only=True, slots=True)
class DataCursor:
    """The position of the next undelivered global batch, and what it assumes."""

    dataset_id: str
    """Dataset the position refers to."""
    position: OrderState
    """Next batch, packer residual, mixture state."""
    epochs: tuple[int, ...]
    """Epoch of each source at this position (records taken // source size)."""
    layout: Mapping[str, Any] = field(default_factory=dict)
    """Seed, global batch, sequence length, packing and mixture configuration."""
    algorithm_version: int = DATA_ALGORITHM_VERSION

    def to_state_dict(self) -> dict[str, Any]:
        """The JSON-serialisable envelope dict a checkpoint stores."""
        state = {"position": self.position.to_dict(), "epochs": list(self.epochs),
                 "layout": dict(self.layout)}
        return CursorEnvelope(kind=CURSOR_KIND, algorithm_version=self.algorithm_version,
                              dataset_id=self.dataset_id, state=state).to_dict()

    @classmethod
    def from_state_dict(cls, raw: Mapping[str, Any], *, dataset_id: str,
                        layout: Mapping[str, Any]) -> DataCursor:
        """Parse an untrusted envelope dict and check it can resume this run.

        Raises:
            DataError: wrong schema or kind, another dataset or algorithm version, another
                layout, or a malformed position; the message shows both sides.
        """
        if not isinstance(raw, Mapping):
            raise DataError(f"data cursor must be a mapping, found {type(raw).__name__}")
        try:
            env = CursorEnvelope.from_dict(raw)
        except KeyError as exc:
            raise DataError(f"data cursor lacks field {exc}; found keys {sorted(raw)}") from exc
        if env.kind != CURSOR_KIND:
            raise DataError(f"data cursor kind is {env.kind!r}, expected {CURSOR_KIND!r}")
        env.check_compatible(dataset_id=dataset_id, algorithm_version=DATA_ALGORITHM_VERSION)
        state = env.state
        found = dict(state.get("layout", {}))
        if found != dict(layout):
            raise DataError(f"data cursor layout differs: checkpoint has {found}, run has "
                            f"{dict(layout)}; resume with the same seed, global batch, sequence "
                            "length, packing and mixture (only the replica count may change)")
        position = OrderState.from_dict(state.get("position", {}))
        return cls(dataset_id=dataset_id, position=position,
                   epochs=tuple(int(e) for e in state.get("epochs", ())), layout=found)
