"""What both sides of the contract read beside the stubs: the rich error
details of a status (rich_status), the labels of a graph's outcome
(outcome_labels), and how a plan's tensors bind to its spec's (bindings).

Owns: wire-level helpers the client and the server share.
May import: plancache.errors, plancache.dtypes, plancache.v1, plancache.graphspec, plancache.keys.
"""
