"""The names of the engine's comm semantics and comm streams: the one home of these words
(``schedsim.sim.costs.CommModel`` types its fields with them; the CLI's choices and the
checks of a loaded Timeline read them). See DESIGN.md, "Comm semantics"."""
from __future__ import annotations

from typing import Literal, get_args

Semantics = Literal["data", "eager", "rendezvous"]
CommStream = Literal["none", "per-peer", "per-rank"]
SEMANTICS: tuple[str, ...] = get_args(Semantics)
COMM_STREAMS: tuple[str, ...] = get_args(CommStream)
