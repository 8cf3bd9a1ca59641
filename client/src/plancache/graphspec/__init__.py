"""The spec language: tensors, ops and graphs (graph, ops), their
validation and normal form (validation, layouts), the canonical bytes and
hash (canonical, jcs), the wire and JSON forms (spec_io: spec_json,
spec_proto, spec_refs), capture of a cuDNN frontend graph (interop).

Owns: what a graph is, and its hash.
May import: plancache.errors, plancache.dtypes, plancache.v1, plancache.graphspec.
"""

from plancache.graphspec import canonical, interop, spec_io
from plancache.graphspec.graph import CODECS, GraphSpec, Node, Tensor

CODECS.spec_hash = canonical.spec_hash
CODECS.to_json = lambda spec, indent: spec_io.to_json(spec, indent=indent)
CODECS.from_json = spec_io.from_json
CODECS.from_dict = spec_io.from_dict
CODECS.from_pygraph = interop.from_pygraph

__all__ = ["GraphSpec", "Node", "Tensor"]
