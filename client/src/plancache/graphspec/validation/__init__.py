"""Validate a GraphSpec and bring it to normal form, before any GPU work.

`normalize(spec)` returns a new spec in which every default is explicit
(data types, strides, attribute defaults, inferred output dims), so two specs
that mean the same graph normalize to the same thing. It refuses, with a
message naming the node or tensor, anything cuDNN would reject for a reason
we can see here: unknown ops, ports or attributes, wrong attribute types,
dangling or duplicate uids, rank and shape mismatches, bad data types, and
sizes over the limits.

The client runs it to fail fast; the server runs it again and trusts nothing.


The checks of the graph as a whole (graph_checks), a node's (nodes), its
attributes' (attributes), a tensor's (tensors), the limits and exact
numbers they share (limits), normalize() putting them in order (normal_form).

Owns: a spec's checks and its normal form.
May import: plancache.errors, plancache.dtypes, plancache.graphspec.
"""

from plancache.graphspec.validation.limits import DEFAULT_LIMITS, MAX_UID, Limits, storage_elements
from plancache.graphspec.validation.normal_form import normalize

__all__ = ["DEFAULT_LIMITS", "MAX_UID", "Limits", "normalize", "storage_elements"]
