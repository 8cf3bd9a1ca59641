"""The two wire forms of a GraphSpec: hand-written JSON and the proto message.

Both refer to tensors by uid; parsing resolves uids into Tensor objects and
refuses dangling or duplicate ones, naming the node or tensor at fault
(spec_refs). Unknown JSON keys are errors too: a typo must not silently
change a graph. The JSON form is in spec_json, the proto form in
spec_proto; this module is the one name both sides import them by.
"""

from plancache.graphspec.spec_json import GRAPH_ARGUMENTS, from_dict, from_json, to_dict, to_json
from plancache.graphspec.spec_proto import attr_to_proto, from_proto, refuse_unknown_fields, to_proto

__all__ = [
    "GRAPH_ARGUMENTS",
    "attr_to_proto",
    "from_dict",
    "from_json",
    "from_proto",
    "refuse_unknown_fields",
    "to_dict",
    "to_json",
    "to_proto",
]
